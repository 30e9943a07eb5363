"""The bundles a host runs from: the supervisor's (every .py file of remote_payload/ but payloads/) and a job's
payload (its script, the script's local import closure and payload.files), each uploaded to a dir named by
its content's digest (ROOT/payload/<digest>/, ROOT/payloads/<digest>/), and the stream that uploads them
(remote_payload/host/unpack.py reads it).

A file is read and hashed once while it is unchanged: the state dir's file index records each file's sha256
(and a Python file's imports) against its size, mtime, ctime and inode, and each bundle's digest against its
files' stamps, so a submit of unchanged files reads none of them; an upload reads them as it sends them, and
the host checks each against its sha256.
"""
from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LocalStateError, SpecError
from .import_closure import ImportRef, imports_in, local_closure

PAYLOAD_PACKAGES = "payloads"  # remote_payload/payloads/: each payload is bundled apart, per job
INDEX_FILE = "bundle-files.json"  # in the state dir: {"files": {path: entry}, "bundles": {key: record}}
INDEX_KEPT = 4096  # files (and as many bundles) remembered; the oldest recorded go first
READ_BYTES = 1 << 20
MAX_FILES_BYTES = 1 << 30  # what payload.files may add to a job's bundle


@dataclass(frozen=True)
class BundleFile:
    source: str | bytes  # its path here, or its bytes (a bundle made in memory)
    size: int
    sha256: str  # hex

    def chunks(self, name: str) -> Iterator[bytes]:
        """Its `size` bytes as read now, in pieces; a file whose size changed since it was hashed is
        LocalStateError (one that changed otherwise is refused by the host, which checks the sha256)."""
        if isinstance(self.source, bytes):
            yield self.source
            return
        left = self.size
        with open(self.source, "rb") as fh:
            while left:
                chunk = fh.read(min(READ_BYTES, left))
                if not chunk:
                    raise _changed(name)
                left -= len(chunk)
                yield chunk
            if fh.read(1):
                raise _changed(name)


def _changed(name: str) -> LocalStateError:
    return LocalStateError(f"{name} changed while this command ran (after its digest was taken)",
                           hint="Run the command again: it uploads the files as they are now.")


class Bundle:
    """Files uploaded to one content-addressed dir on the host. `Bundle(contents)` holds them in memory;
    `Bundle.on_disk` names files here, read only when uploaded."""

    def __init__(self, contents: dict[str, bytes]) -> None:
        self.entries = {name: BundleFile(data, len(data), _sha256(data)) for name, data in contents.items()}
        self._digest: str | None = None
        self.fresh = False  # its digest was first computed by this command (files new or changed here)

    @classmethod
    def on_disk(cls, entries: dict[str, BundleFile], digest: str | None = None) -> Bundle:
        bundle = cls({})
        bundle.entries, bundle._digest = entries, digest
        return bundle

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = digest_of({name: entry.sha256 for name, entry in self.entries.items()})
        return self._digest

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    @property
    def files(self) -> dict[str, bytes]:
        """Every file's bytes as they are now, checked against its sha256 (LocalStateError if one changed)."""
        read = {name: b"".join(entry.chunks(name)) for name, entry in self.entries.items()}
        for name, data in read.items():
            if _sha256(data) != self.entries[name].sha256:
                raise _changed(name)
        return read

    def __repr__(self) -> str:
        return f"Bundle({self.digest}, {len(self.entries)} files, {self.size} bytes)"


def _sha256(data: bytes) -> str:
    import hashlib  # OpenSSL's start: only where a file is hashed, not when its digest was recorded

    return hashlib.sha256(data).hexdigest()


def digest_of(hashes: dict[str, str]) -> str:
    """What names a bundle on the host (unpack.py checks it the same way): each name length-prefixed, then its
    file's sha256, so no two sets of files hash alike."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(hashes):
        encoded = name.encode()
        h.update(b"%d\0" % len(encoded) + encoded + bytes.fromhex(hashes[name]))
    return h.hexdigest()[:16]


class Upload:
    """The stdin of one upload (unpack.py's frames): each bundle's files but those the host kept from a cut
    upload, then its end frame. `sent` counts the bytes handed on so far."""

    def __init__(self, bundles: Sequence[tuple[str, Bundle]], kept: Collection[str] = ()) -> None:
        self.bundles, self.kept = bundles, frozenset(kept)
        self.sent = 0
        self.total = sum(entry.size for kind, bundle in bundles for name, entry in bundle.entries.items()
                         if not (kind == PAYLOAD_PACKAGES and name in self.kept))

    def __iter__(self) -> Iterator[bytes]:
        for kind, bundle in self.bundles:
            where = f"{kind}/{bundle.digest}"
            for name, entry in sorted(bundle.entries.items()):
                if kind == PAYLOAD_PACKAGES and name in self.kept:
                    continue
                yield json.dumps([where, name, entry.size, entry.sha256]).encode() + b"\n"
                for chunk in entry.chunks(name):
                    self.sent += len(chunk)
                    yield chunk
            yield json.dumps([where]).encode() + b"\n"


class FileIndex:
    """The state dir's record of files read before (INDEX_FILE, a cache: a miss reads as none): each file's
    sha256, a Python file's imports, and each bundle's digest, against the stamps of its files."""

    def __init__(self) -> None:
        from ..state.store import default_state_dir, read_cache

        self._path = default_state_dir() / INDEX_FILE
        recorded = read_cache(self._path) or {}
        self._files: dict = _a_dict(recorded.get("files"))
        self._bundles: dict = _a_dict(recorded.get("bundles"))
        self._changed = False

    def entry(self, path: Path, st: os.stat_result, *, scan: bool) -> dict:
        """{"stamp", "sha256"[, "imports"]} of the file as it is: recorded, else read (and scanned) now."""
        stamp = _stamp(st)
        got = self._files.get(str(path))
        if not (isinstance(got, dict) and got.get("stamp") == stamp and isinstance(got.get("sha256"), str)
                and (not scan or _refs(got.get("imports")))):
            data = path.read_bytes()
            got = {"stamp": stamp, "sha256": _sha256(data),
                   **({"imports": imports_in(data)} if scan else {})}
            self._files[str(path)] = got
            self._changed = True
        return got

    def imports(self, path: Path) -> list[ImportRef]:
        return self.entry(path, path.stat(), scan=True)["imports"]

    def bundle(self, key: str, paths: dict[str, Path]) -> Bundle:
        """The bundle of these files ({name: path}), its digest recorded under `key` while their stamps hold."""
        entries, seen = {}, []
        for name, path in sorted(paths.items()):
            st = path.stat()
            got = self.entry(path, st, scan=False)
            entries[name] = BundleFile(str(path), st.st_size, got["sha256"])
            seen.append([name, *_stamp(st)])
        recorded = self._bundles.get(key)
        if isinstance(recorded, dict) and recorded.get("files") == seen and isinstance(recorded.get("digest"), str):
            return Bundle.on_disk(entries, recorded["digest"])
        bundle = Bundle.on_disk(entries)
        bundle.fresh = True
        self._bundles.pop(key, None)
        self._bundles[key] = {"files": seen, "digest": bundle.digest}
        self._changed = True
        return bundle

    def save(self) -> None:
        """Written only when something was read: a submit of unchanged files writes nothing."""
        if not self._changed:
            return
        from ..state.store import write_cache

        files = dict(list(self._files.items())[-INDEX_KEPT:])
        bundles = dict(list(self._bundles.items())[-INDEX_KEPT:])
        write_cache(self._path, json.dumps({"files": files, "bundles": bundles}))
        self._changed = False


def _a_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _refs(value: Any) -> bool:
    """A recorded list of import statements, as imports_in makes them (anything else is read again)."""
    return isinstance(value, list) and all(
        isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and isinstance(r[1], list)
        and isinstance(r[2], list) and all(isinstance(p, str) for p in r[1] + r[2]) for r in value)


def payload_dir() -> Path:
    import remote_payload

    return Path(remote_payload.__file__).parent


_SUPERVISOR: list = []  # [the files' stamps, their Bundle]: a fleet's host calls each ask for it


def supervisor_bundle() -> Bundle:
    """Every .py file under remote_payload/ (its sub-packages too) except the payload packages: a benchmark's
    edit never changes this digest. Its files are stat'ed, not read, while none changed."""
    root = payload_dir()
    found = _supervisor_files(root)
    seen = [[name, *_stamp(st)] for name, _, st in found]
    cached = _SUPERVISOR[:]  # one read of the list: another thread may replace it meanwhile
    if cached and cached[0] == seen:
        return cached[1]
    index = FileIndex()
    bundle = index.bundle(str(root), {name: Path(path) for name, path, _ in found})
    index.save()
    _SUPERVISOR[:] = [seen, bundle]
    return bundle


def _supervisor_files(root: Path) -> list[tuple[str, str, os.stat_result]]:
    """(name in the bundle, path, stat) of each .py file of the supervisor's, sorted by name."""
    found = []
    for folder, dirs, names in os.walk(root):
        relative = os.path.relpath(folder, root)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        dirs[:] = [d for d in dirs if d != "__pycache__" and not (prefix == "" and d == PAYLOAD_PACKAGES)]
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found.append((prefix + name, path, os.stat(path)))
    return sorted(found, key=lambda entry: entry[0])


def packaged_payload(script: str) -> Path | None:
    """The folder of remote_payload/payloads/ that holds a bare `payload.script` name, or None."""
    if "/" in script:
        return None
    packages = sorted(p for p in (payload_dir() / PAYLOAD_PACKAGES).iterdir() if p.is_dir())
    return next((p for p in packages if (p / script).is_file()), None)


def payload_bundle(script: Path, files: dict[str, Path] | None = None) -> Bundle:
    """The script, its local import closure (import_closure.py) and `files` (payload_files), named from the
    script's directory."""
    index = FileIndex()
    closure: dict[str, Path] = local_closure(script, index.imports)
    bundle = index.bundle(str(script.resolve()), {**(files or {}), **closure})
    index.save()
    return bundle


def payload_files(globs: Sequence[str], spec_dir: Path, script: Path, where: str = "payload.files") -> dict[str, Path]:
    """{name beside the script: path} of the files the globs (relative to the job file's folder) match: each
    must lie in the script's folder or below it (it lands on the host as it lies here), and all of them
    within MAX_FILES_BYTES. SpecError (exit 2) names payload.files and the glob."""
    import glob

    base, spec_dir = script.resolve().parent, spec_dir.resolve()
    found: dict[str, Path] = {}
    for pattern in globs:
        matched = [Path(p) for p in sorted(glob.glob(str(spec_dir / pattern), recursive=True)) if os.path.isfile(p)]
        if not matched:
            raise SpecError(f"{where}: {pattern!r} matches no file in {spec_dir}",
                            hint="A glob names files, relative to the job file (`data/*.json`, `weights/**`).")
        for path in matched:
            try:
                path.resolve().relative_to(base)  # a link out of the folder would upload its target
                name = Path(os.path.normpath(path)).relative_to(base).as_posix()
            except ValueError:
                raise SpecError(f"{where}: {pattern!r} matches {path}, outside the script's folder {base}",
                                hint="The files land beside the script as they lie beside it here: keep them in "
                                     "its folder (or below it).") from None
            found[name] = path
    size = sum(path.stat().st_size for path in found.values())
    if size > MAX_FILES_BYTES:
        raise SpecError(f"{where}: {len(found)} files of {size / (1 << 20):.1f} MiB, over the {MAX_FILES_BYTES >> 20} "
                        "MiB a job may carry", hint="Narrow the globs; put large data on the host once and pass its "
                        "path in payload.args.")
    return found

