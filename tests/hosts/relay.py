"""Loopback links that fail the way a real one does, for the deadline tests.

`FreezableRelay(target_port)`: a TCP relay on 127.0.0.1 in front of a port (the test sshd). `freeze()` stops
forwarding in both directions while every connection stays open (a link that went silent: no RST, no FIN,
nothing); connections accepted meanwhile are held the same way. `thaw()` forwards again, what was held first,
in order, as TCP would deliver it once the link came back.

`SilentListener()`: accepts connections on 127.0.0.1 and never sends a byte (no SSH banner).

Both run in daemon threads; use them as context managers.
"""
from __future__ import annotations

import socket
import threading


class FreezableRelay:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> FreezableRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def freeze(self) -> None:
        self._flowing.clear()

    def freeze_in(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self.freeze)
        timer.daemon = True
        timer.start()
        return timer

    def thaw(self) -> None:
        self._flowing.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst; while frozen, hold each chunk (and the end of the stream) until the thaw."""
        while True:
            self._flowing.wait()
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            self._flowing.wait()
            if self._closed.is_set():
                return
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return


class SilentListener:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []

    def __enter__(self) -> SilentListener:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._listener.close()
        for sock in self._held:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(conn)
