"""The controller's side of the host protocol (docs/protocol.md): one method per supervisor subcommand.

Every call is `python3 -c BOOT ROOT HASH SUBCOMMAND ARGS…`: BOOT runs the uploaded supervisor (imported, in
the same interpreter: no second start-up on the host), or answers
"payload-missing" (exit 42), in which case the bundle is uploaded once and the call repeated. On the wire
it travels as `launch_argv`: one fixed single-line program plus one base64 word, which every login shell
(sh, bash, zsh, csh/tcsh, fish) hands to python unchanged. Every call is bounded by the command's one
Deadline, shared by its boot, upload and repeat; no call has an allowance of its own.

`HostClient` is a context manager: `with connect(host) as client:` closes the transport on every path.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from remote_payload.admission import BUSY_HINT
from remote_payload.contract import EXIT_PAYLOAD_MISSING

from . import answers
from .deadline import Deadline
from .errors import HostBusy, PreflightError, RemoteError, SchedulerUnavailable, UnknownJob
from .transport import Completed, Transport

BOOT = r"""
import os, sys
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

# Unpacks a tar.gz of the bundle from stdin into ROOT/payload/HASH, atomically (temp dir + rename), and
# refuses members that are not plain files inside the bundle or whose content does not hash to HASH.
UNPACK = r"""
import hashlib, io, json, os, shutil, sys, tarfile, tempfile
root, digest = os.path.expanduser(sys.argv[1]), sys.argv[2]
base = os.path.join(root, "payload")
dest = os.path.join(base, digest)
tmp = None
def refuse(exc):  # a full or read-only disk: say so in one line, and leave no half-written copy behind
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.stdout.write(json.dumps({"ok": False, "error": "upload-failed", "message": "cannot write the payload "
                     "bundle under %s: %s" % (base, exc.strerror or exc)}) + "\n"); sys.exit(1)
try:
    os.makedirs(base, mode=0o700, exist_ok=True)
except OSError as exc:
    refuse(exc)
if not os.path.isdir(dest):
    tar = tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode="r:gz")
    files = {}
    for m in tar.getmembers():
        parts = m.name.split("/")
        if not m.isfile() or m.name.startswith("/") or ".." in parts:
            sys.stdout.write('{"ok": false, "error": "bad-bundle", "message": "unsafe member"}\n'); sys.exit(1)
        files[m.name] = tar.extractfile(m).read()
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    if h.hexdigest()[:16] != digest:
        sys.stdout.write('{"ok": false, "error": "bad-bundle", "message": "hash mismatch"}\n'); sys.exit(1)
    try:
        tmp = tempfile.mkdtemp(prefix=".tmp-" + digest + "-", dir=base)
        for name, data in files.items():
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
    except OSError as exc:
        refuse(exc)
    try:
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp)  # a concurrent upload won the race; its content is identical
sys.stdout.write('{"ok": true}\n')
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


@dataclass(frozen=True)
class Bundle:
    """The files uploaded to ROOT/payload/<digest>/: remote_payload/*.py plus an optional user script."""

    files: dict[str, bytes]

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + self.files[name] + b"\0")
        return h.hexdigest()[:16]

    def tarball(self) -> bytes:
        import tarfile  # only an upload needs it

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name in sorted(self.files):
                info = tarfile.TarInfo(name)
                info.size = len(self.files[name])
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(self.files[name]))
        return buf.getvalue()


def payload_dir() -> Path:
    import remote_payload

    return Path(remote_payload.__file__).parent


def build_bundle(extra_script: Path | None = None) -> tuple[Bundle, str | None]:
    """Bundle remote_payload/; a user script from outside it goes under `user/`. Returns the script's name."""
    root = payload_dir()
    files = {p.name: p.read_bytes() for p in sorted(root.glob("*.py"))}
    if extra_script is None:
        return Bundle(files), None
    if extra_script.parent.resolve() == root.resolve():
        return Bundle(files), extra_script.name
    name = f"user/{extra_script.name}"
    files[name] = extra_script.read_bytes()
    return Bundle(files), name


class HostClient:
    """Typed calls to the supervisor on one host. Raises RemoteError (or a subclass) for `ok: false`.

    `deadline` is the calling command's: no call runs past it.
    """

    def __init__(self, transport: Transport, *, root: str, python: str, bundle: Bundle, deadline: Deadline) -> None:
        self.transport = transport
        self.root = root
        self.python = python
        self.bundle = bundle
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

    def submit(self, wire: dict, *, queue: bool = False) -> dict:
        """Wire `submit`: the host's own verdict on its preflight report, in one round trip: start's answer
        (plus `report`, `started`: true, `stop_service`, `notes`), or the refusal raised (busy, exit 4)."""
        args = ["--job-id", wire["job_id"]] + (["--queue"] if queue else [])
        return answers.submit(self.call("submit", args, stdin=_json_bytes(wire)), wire["job_id"])

    def status(self, job_ids: Sequence[str] = ()) -> list[dict]:
        args = [a for job_id in job_ids for a in ("--job-id", job_id)]
        return answers.status(self.call("status", args), job_ids)

    def logs(self, job_id: str, offset: int, *, max_bytes: int, wait: float) -> dict:
        args = ["--job-id", job_id, "--offset", str(offset), "--max", str(max_bytes), "--wait", f"{wait:.2f}"]
        return answers.logs(self.call("logs", args), offset, max_bytes)

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

    def result(self, job_id: str) -> dict:
        return answers.result(self.call("result", ["--job-id", job_id]))

    def call(self, sub: str, args: list[str], *, stdin: bytes = b"") -> dict:
        """One supervisor call; its boot, the upload it may need and the repeat run inside the command's deadline."""
        done = self._run_boot(sub, args, stdin)
        if done.exit_code == EXIT_PAYLOAD_MISSING:
            self.upload()
            done = self._run_boot(sub, args, stdin)
        return _answer(done, sub)

    def upload(self) -> None:
        argv = launch_argv(self.python, UNPACK, [self.root, self.bundle.digest])
        self.round_trips += 1
        _answer(self.transport.run(argv, stdin=self.bundle.tarball(), deadline=self.deadline), "upload")

    def _run_boot(self, sub: str, args: list[str], stdin: bytes) -> Completed:
        argv = launch_argv(self.python, BOOT, [self.root, self.bundle.digest, sub, *args])
        self.round_trips += 1
        return self.transport.run(argv, stdin=stdin, deadline=self.deadline)


def _json_bytes(obj: dict) -> bytes:
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
    raise RemoteError(f"{sub}: the host answered no JSON (exit {done.exit_code}): {done.stderr_tail()}")
