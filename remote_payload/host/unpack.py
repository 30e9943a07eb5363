"""The host's UNPACK: bundles sent on stdin, each written to ROOT/KIND/DIGEST. The controller runs this file's
source as `python -c` (with the same launch as every call) before any bundle need be on the host: it imports
only the stdlib.

    argv: ROOT KIND/DIGEST…   (KIND payload: the supervisor's bundle, payloads: a job's)
    stdin: frames, each a JSON line [KIND/DIGEST, NAME, SIZE, SHA256] then SIZE bytes, and [KIND/DIGEST] once
           that bundle's files were all sent

Each file goes to ROOT/KIND/.part-DIGEST/NAME as it comes (through a temp file, checked against its SHA256),
so a cut call keeps every file that came whole and the next upload sends only the others (`kept`). A
bundle's end frame checks that its files hash to DIGEST and renames the folder into place. One upload of a
bundle at a time (a lock in its folder); a bundle already there is skipped. Answers one JSON line.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sys

WANTED = re.compile(r"(payload|payloads)/[0-9a-f]{16}$")
CHUNK = 1 << 20
HEADER_MAX = 1 << 16
LOCK = ".lock"


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def stage_of(root: str, wanted: str) -> str:
    kind, digest = wanted.split("/")
    return os.path.join(root, kind, ".part-" + digest)


def kept(stage: str) -> list:
    """The names of the files a cut upload left in `stage` (whole and checked when they were written)."""
    found = []
    for folder, _, names in os.walk(stage):
        relative = os.path.relpath(folder, stage)
        for name in names:
            if relative == "." and (name == LOCK or name.startswith(".tmp-")):
                continue
            found.append(name if relative == "." else os.path.join(relative, name).replace(os.sep, "/"))
    return sorted(found)


def digest_of(hashes: dict) -> str:
    """{name: sha256 bytes} → the bundle's name (the controller's bundles.digest_of, the same way)."""
    h = hashlib.sha256()
    for name in sorted(hashes):
        encoded = name.encode()
        h.update(b"%d\0" % len(encoded) + encoded + hashes[name])
    return h.hexdigest()[:16]


def safe_name(name) -> bool:
    parts = name.split("/") if isinstance(name, str) else []
    return bool(parts) and "\0" not in name and not parts[0].startswith(".tmp-") and parts[0] != LOCK and \
        all(part not in ("", ".", "..") for part in parts)


class Upload:
    """The bundles of one call: each opened (locked) at its first frame, put in place at its end frame."""

    def __init__(self, root: str, wanted: list) -> None:
        self.root, self.wanted = root, wanted
        self.open: dict = {}  # KIND/DIGEST → [stage, lock fd, {name: sha256 bytes}] while it is received
        self.skipped: set = set()

    def begin(self, where: str) -> None:
        final = os.path.join(self.root, where)
        if os.path.isdir(final):
            self.skipped.add(where)
            return
        stage = stage_of(self.root, where)
        os.makedirs(os.path.dirname(stage), mode=0o700, exist_ok=True)
        os.makedirs(stage, mode=0o700, exist_ok=True)
        lock = os.open(os.path.join(stage, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)  # another upload of it: wait for its end (put in place, or cut)
        if os.path.isdir(final):
            os.close(lock)
            self.skipped.add(where)
            return
        for name in os.listdir(stage):  # the file a cut upload was writing
            if name.startswith(".tmp-"):
                os.unlink(os.path.join(stage, name))
        self.open[where] = [stage, lock, {}]

    def receive(self, where: str, name: str, size: int, sha: str, stream) -> None:
        if where not in self.open:
            return drain(stream, size)
        stage, _, hashes = self.open[where]
        path = os.path.join(stage, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(stage, ".tmp-%d" % os.getpid())
        h = hashlib.sha256()
        try:
            with open(tmp, "wb") as fh:
                left = size
                while left:
                    chunk = stream.read(min(CHUNK, left))
                    if not chunk:
                        raise Refused("upload-cut", "the upload ended inside %s/%s" % (where, name))
                    h.update(chunk)
                    fh.write(chunk)
                    left -= len(chunk)
            if h.hexdigest() != sha:
                raise Refused("bad-bundle", "hash mismatch: %s/%s changed while it was sent" % (where, name))
        except BaseException:  # a full disk, a cut, a bad hash: only whole files stay in the stage
            os.unlink(tmp)
            raise
        os.rename(tmp, path)
        hashes[name] = h.digest()

    def finish(self, where: str) -> None:
        if where not in self.open:
            return
        stage, lock, hashes = self.open.pop(where)
        for name in kept(stage):
            if name not in hashes:
                hashes[name] = file_sha(os.path.join(stage, name))
        if digest_of(hashes) != where.split("/")[1]:
            shutil.rmtree(stage)  # a mix that is no bundle: the next upload starts afresh
            raise Refused("bad-bundle", "hash mismatch: " + where)
        os.unlink(os.path.join(stage, LOCK))
        os.rename(stage, os.path.join(self.root, where))
        os.close(lock)


def file_sha(path: str) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.digest()


def drain(stream, size: int) -> None:
    while size:
        chunk = stream.read(min(CHUNK, size))
        if not chunk:
            return
        size -= len(chunk)


def frames(stream, wanted: list):
    """(where, name, size, sha) per file frame, (where, None, 0, None) per end frame; refused when malformed."""
    while True:
        line = stream.readline(HEADER_MAX)
        if not line:
            return
        try:
            frame = json.loads(line)
        except ValueError:
            raise Refused("bad-bundle", "a frame header is not JSON") from None
        where = frame[0] if isinstance(frame, list) and frame else None
        if where not in wanted:
            raise Refused("bad-bundle", "unsafe member: a frame of a bundle not named")
        if len(frame) == 1:
            yield where, None, 0, None
            continue
        if len(frame) != 4 or not safe_name(frame[1]) or not isinstance(frame[2], int) or frame[2] < 0:
            raise Refused("bad-bundle", "unsafe member")
        yield where, frame[1], frame[2], frame[3]


def unpack(root: str, wanted: list, stream) -> None:
    if not wanted or any(not WANTED.match(w) for w in wanted):
        raise Refused("bad-bundle", "name each bundle as payload/HASH or payloads/HASH")
    if all(os.path.isdir(os.path.join(root, w)) for w in wanted):
        return
    upload = Upload(root, wanted)
    for where, name, size, sha in frames(stream, wanted):
        if where not in upload.open and where not in upload.skipped:
            upload.begin(where)
        if name is None:
            upload.finish(where)
        else:
            upload.receive(where, name, size, sha, stream)
    missing = [w for w in wanted if not os.path.isdir(os.path.join(root, w))]
    if missing:
        raise Refused("upload-cut", "the upload ended before " + ", ".join(missing) + " was whole")


def main(argv: list) -> int:
    os.umask(os.umask(0o022) | 0o022)  # nothing under ROOT writable by others, whatever the login's umask
    root = os.path.expanduser(argv[0]) if argv else ""
    try:
        unpack(root, argv[1:], sys.stdin.buffer)
    except Refused as exc:
        answer, code = {"ok": False, "error": exc.code, "message": str(exc)}, 1
    except OSError as exc:  # a full or read-only disk: said in one line
        answer, code = {"ok": False, "error": "upload-failed", "message": "cannot write the bundle under %s: %s"
                        % (root, exc.strerror or exc)}, 1
    else:
        answer, code = {"ok": True}, 0
    sys.stdout.write(json.dumps(answer) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
