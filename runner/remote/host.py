"""The controller's side of the host protocol (docs/protocol.md): one method per supervisor subcommand.

Every call is `python3 -c BOOT ROOT HASH SUBCOMMAND ARGS…`: BOOT runs the uploaded supervisor (imported, in
the same interpreter: no second start-up on the host), or answers
"payload-missing" (exit 42: the supervisor's bundle, or the job's payload bundle, is not there), in which case
both bundles are uploaded in one call and the call repeated. On the wire
it travels as `launch_argv`: one fixed single-line program plus one base64 word, which every login shell
(sh, bash, zsh, csh/tcsh, fish) hands to python unchanged. Every call is bounded by the command's one
Deadline, shared by its boot, upload and repeat; no call has an allowance of its own.

`HostClient` is a context manager: `with connect(host) as client:` closes the transport on every path.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shlex
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from remote_payload.admission import BUSY_HINT
from remote_payload.contract import EXIT_PAYLOAD_MISSING

from .. import verbose
from ..deadline import Deadline
from ..errors import HostBusy, LocalStateError, PreflightError, RemoteError, SchedulerUnavailable, UnknownJob
from . import answers
from .transport import Completed, Stream, Streaming, Transport

if TYPE_CHECKING:
    from .job_answers import JobStatus, Result, Started

# BOOT and UNPACK first add go-w to the login's umask: nothing they or the supervisor write under ROOT is
# writable by others, whatever the umask (BOOT refuses a bundle file that is).
BOOT = r"""
import os, sys
os.umask(os.umask(0o022) | 0o022)
root, digest = os.path.expanduser(sys.argv[1]), sys.argv[2]
here = os.path.join(root, "payload", digest)
sup = os.path.join(here, "supervisor.py")
for p in (root, here, sup):  # others able to write here could run code as us: refuse
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        break
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022 or os.path.islink(p):
        import json
        sys.stdout.write(json.dumps({"ok": False, "error": "unsafe-root", "message": p + " is writable by others, "
                         "a link, or owned by neither the login user nor root: chmod go-w it or choose another host.root"}) + "\n")
        sys.exit(1)
if not os.path.isfile(sup):
    sys.stdout.write('{"ok": false, "error": "payload-missing"}\n')
    sys.exit(%d)
sys.path[0] = here  # in place of the login dir: the supervisor and its rooms, bytecode cached beside them
import supervisor
sys.exit(supervisor.main(sys.argv[3:] + ["--root", root]))
""" % EXIT_PAYLOAD_MISSING

# Unpacks a tar.gz of bundles from stdin: argv names each as KIND/HASH (KIND payload: the supervisor's, payloads:
# a job's payload), its members are KIND/HASH/NAME. Each bundle not yet on the host goes to ROOT/KIND/HASH,
# atomically (temp dir + rename); members that are not plain files inside a named bundle, or a bundle whose
# content does not hash to its HASH, are refused. When every bundle is there already, stdin is not read.
UNPACK = r"""
import hashlib, io, json, os, re, shutil, sys, tarfile, tempfile
os.umask(os.umask(0o022) | 0o022)
root, wanted = os.path.expanduser(sys.argv[1]), sys.argv[2:]
tmp = None
def say(answer, code):
    sys.stdout.write(json.dumps(answer) + "\n"); sys.exit(code)
def refuse(exc, base):  # a full or read-only disk: say so in one line, and leave no half-written copy behind
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    say({"ok": False, "error": "upload-failed", "message": "cannot write the payload bundle under %s: %s"
         % (base, exc.strerror or exc)}, 1)
if not wanted or any(not re.match(r"(payload|payloads)/[0-9a-f]{16}$", w) for w in wanted):
    say({"ok": False, "error": "bad-bundle", "message": "name each bundle as payload/HASH or payloads/HASH"}, 1)
missing = [w for w in wanted if not os.path.isdir(os.path.join(root, w))]
if missing:
    tar = tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode="r:gz")
    files = dict((w, {}) for w in wanted)
    for m in tar.getmembers():
        parts = m.name.split("/")
        where = "/".join(parts[:2])
        if not m.isfile() or m.name.startswith("/") or ".." in parts or len(parts) < 3 or where not in files:
            say({"ok": False, "error": "bad-bundle", "message": "unsafe member"}, 1)
        files[where]["/".join(parts[2:])] = tar.extractfile(m).read()
    for w in wanted:
        h = hashlib.sha256()
        for name in sorted(files[w]):
            h.update(b"%d %d\0" % (len(name.encode()), len(files[w][name])) + name.encode() + files[w][name])
        if h.hexdigest()[:16] != w.split("/")[1]:
            say({"ok": False, "error": "bad-bundle", "message": "hash mismatch: " + w}, 1)
    for w in missing:
        base, digest = os.path.join(root, w.split("/")[0]), w.split("/")[1]
        try:
            os.makedirs(base, mode=0o700, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=".tmp-" + digest + "-", dir=base)
            for name, data in files[w].items():
                path = os.path.join(tmp, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(data)
        except OSError as exc:
            refuse(exc, base)
        try:
            os.rename(tmp, os.path.join(base, digest))
        except OSError:
            shutil.rmtree(tmp)  # a concurrent upload won the race; its content is identical
        tmp = None
say({"ok": True}, 0)
"""


# The program every remote command runs: it decodes its one argument, base64 of [program, *argv] joined by
# NUL (no argv string can hold one), and runs program with that argv. Only characters that no login shell
# treats specially inside single quotes (no newline, `!`, backslash, `$` or quote), so sh, csh/tcsh and fish
# all pass it through unchanged; base64 itself is [A-Za-z0-9+/=], a plain word in every shell. binascii is
# built in: decoding imports nothing.
LAUNCH = "import binascii,sys;a=binascii.a2b_base64(sys.argv[1]).decode().split(chr(0));sys.argv=a[1:];exec(a[0])"


def launch_argv(python: str, program: str, args: Sequence[str]) -> list[str]:
    """argv that runs `python -S -c program ARGS…` through any login shell (quoted once by the transport).
    -S: no site-packages on the host side (stdlib only), and none of their .pth files run at each call."""
    words = [program, "-c", *args]
    if any("\0" in word for word in words):
        raise ValueError("an argument holds a NUL character, which no argv can carry")
    return [python, "-S", "-c", LAUNCH, base64.b64encode("\0".join(words).encode("utf-8")).decode("ascii")]


class Bundle:
    """Files uploaded to one content-addressed dir on the host: the supervisor's (ROOT/payload/<digest>/) or a
    job's payload (ROOT/payloads/<digest>/). `Bundle.recorded` is one whose digest is known already: its files
    are read only if it is uploaded."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self._files: dict[str, bytes] | None = files
        self._read: Callable[[], dict[str, bytes]] | None = None
        self._digest: str | None = None

    @classmethod
    def recorded(cls, digest: str, read: Callable[[], dict[str, bytes]]) -> Bundle:
        """The bundle `read()` returns, its digest recorded when the files were last read: when it is read (an
        upload), files that no longer hash to `digest` are LocalStateError, never sent under that name."""
        bundle = cls({})
        bundle._files, bundle._read, bundle._digest = None, read, digest
        return bundle

    @property
    def files(self) -> dict[str, bytes]:
        if self._files is None:
            assert self._read is not None
            files = self._read()
            if digest_of(files) != self._digest:
                raise LocalStateError("the host-side code (remote_payload/) changed while this command ran",
                                      hint="Run the command again: it uploads the code as it is now.")
            self._files = files
        return self._files

    @property
    def digest(self) -> str:
        """Computed once per Bundle (every call's argv names it; a fleet makes hundreds of calls)."""
        if self._digest is None:
            self._digest = digest_of(self.files)
        return self._digest

    def __repr__(self) -> str:
        return f"Bundle({self.digest}, {len(self.files) if self._files is not None else '?'} files)"


def digest_of(files: dict[str, bytes]) -> str:
    """What names a bundle on the host (UNPACK checks it the same way): each entry length-prefixed, so no two
    sets of files hash alike."""
    import hashlib  # OpenSSL's start: only where a bundle is read, not when its digest was recorded

    h = hashlib.sha256()
    for name in sorted(files):
        h.update(b"%d %d\0" % (len(name.encode()), len(files[name])) + name.encode() + files[name])
    return h.hexdigest()[:16]


_TARBALL_LOCK = threading.Lock()
_TARBALL: dict[tuple, bytes] = {}  # the last one made: a fleet's hosts all upload the same bundles


def tarball(bundles: Sequence[tuple[str, Bundle]]) -> bytes:
    """One tar.gz of the bundles, each under its host dir (`payload/<digest>/…`, `payloads/<digest>/…`); made
    once for the hosts of a fleet that lack the same bundles (under a lock: the others wait for it, rather than
    compressing the same bytes side by side)."""
    key = tuple((kind, bundle.digest) for kind, bundle in bundles)
    with _TARBALL_LOCK:
        if key not in _TARBALL:
            _TARBALL.clear()
            _TARBALL[key] = _make_tarball(bundles)
        return _TARBALL[key]


def _make_tarball(bundles: Sequence[tuple[str, Bundle]]) -> bytes:
    import tarfile  # only an upload needs it

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for kind, bundle in bundles:
            for name in sorted(bundle.files):
                info = tarfile.TarInfo(f"{kind}/{bundle.digest}/{name}")
                info.size = len(bundle.files[name])
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(bundle.files[name]))
    return buf.getvalue()


def payload_dir() -> Path:
    import remote_payload

    return Path(remote_payload.__file__).parent


MAX_FRAME_HEADER = 64 << 10  # a `logs --stream` frame's header line: a few hundred bytes
STATUS_BATCH = 1000  # job ids per `status` call: its answer (about 1 KB a job) stays far below answers' bound

PAYLOAD_PACKAGES = "payloads"  # remote_payload/payloads/: each payload is bundled apart, per job


_SUPERVISOR: list = []  # [the files' stamps, their Bundle]: read again only when one changed
DIGESTS_FILE = "supervisor-digests.json"  # in the state dir: {payload dir: {"files": stamps, "digest": …}}
DIGESTS_KEPT = 8  # checkouts or installs whose digest is remembered side by side


def supervisor_bundle() -> Bundle:
    """Every .py file under remote_payload/ (its sub-packages too) except the payload packages: a benchmark's
    edit never changes this digest. Read once while the files stay as they were (each host call of a fleet
    asks for it); a command's first call takes the digest recorded in the state dir against the files' sizes,
    times and inodes when none changed since, and reads the files only if the host lacks them (an upload)."""
    root = payload_dir()
    files = _supervisor_files(root)
    seen = [[name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] for name, _, st in files]
    cached = _SUPERVISOR[:]  # one read of the list: another thread may replace it meanwhile
    if cached and cached[0] == seen:
        return cached[1]

    def read() -> dict[str, bytes]:
        with_bytes = {}
        for name, path, _ in files:
            with open(path, "rb") as fh:
                with_bytes[name] = fh.read()
        return with_bytes

    recorded = _recorded_digests().get(str(root), {})
    if recorded.get("files") == seen and isinstance(recorded.get("digest"), str):
        bundle = Bundle.recorded(recorded["digest"], read)
    else:
        bundle = Bundle(read())
        _record_digest(str(root), seen, bundle.digest)
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


def _digests_path() -> Path:
    from ..state.store import default_state_dir

    return default_state_dir() / DIGESTS_FILE


def _recorded_digests() -> dict:
    """The digests recorded in the state dir (a cache: a miss reads as none)."""
    from ..state.store import read_cache

    return read_cache(_digests_path()) or {}


def _record_digest(root: str, seen: list, digest: str) -> None:
    from ..state.store import write_cache

    recorded = {k: v for k, v in _recorded_digests().items() if k != root}
    kept = dict(list(recorded.items())[-(DIGESTS_KEPT - 1):])
    kept[root] = {"files": seen, "digest": digest}
    write_cache(_digests_path(), json.dumps(kept))


def packaged_payload(script: str) -> Path | None:
    """The folder of remote_payload/payloads/ that holds a bare `payload.script` name, or None."""
    if "/" in script:
        return None
    packages = sorted(p for p in (payload_dir() / PAYLOAD_PACKAGES).iterdir() if p.is_dir())
    return next((p for p in packages if (p / script).is_file()), None)


def payload_bundle(script: Path) -> Bundle:
    """The script and its local import closure (runner/remote/import_closure.py), named from the script's directory."""
    from .import_closure import local_closure

    return Bundle(local_closure(script))


class HostClient:
    """Typed calls to the supervisor on one host. Raises RemoteError (or a subclass) for `ok: false`. Each answer
    is checked (answers.py) and, where the layers above read it field by field, typed there: `submit` answers
    Started, `status` JobStatus, `logs` and `log_stream` LogChunk, `result` Result; the rest plain dicts.

    `deadline` is the calling command's: no call runs past it.
    """

    def __init__(self, transport: Transport, *, root: str, python: str, bundle: Bundle, deadline: Deadline,
                 payload: Bundle | None = None) -> None:
        self.transport = transport
        self.root = root
        self.python = python
        self.bundle = bundle  # the supervisor's
        self.payload = payload  # the job's script and its imports, when it has one
        self.deadline = deadline
        self.round_trips = 0

    def __enter__(self) -> HostClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def preflight(self, wire: dict) -> dict:
        return answers.preflight(self.call("preflight", [], stdin=_json_bytes(wire)))

    def start(self, wire: dict, *, queue: bool = False) -> dict:
        args = ["--job-id", wire["job_id"]] + (["--queue"] if queue else [])
        return answers.start(self.call("start", args, stdin=_json_bytes(wire)), wire["job_id"])

    def submit(self, wire: dict, *, queue: bool = False) -> Started:
        """Wire `submit`: the host's own verdict on its preflight report, in one round trip: start's answer
        (plus `report`, `started`: true, `stop_service`, `notes`), or the refusal raised (busy, exit 4)."""
        args = ["--job-id", wire["job_id"]] + (["--queue"] if queue else [])
        return answers.submit(self.call("submit", args, stdin=_json_bytes(wire)), wire["job_id"])

    def status(self, job_ids: Sequence[str] = (), *, wait: float = 0.0) -> list[JobStatus]:
        """The jobs named (every job on the host when none is): their ids go on stdin, never in argv (whose
        strings the kernel bounds), STATUS_BATCH to a call, so that no answer grows past its bound either.
        wait: seconds the host may hold the answer until one of the named jobs changes state or ends (the
        caller's deadline must allow it and a round trip)."""
        if not job_ids:
            return answers.status(self.call("status", []), job_ids)
        found = []
        waiting = ["--wait", f"{wait:.2f}"] if wait > 0 else []
        for start in range(0, len(job_ids), STATUS_BATCH):
            batch = list(job_ids[start:start + STATUS_BATCH])
            found += answers.status(self.call("status", ["--ids-on-stdin", *waiting], stdin=_json_bytes(batch)),
                                    batch)
        return found

    def logs(self, job_id: str, offset: int, *, max_bytes: int, wait: float) -> answers.LogChunk:
        args = ["--job-id", job_id, "--offset", str(offset), "--max", str(max_bytes), "--wait", f"{wait:.2f}"]
        return answers.logs(self.call("logs", args), offset, max_bytes)

    def log_stream(self, job_id: str, offset: int, *, frame_bytes: int, wait: float,
                   follow: bool) -> LogFrames | None:
        """Wire `logs --stream`, on a transport that streams (else None): one call that sends the log from
        `offset` as it grows, for up to `wait` seconds (with `follow`, until the job ended and every byte went;
        else until caught up), in frames of at most `frame_bytes`. Iterated, it yields each frame checked, as
        a LogChunk; the last one (no bytes) carries the state as it was when the call ended. A call that ends
        without its last frame raises."""
        if not isinstance(self.transport, Streaming):
            return None
        args = ["--job-id", job_id, "--offset", str(offset), "--max", str(frame_bytes), "--wait", f"{wait:.2f}",
                "--stream"] + (["--follow"] if follow else [])
        return LogFrames(self, args, offset, frame_bytes)

    def _open_stream(self, sub: str, args: list[str]) -> Stream:
        assert isinstance(self.transport, Streaming)  # log_stream streams only on such a transport
        self.round_trips += 1
        verbose.say(f"{self.transport.name}: supervisor {shlex.join([sub, *args])} (streamed)")
        return self.transport.stream(self.boot_argv(sub, args), deadline=self.deadline)

    def cancel(self, job_id: str) -> dict:
        return answers.cancel(self.call("cancel", ["--job-id", job_id]))

    def restore_job(self, job_id: str) -> dict:
        """Wire `restore`: bring the job's service back to its recorded prior state."""
        return answers.restore(self.call("restore", ["--job-id", job_id]))

    def restore_service(self, service: dict, *, max_wait: float) -> dict:
        """Wire `restore-service`: start the unit if inactive and wait until healthy or max_wait."""
        args = ["--unit", service["unit"], "--scope", service.get("scope", "system"), "--max-wait", f"{max_wait:.1f}"]
        if service.get("sudo"):
            args.append("--sudo")
        if service.get("health_url"):
            args += ["--health-url", service["health_url"]]
        return answers.restore_service(self.call("restore-service", args))

    def result(self, job_id: str) -> Result:
        return answers.result_answer(self.call("result", ["--job-id", job_id]))

    def gc(self, *, keep_jobs: int, keep_days: float, dry_run: bool) -> dict:
        """Wire `gc`: the host's retention rule (old job dirs and unused bundles deleted, or listed)."""
        args = ["--keep-jobs", str(keep_jobs), "--keep-days", repr(float(keep_days))] + (["--dry-run"] if dry_run else [])
        return answers.gc(self.call("gc", args))

    def call(self, sub: str, args: list[str], *, stdin: bytes = b"") -> dict:
        """One supervisor call; its boot, the upload it may need and the repeat run inside the command's deadline."""
        return self.answer(self._run_boot(sub, args, stdin), sub, args, stdin)

    def answer(self, done: Completed, sub: str, args: list[str], stdin: bytes) -> dict:
        """A call's answer; a host without this bundle gets it uploaded and the call run again."""
        if done.exit_code == EXIT_PAYLOAD_MISSING:
            self.upload()
            done = self._run_boot(sub, args, stdin)
        return _answer(done, sub)

    def boot_argv(self, sub: str, args: list[str]) -> list[str]:
        return launch_argv(self.python, BOOT, [self.root, self.bundle.digest, sub, *args])

    def upload(self) -> None:
        """Both bundles in one round trip (the host skips one it has): `payload-missing` comes from BOOT for
        the supervisor's and from the supervisor for the payload's."""
        bundles = [("payload", self.bundle)] + ([("payloads", self.payload)] if self.payload is not None else [])
        argv = launch_argv(self.python, UNPACK, [self.root, *(f"{kind}/{b.digest}" for kind, b in bundles)])
        self.round_trips += 1
        data = tarball(bundles)
        with verbose.timed(f"{self.transport.name}: upload of {', '.join(k for k, _ in bundles)} ({len(data)} bytes)"):
            _answer(self.transport.run(argv, stdin=data, deadline=self.deadline), "upload")

    def _run_boot(self, sub: str, args: list[str], stdin: bytes) -> Completed:
        self.round_trips += 1
        with verbose.timed(f"{self.transport.name}: supervisor {shlex.join([sub, *args])}"
                           + (f" ({len(stdin)} bytes on stdin)" if stdin else "")) as call:
            done = self.transport.run(self.boot_argv(sub, args), stdin=stdin, deadline=self.deadline)
            call.outcome = f"exit {done.exit_code}, {len(done.stdout)} bytes"
        return done


def _json_bytes(obj: dict | list) -> bytes:
    return json.dumps(obj).encode("utf-8")


def _answer(done: Completed, sub: str) -> dict:
    """Parse the one JSON line the supervisor prints; turn `ok: false` into the matching error."""
    answer = _parse_line(done, sub)
    if answer.get("ok"):
        return answer
    answers.failure(sub, answer)
    code = answer.get("error", "internal")
    message = answer.get("message") or code
    if code == "busy":
        raise HostBusy(f"host busy: {message}", hint=answer.get("hint") or BUSY_HINT)  # the verdict's, when given
    if code == "slurm-refused":
        raise PreflightError(f"Slurm refused the job: {message}", hint="Check the spec's slurm section (partition, "
                             "gres/gpus, account, qos) against `sinfo` on the login node.")
    if code == "slurm-unavailable":
        raise SchedulerUnavailable(message, hint="Run submit against a login node with Slurm's client tools and a "
                                   "reachable slurmctld (`sinfo` there should answer).")
    if code == "no-systemd":
        raise PreflightError(message, hint="Where the service is not a systemd unit, use service.manager: none "
                             "(runner then never stops it); for a user unit, service.scope: user.")
    if code == "unknown-job":
        raise UnknownJob(message, code=code, answer=answer)
    raise RemoteError(f"{sub}: {message}", code=code, answer=answer)


def _parse_line(done: Completed, sub: str) -> dict:
    answer = answers.parse_line(done.stdout, sub)  # bounded: size and depth
    if answer is not None:
        return answer
    if done.exit_code in (126, 127) or b"not found" in done.stderr:
        raise PreflightError(
            f"{sub}: host.python {done.argv[0]!r} cannot be run on the host: {done.stderr_tail(2)}",
            hint="Set host.python to a Python 3 interpreter that exists on the host.",
        )
    raise answers.no_json(sub, done.exit_code, done.stderr_tail())


class LogFrames:
    """The frames of one `logs --stream` call (HostClient.log_stream), the call opened when this is made;
    iterate once; `close` ends the call, killed when still running (also when it was never iterated)."""

    def __init__(self, client: HostClient, args: list[str], offset: int, frame_bytes: int) -> None:
        self._client, self._args, self._offset, self._frame_bytes = client, args, offset, frame_bytes
        self._stream = client._open_stream("logs", args)

    def __iter__(self) -> Iterator[answers.LogChunk]:
        """Each frame checked, as a LogChunk with its bytes. A call that ends inside a frame raises."""
        offset, uploaded = self._offset, False
        try:
            while True:
                line = self._stream.readline(MAX_FRAME_HEADER)
                answer = answers.parse_line(line, "logs")
                if answer is None or not answer.get("ok"):
                    done = self._stream.finish()  # its exit code: 42 when a bundle is missing
                    if done.exit_code == EXIT_PAYLOAD_MISSING and not uploaded:
                        self._client.upload()
                        self._stream, uploaded = self._client._open_stream("logs", self._args), True
                        continue
                    # raises: the host's error, or its bad answer (a line that is ok was not this branch)
                    answer = _answer(Completed(done.argv, done.exit_code, line + done.stdout, done.stderr), "logs")
                frame = answers.log_frame(answer, offset, self._frame_bytes)
                uploaded = True  # the bundle is there: a later payload-missing is the host's answer, not ours
                data = self._stream.read(frame["data_len"])
                if len(data) < frame["data_len"]:
                    self._stream.close()  # ssh's own failure raises here
                    raise RemoteError("logs: the call ended inside a frame", code="internal")
                offset = frame["next_offset"]
                yield answers.LogChunk.from_json(frame, data)
                if frame["last"]:
                    return
        finally:
            self._stream.close()

    def close(self) -> None:
        self._stream.close()
