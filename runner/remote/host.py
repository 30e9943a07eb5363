"""The controller's side of the host protocol (docs/protocol.md): one method per supervisor subcommand.

Every call is `python3 -c BOOT ROOT HASH SUBCOMMAND ARGS…`: BOOT runs the uploaded supervisor (imported, in the
same interpreter), or answers "payload-missing" (exit 42: the supervisor's or the job's payload bundle is not
there), and then both are uploaded in one call (UNPACK, remote_payload/host/unpack.py) and the call repeated.
On the wire it travels as `launch_argv`: one fixed single-line program plus one base64 word, which every login
shell (sh, bash, zsh, csh/tcsh, fish) hands to python unchanged. The boot, the upload and the repeat share the
command's one Deadline. `with connect(host) as client:` closes the transport on every path.
"""
from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from remote_payload.admission import BUSY_HINT
from remote_payload.contract import EXIT_PAYLOAD_MISSING

from .. import verbose
from ..deadline import Deadline
from ..errors import HostBusy, PreflightError, RemoteError, SchedulerUnavailable, TransportError, UnknownJob, UploadCut
from . import answers
from .bundles import Bundle, Upload, payload_dir
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
""" % EXIT_PAYLOAD_MISSING  # noqa: UP031  (the program's own braces: a format string would double them)

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


MAX_FRAME_HEADER = 64 << 10  # a `logs --stream` frame's header line: a few hundred bytes
STATUS_BATCH = 1000  # job ids per `status` call: its answer (about 1 KB a job) stays far below answers' bound


def unpack_program() -> str:
    """The host's UNPACK (remote_payload/host/unpack.py), run as `python -c`: it needs no bundle there."""
    return (payload_dir() / "host" / "unpack.py").read_text(encoding="utf-8")


class HostClient:
    """Typed calls to the supervisor on one host, each answer checked (answers.py), none past `deadline` (the
    calling command's). Raises RemoteError (or a subclass) for `ok: false`."""

    def __init__(self, transport: Transport, *, root: str, python: str, bundle: Bundle, deadline: Deadline,
                 payload: Bundle | None = None) -> None:
        self.transport = transport
        self.root = root
        self.python = python
        self.bundle = bundle  # the supervisor's
        self.payload = payload  # the job's script and its imports, when it has one
        self.deadline = deadline
        self.round_trips = 0
        self._sent_ahead = False  # the fresh payload bundle was uploaded before its first call

    def __enter__(self) -> HostClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def preflight(self, wire: dict) -> dict:
        return answers.preflight(self.call("preflight", [], stdin=_json_bytes(wire)))

    def submit(self, wire: dict, *, queue: bool = False) -> Started:
        """Wire `submit`: the host's own verdict on its preflight report, in one round trip: start's answer
        (plus `report`, `started`: true, `stop_service`, `notes`), or the refusal raised (busy, exit 4). A
        payload bundle this command hashed afresh (new or changed files) is uploaded first: no host has it yet,
        so asking first would only cost its payload-missing round trip."""
        if self.payload is not None and self.payload.fresh and not self._sent_ahead:
            self._sent_ahead = True
            self.upload()
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

    def restore_service(self, service: dict, *, max_wait: float) -> dict:
        """Wire `restore-service`: start the unit if inactive and wait until healthy or max_wait."""
        args = ["--unit", service["unit"], "--scope", service.get("scope", "system"), "--max-wait", f"{max_wait:.1f}"]
        if service.get("sudo"):
            args.append("--sudo")
        if service.get("health_url"):
            args += ["--health-url", service["health_url"]]
        return answers.restore_service(self.call("restore-service", args))

    def result(self, job_id: str) -> Result:
        return answers.result(self.call("result", ["--job-id", job_id]))

    def gc(self, *, keep_jobs: int, keep_days: float, dry_run: bool, only: list[str] | None = None) -> dict:
        """Wire `gc`: the host's retention rule (old job dirs and unused bundles deleted, or listed); `only`: the
        jobs that may go (on stdin), the others it would delete named in `others`."""
        args = ["--keep-jobs", str(keep_jobs), "--keep-days", repr(float(keep_days))] + (["--dry-run"] if dry_run else [])
        if only is None:
            return answers.gc(self.call("gc", args))
        return answers.gc(self.call("gc", args + ["--ids-on-stdin"], stdin=json.dumps(only).encode()))

    def call(self, sub: str, args: list[str], *, stdin: bytes = b"") -> dict:
        """One supervisor call's answer; a host without this bundle gets it uploaded and the call run again, all
        inside the command's deadline."""
        done = self._run_boot(sub, args, stdin)
        if done.exit_code == EXIT_PAYLOAD_MISSING:
            self.upload(_kept(done))
            done = self._run_boot(sub, args, stdin)
        return _answer(done, sub)

    def boot_argv(self, sub: str, args: list[str]) -> list[str]:
        return launch_argv(self.python, BOOT, [self.root, self.bundle.digest, sub, *args])

    def upload(self, kept: Sequence[str] | None = None) -> None:
        """The bundles the host may lack in one round trip, streamed (it skips one it has): both, or with
        `kept` (the supervisor's payload-missing answer: the supervisor's bundle is there) the payload's
        files but those a cut upload left there. An upload cut by the deadline says how to go on."""
        bundles = [] if kept is not None else [("payload", self.bundle)]
        bundles += [("payloads", self.payload)] if self.payload is not None else []
        argv = launch_argv(self.python, unpack_program(), [self.root, *(f"{kind}/{b.digest}" for kind, b in bundles)])
        stream = Upload(bundles, kept or ())
        self.round_trips += 1
        try:
            with verbose.timed(f"{self.transport.name}: upload of {', '.join(k for k, _ in bundles)} "
                               f"({stream.total} bytes)"):
                done = self.transport.run(argv, stdin=stream, deadline=self.deadline)
        except TransportError as exc:
            if not self.deadline.passed():
                raise
            mib = 1 << 20
            raise UploadCut(f"{exc}: the upload was cut at {stream.sent / mib:.1f} of {stream.total / mib:.1f} MiB",
                            hint="The host keeps each file that arrived whole: the next submit of this job sends "
                                 "only the rest (a larger --max-wait lets one call finish it).") from exc
        _answer(done, "upload")

    def _run_boot(self, sub: str, args: list[str], stdin: bytes) -> Completed:
        self.round_trips += 1
        with verbose.timed(f"{self.transport.name}: supervisor {shlex.join([sub, *args])}"
                           + (f" ({len(stdin)} bytes on stdin)" if stdin else "")) as call:
            done = self.transport.run(self.boot_argv(sub, args), stdin=stdin, deadline=self.deadline)
            call.outcome = f"exit {done.exit_code}, {len(done.stdout)} bytes"
        return done


def _kept(done: Completed) -> list[str] | None:
    """What a cut upload left of the payload bundle, as the supervisor's payload-missing answer lists it;
    None when BOOT answered (the supervisor's bundle is missing too)."""
    answer = answers.parse_line(done.stdout, "upload")
    kept = answer.get("kept") if answer else None
    return [name for name in kept if isinstance(name, str)] if isinstance(kept, list) else None


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
    if code == "preflight-refused":  # the admission's verdict, or a service the host cannot have: nothing touched
        raise PreflightError(message, hint=answer.get("hint") or "")
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
