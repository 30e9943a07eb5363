"""A bounded HTTP client for a serving engine's routes and a unit's health URL (stdlib only).

The engine's answers are input from another process: any way a call can fail to answer well (refused, reset,
cut short, trickled, oversized, redirected, malformed) is an EngineError within the caller's deadline
(time.monotonic()), never a crash, a hang or a huge read; the caller restarts the unit.
"""
from __future__ import annotations

import io
import json
import time

from .answer import Fail

MAX_BODY_BYTES = 1 << 20  # the routes answer a few KB
READ_CHUNK = 1 << 16
POLL_S = 0.2


class EngineError(Fail):
    """The engine's API did not do what was asked (or did not answer): the message says which call."""

    def __init__(self, message: str) -> None:
        super().__init__("internal", message)


class NotSent(EngineError):
    """The request never reached the engine whole (refused, or cut while it was sent): it did nothing there, so
    asking again is safe."""


def call(method: str, url: str, deadline: float, body=None, headers=None):
    """(status, answer) of one request: a 2xx answer's parsed JSON (None when empty; anything else is an
    EngineError), another status's body as JSON or text (for messages)."""
    status, raw = exchange(method, url, deadline, body, headers)
    if 200 <= status < 300:
        return status, parse_body(raw, "%s %s" % (method, url))
    try:
        return status, parse_body(raw, url)
    except EngineError:
        return status, raw.decode("utf-8", "replace").strip()[-300:]


def exchange(method: str, url: str, deadline: float, body=None, headers=None) -> tuple:
    """(status, raw body) of one request. No redirect is followed (a release answered by whatever the Location
    names is no release) and no proxy used; the whole call ends by the deadline, however slowly the engine
    writes; a body over MAX_BODY_BYTES is refused. headers (an Authorization header) never go in a message."""
    import http.client  # here, not at the top: most of the supervisor's runs never call an engine
    from urllib.parse import urlsplit

    what = "%s %s" % (method, url)
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineError("%s: not an http(s) URL" % what)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=time_left(deadline, what))
        raw_socket = None
        try:
            try:
                connection.connect()
            except OSError as exc:
                raise NotSent("%s: cannot connect: %s: %s" % (what, type(exc).__name__, str(exc)[:200])) from exc
            raw_socket = connection.sock
            connection.sock = DeadlineSocket(raw_socket, deadline, what)
            data = None if body is None else json.dumps(body).encode("utf-8")
            sent = dict(headers or {}, Connection="close")
            if data is not None:
                sent["Content-Type"] = "application/json"
            try:
                connection.request(method, (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                                   body=data, headers=sent)
            except OSError as exc:  # nothing was answered; the engine never read a whole request
                raise NotSent("%s was not sent: %s: %s" % (what, type(exc).__name__, str(exc)[:200])) from exc
            answer = connection.getresponse()
            if 300 <= answer.status < 400:
                raise EngineError("%s answered %d (a redirect to %r): not followed" % (
                    what, answer.status, (answer.getheader("Location") or "")[:200]))
            return answer.status, read_capped(answer, what)
        finally:
            connection.close()
            if raw_socket is not None:
                raw_socket.close()
    except EngineError:
        raise
    except Exception as exc:  # the boundary: http.client's errors, OSError, a bad port, a decoder's
        raise EngineError("%s did not answer well: %s: %s" % (what, type(exc).__name__, str(exc)[:200])) from exc


def time_left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise EngineError("%s: no time left before the deadline" % what)
    return left


class DeadlineSocket:
    """The connection's socket with every read and write bounded by what is left of the whole call (a
    socket timeout alone bounds one read: a body trickled a byte at a time would never end)."""

    def __init__(self, sock, deadline: float, what: str) -> None:
        self.sock, self.deadline, self.what = sock, deadline, what

    def sendall(self, data) -> None:
        self.sock.settimeout(time_left(self.deadline, self.what))
        self.sock.sendall(data)

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        self.sock.settimeout(time_left(self.deadline, self.what))
        return self.sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str):
        return io.BufferedReader(SocketReader(self))

    def close(self) -> None:
        """Nothing: http.client closes its connection once it has the headers of a `Connection: close`
        answer, while the body may still be on the wire (a real socket's makefile keeps its descriptor open
        until the reader is done; this wrapper's reader cannot). `exchange` closes the socket itself."""


class SocketReader(io.RawIOBase):
    """A raw binary stream over a DeadlineSocket: what http.client reads the status, headers and body from."""

    def __init__(self, sock: DeadlineSocket) -> None:
        super().__init__()
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.sock.recv_into(buffer)


def read_capped(answer, what: str) -> bytes:
    """The whole body (by its Content-Length, chunks or the close), at most MAX_BODY_BYTES."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = answer.read(READ_CHUNK)
        if not chunk and answer.length:  # http.client returns what came before the close; it was cut short
            raise EngineError("%s: the answer was cut short (%d bytes of it missing)" % (what, answer.length))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise EngineError("%s: the answer is over %d bytes (the routes answer a few KB)" % (what, MAX_BODY_BYTES))
        chunks.append(chunk)


def parse_body(raw: bytes, what: str):
    """The answer's JSON, None when empty; what is not JSON (or nests too deep to read) is an EngineError."""
    text = raw.decode("utf-8", "replace")
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EngineError("%s answered what is not JSON (%s): %r" % (what, type(exc).__name__, text[:80])) from exc


def wait_for(check, deadline: float, what: str):
    """Poll check() (True when done; it may raise EngineError) until the deadline."""
    while True:
        if check():
            return
        if time.monotonic() + POLL_S >= deadline:
            raise EngineError("%s: not within the deadline" % what)
        time.sleep(POLL_S)
