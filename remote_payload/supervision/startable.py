"""May this job's payload start? The one host rule, checked before anything is touched: payload.user can be
run as, the program runs, a script compiles and its top-level imports resolve (found, never imported), asked
as the user the payload runs as (nothing payload.user can change ever runs as root), and every JIT cache dir
in payload.env is writable.

A problem is `Fail("cannot-start", "FIELD: why", field=FIELD)`. The preflight report raises it (`submit`
refuses with exit 4 naming the field), and the supervisor checks again once it holds the locks (a queued job
may start hours later), before its prepare step and the service stop.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess

from ..contract import START_PROBE_TIMEOUT_S, cache_dir_keys
from ..host.answer import Fail
from ..host.bundle import HERE
from ..host.processes import communicate_within
from .payload import as_user

# Run by payload.python with argv [script]: compile the script as that interpreter would, then look up (with
# importlib's finders, importing nothing) each module the script imports at its top level, outside any
# try/if. Written for any Python the payload may use: no f-strings, one JSON line on stdout.
PROBE = r"""
import ast, importlib.util, json, os, sys
path = sys.argv[1]
sys.path[0] = os.path.dirname(path)
answer = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "missing": [], "syntax": None}
try:
    with open(path, "rb") as fh:
        tree = compile(fh.read(), path, "exec", ast.PyCF_ONLY_AST)
    compile(tree, path, "exec")
except SyntaxError as exc:
    answer["syntax"] = "line %s: %s" % (exc.lineno, exc.msg)
    tree = ast.Module(body=[])
for node in tree.body:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
        names = [node.module]
    else:
        continue
    for top in [name.split(".")[0] for name in names]:
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found and top not in answer["missing"]:
            answer["missing"].append(top)
sys.stdout.write(json.dumps(answer) + "\n")
"""


def cannot_start(field: str, why: str) -> Fail:
    return Fail("cannot-start", "%s: %s; nothing was run or stopped" % (field, why), field=field)


def check_startable(spec: dict, root: str, environ=None) -> None:
    """Raise `cannot-start` naming the first field that keeps the payload from starting (Slurm's: not here)."""
    if spec.get("launcher") == "slurm":
        return
    user = payload_user(spec, root)
    payload = spec["payload"]
    env = dict(os.environ if environ is None else environ, **payload["env"])
    if user is not None:
        env.update({"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name})
    check_cache_dirs(payload["env"])
    if payload["command"] is not None:
        check_commands(spec, env)
    else:
        check_script(payload, env, user, root)


def payload_user(spec: dict, root: str):
    """payload.user's pwd entry (None without one): a user other than root, for a supervisor running as root,
    who can reach the job dirs (its result file) and change nothing on the way to ROOT."""
    name = spec["payload"].get("user")
    if name is None:
        return None
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise cannot_start("payload.user", "no user %r on this host" % name) from None
    if user.pw_uid == 0:
        raise cannot_start("payload.user", "%r is root: the payload would be as free as the supervisor" % name)
    if os.geteuid() != 0:
        raise cannot_start("payload.user", "the supervisor runs as uid %d; only root can run the payload as %r"
                           % (os.geteuid(), name))
    blocked = unsearchable(os.path.join(root, "jobs"), user)
    if blocked:
        raise cannot_start("payload.user", "%r cannot reach %s (%s is not searchable by it); give host.root a "
                           "path it can reach" % (name, os.path.join(root, "jobs"), blocked))
    blocked = changeable(root, user)
    if blocked:
        raise cannot_start("payload.user", "%r can change %s, on the way to host.root or in it: it could put its "
                           "own code where root runs the supervisor; give host.root a path only root can "
                           "write" % (name, blocked))
    return user


def unsearchable(path: str, user) -> str:
    """The first existing dir on the way to path that `user` may not search (mode bits), or ''."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    parts = os.path.abspath(path).split(os.sep)
    for depth in range(1, len(parts) + 1):
        here = os.sep + os.path.join(*parts[1:depth]) if depth > 1 else os.sep
        try:
            info = os.stat(here)
        except FileNotFoundError:
            return ""  # made by the supervisor, searchable (claim_job_dir; the job dir: payload.hand_result_to)
        bit = 0o100 if info.st_uid == user.pw_uid else 0o010 if info.st_gid in groups else 0o001
        if not info.st_mode & bit:
            return here
    return ""


def changeable(root: str, user) -> str:
    """The first path `user` could change that the supervisor's code and records hang on, or '': each dir on
    the way to ROOT (a writable one is safe only when sticky and the next step exists and is not its), ROOT,
    the dirs root keeps there and the bundle this code runs from."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))

    def writable(info) -> bool:
        bit = 0o200 if info.st_uid == user.pw_uid else 0o020 if info.st_gid in groups else 0o002
        return info.st_uid == user.pw_uid or bool(info.st_mode & bit)

    parts = os.path.abspath(root).split(os.sep)[1:]
    for depth in range(len(parts)):
        here, step = os.sep + os.sep.join(parts[:depth]), os.sep + os.sep.join(parts[:depth + 1])
        info = os.stat(here)
        if writable(info):
            try:
                kept = info.st_mode & stat.S_ISVTX and os.lstat(step).st_uid != user.pw_uid
            except FileNotFoundError:
                kept = False  # it could make the next step its own before the supervisor does
            if not kept:
                return here
    for path in [root] + [os.path.join(root, d) for d in ("payload", "payloads", "jobs", "tmp")] + [HERE]:
        try:
            if writable(os.lstat(path)):
                return path
        except FileNotFoundError:
            continue
    return ""


def check_cache_dirs(env: dict) -> None:
    for key in cache_dir_keys(env):
        why = directory_problem(env[key])
        if why:
            raise cannot_start("payload.env." + key, why)


def directory_problem(path: str):
    """Why the payload could not write into `path`, creating it (a relative path is the job dir's)."""
    if not os.path.isabs(path):
        return None
    existing = os.path.normpath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return "%s cannot be a directory: %s is not one" % (path, existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == os.path.normpath(path):
            return "%s is not writable by uid %d" % (path, os.geteuid())
        return "%s cannot be created: %s is not writable by uid %d" % (path, existing, os.geteuid())
    return None


def program_path(field: str, program: str, env: dict) -> str:
    """The file `program` names as subprocess would find it (the payload env's PATH); `cannot-start` if none."""
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise cannot_start(field, "%s is not an executable file on the host%s" % (
            program, "" if "/" in program else " (not on the payload's PATH)"))
    return found


def check_commands(spec: dict, env: dict) -> None:
    payload = spec["payload"]
    programs = [("payload.command", payload["command"][0])]
    if payload.get("prepare"):
        programs.append(("payload.prepare_command", payload["prepare"][0]))
    programs += [("payload.command", v["argv"][0]) for v in (spec.get("sweep") or {}).get("variants", []) if v["argv"]]
    for field, program in programs:
        program_path(field, program, env)


def check_script(payload: dict, env: dict, user=None, root: str = "") -> None:
    script = payload["path"]
    if not os.path.isfile(script):
        raise cannot_start("payload.script", "%s is not in the uploaded payload" % payload["script"])
    if user is not None:
        open_bundle(os.path.join(root, "payloads", payload["bundle"]))
    answer = probe(program_path("payload.python", payload["python"], env), script, env, user)
    if answer.get("syntax"):
        raise cannot_start("payload.script", "%s does not compile with %s (Python %s): %s" % (
            payload["script"], payload["python"], answer.get("python"), answer["syntax"]))
    if answer.get("missing"):
        raise cannot_start("payload.script", "%s imports %s, which %s cannot find" % (
            payload["script"], ", ".join(answer["missing"]), payload["python"]))


def open_bundle(bundle: str) -> None:
    """payload.user reads the job's payload bundle to run it: its dirs 0755, its files 0644, ROOT/payloads
    0711. A bundle is code; a job's secrets are in spec.json (0600)."""
    os.chmod(os.path.dirname(bundle), 0o711)
    for folder, _, files in os.walk(bundle):
        os.chmod(folder, 0o755)
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):  # UNPACK writes none; never chmod through one
                os.chmod(os.path.join(folder, name), 0o644)


def probe(python: str, script: str, env: dict, user=None) -> dict:
    """payload.python's own answer to PROBE, bounded by START_PROBE_TIMEOUT_S, as the user the payload runs as."""
    field = "payload.python"
    try:
        proc = subprocess.Popen([python, "-c", PROBE, script], env=env, cwd="/", stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                **as_user(user))
    except OSError as exc:
        raise cannot_start(field, "%s cannot be run: %s" % (python, exc.strerror or exc)) from exc
    output = communicate_within(proc, START_PROBE_TIMEOUT_S)
    if output is None:
        raise cannot_start(field, "%s did not answer `python -c` within %.0f s" % (python, START_PROBE_TIMEOUT_S))
    out, err = output
    try:
        answer = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
        if proc.returncode == 0 and isinstance(answer, dict):
            return answer
    except (IndexError, ValueError):
        pass
    detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    raise cannot_start(field, "%s is not a Python that runs here (exit %s: %s)" % (
        python, proc.returncode, detail[0][-300:]))
