"""The bundles: content-addressed, uploaded once, unpacked safely (UNPACK runs here for real)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.errors import LocalStateError
from runner.remote import bundles as host
from runner.remote.bundles import Bundle, Upload, payload_bundle, supervisor_bundle
from runner.remote.host import unpack_program

REPO = Path(__file__).resolve().parents[2]


def unpack(root, data, *names):
    return subprocess.run([sys.executable, "-c", unpack_program(), str(root), *names], input=data,
                          capture_output=True)


def tarball(bundles, kept=()) -> bytes:
    """What an upload of these bundles sends (its frames), in one piece."""
    return b"".join(Upload(bundles, kept))


def test_digest_depends_on_names_and_contents():
    a = Bundle({"x.py": b"1"})
    assert a.digest == Bundle({"x.py": b"1"}).digest
    assert a.digest != Bundle({"x.py": b"2"}).digest
    assert a.digest != Bundle({"y.py": b"1"}).digest


def test_a_user_scripts_bundle_is_named_from_its_own_directory(tmp_path):
    script = tmp_path / "my bench; $(x).py"
    script.write_text("print('hi')\n")
    bundle = payload_bundle(script)
    assert bundle.files == {"my bench; $(x).py": b"print('hi')\n"}
    assert bundle.entries["my bench; $(x).py"].source == str(script)  # read when uploaded, not before
    assert "supervisor.py" in supervisor_bundle().files


def test_unpack_is_atomic_and_idempotent(tmp_path):
    sup, job = Bundle({"a.py": b"print(1)\n"}), Bundle({"b c.py": b"x", "pkg/d.py": b"y"})
    names = [f"payload/{sup.digest}", f"payloads/{job.digest}"]
    done = unpack(tmp_path, tarball([("payload", sup), ("payloads", job)]), *names)
    assert json.loads(done.stdout) == {"ok": True}, done.stdout
    assert (tmp_path / "payload" / sup.digest / "a.py").read_bytes() == b"print(1)\n"
    assert (tmp_path / "payloads" / job.digest / "pkg" / "d.py").read_bytes() == b"y"
    again = unpack(tmp_path, b"", *names)  # already there: nothing read, nothing changed
    assert json.loads(again.stdout) == {"ok": True}
    assert [p.name for p in (tmp_path / "payload").iterdir()] == [sup.digest]
    assert [p.name for p in (tmp_path / "payloads").iterdir()] == [job.digest]


def test_unpack_adds_only_the_missing_bundle(tmp_path):
    sup, job = Bundle({"a.py": b"1"}), Bundle({"b.py": b"2"})
    assert json.loads(unpack(tmp_path, tarball([("payload", sup)]), f"payload/{sup.digest}").stdout)["ok"]
    stamp = (tmp_path / "payload" / sup.digest / "a.py").stat().st_mtime_ns
    done = unpack(tmp_path, tarball([("payload", sup), ("payloads", job)]), f"payload/{sup.digest}",
                  f"payloads/{job.digest}")
    assert json.loads(done.stdout) == {"ok": True}
    assert (tmp_path / "payloads" / job.digest / "b.py").read_bytes() == b"2"
    assert (tmp_path / "payload" / sup.digest / "a.py").stat().st_mtime_ns == stamp


def test_unpack_refuses_traversal_wrong_hash_and_unnamed_bundles(tmp_path):
    where = "payload/" + "0" * 16
    for name in ("../../escape.py", "/abs.py", "a//b.py", ".tmp-1", ".lock"):
        done = unpack(tmp_path, _frame(where, name, b"x"), where)
        assert done.returncode == 1 and b"unsafe member" in done.stdout, name
    assert not (tmp_path / "escape.py").exists()
    bundle = Bundle({"a.py": b"1"})
    done = unpack(tmp_path, tarball([("payload", bundle)]), "payload/" + "f" * 16)
    assert done.returncode == 1 and b"unsafe member" in done.stdout  # not the bundle it was asked for
    wrong = Bundle({"a.py": b"2"})
    data = tarball([("payload", bundle)])
    done = unpack(tmp_path, _renamed(bundle, wrong.digest), "payload/" + wrong.digest)
    assert done.returncode == 1 and b"hash mismatch" in done.stdout
    assert not (tmp_path / "payload" / wrong.digest).exists()
    lying = _frame(f"payload/{bundle.digest}", "a.py", b"2", sha=bundle.entries["a.py"].sha256)
    done = unpack(tmp_path, lying, f"payload/{bundle.digest}")  # a file that is not what its header says
    assert done.returncode == 1 and b"changed while it was sent" in done.stdout
    for name in ("elsewhere/" + bundle.digest, "payload/../x", "payload/short"):
        done = unpack(tmp_path, data, name)
        assert done.returncode == 1 and b"bad-bundle" in done.stdout
    assert not (tmp_path / "payload" / bundle.digest).exists()


def _frame(where: str, name: str, data: bytes, sha: str | None = None) -> bytes:
    import hashlib

    sha = sha or hashlib.sha256(data).hexdigest()
    return json.dumps([where, name, len(data), sha]).encode() + b"\n" + data + json.dumps([where]).encode() + b"\n"


def _renamed(bundle: Bundle, digest: str) -> bytes:
    """bundle's files under payload/<digest>/: an upload whose content does not hash to its name."""
    return b"".join(_frame(f"payload/{digest}", name, data)[:-len(json.dumps([f"payload/{digest}"])) - 1]
                    for name, data in bundle.files.items()) + json.dumps([f"payload/{digest}"]).encode() + b"\n"


def test_a_cut_upload_keeps_the_files_that_came_whole_and_the_next_one_sends_only_the_rest(tmp_path):
    job = Bundle({"a.py": b"a" * 1000, "b.py": b"b" * 1000, "pkg/c.py": b"c" * 1000})
    where = f"payloads/{job.digest}"
    whole = tarball([("payloads", job)])
    cut = whole[:whole.index(b'"pkg/c.py"') + 200]  # a.py and b.py whole, c.py begun
    done = unpack(tmp_path, cut, where)
    assert done.returncode == 1 and json.loads(done.stdout)["error"] == "upload-cut"
    assert not (tmp_path / where).exists()
    from remote_payload.host.unpack import kept, stage_of

    assert kept(stage_of(str(tmp_path), where)) == ["a.py", "b.py"]
    rest = tarball([("payloads", job)], kept=["a.py", "b.py"])
    assert b'"a.py"' not in rest and len(rest) < len(whole) - 1900
    assert json.loads(unpack(tmp_path, rest, where).stdout) == {"ok": True}
    assert sorted(str(p.relative_to(tmp_path / where)) for p in (tmp_path / where).rglob("*") if p.is_file()) == \
        ["a.py", "b.py", "pkg/c.py"]
    assert (tmp_path / where / "pkg" / "c.py").read_bytes() == b"c" * 1000
    assert not Path(stage_of(str(tmp_path), where)).exists()


def test_unpacked_bundle_runs_the_supervisor_and_its_rooms_as_a_script(tmp_path):
    """BOOT runs ROOT/payload/<digest>/supervisor.py as a script: its rooms and contract.py must travel and
    import from there (sys.path[0] is the payload dir), with no remote_payload package on the host."""
    bundle = supervisor_bundle()
    rooms = {"contract.py", "supervisor.py", "supervision/files.py", "host/answer.py", "host/bundle.py", "host/gpu.py",
             "host/parsers.py", "host/processes.py", "host/systemd.py", "supervision/job.py", "supervision/record.py",
             "supervision/restore/settle.py", "supervision/spec.py"}
    assert rooms <= set(bundle.files)
    assert json.loads(unpack(tmp_path, tarball([("payload", bundle)]), f"payload/{bundle.digest}").stdout) == {"ok": True}
    script = tmp_path / "payload" / bundle.digest / "supervisor.py"
    done = subprocess.run([sys.executable, "-S", str(script), "status", "--root", str(tmp_path)], cwd="/",
                          capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout) == {"ok": True, "jobs": []}, done.stderr


def test_the_script_loads_each_host_module_once_under_the_package(tmp_path):
    """supervisor.py binds its directory as the package remote_payload and takes that directory off sys.path:
    a module of the bundle loaded a second time as a top-level module (`contract` beside
    `remote_payload.contract`) would be two copies, two Fail classes that do not catch each other."""
    bundle = supervisor_bundle()
    assert {"host/__init__.py", "supervision/__init__.py", "slurm/__init__.py", "commands.py"} <= set(bundle.files)
    assert json.loads(unpack(tmp_path, tarball([("payload", bundle)]), f"payload/{bundle.digest}").stdout)["ok"]
    script = tmp_path / "payload" / bundle.digest / "supervisor.py"
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", str(script), "status", "--root", str(tmp_path)],
                          cwd="/", capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout) == {"ok": True, "jobs": []}, done.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    tops = {name.split("/")[0].removesuffix(".py") for name in bundle.files} | {"remote_payload"}
    ours = {name for name in loaded if name.split(".")[0] in tops}
    assert {"remote_payload.commands", "remote_payload.contract", "remote_payload.supervision.files"} <= ours
    assert sorted(name for name in ours if not name.startswith("remote_payload")) == []



def test_the_read_only_verbs_load_only_their_rooms(tmp_path):
    """`status` and `logs` run at every poll and every tail: they load neither typing, nor signal's enums,
    nor importlib, nor the rooms that settle or start a job (record, budget, systemd, start), which a reap
    of a dead job and a restorer import when they need them."""
    bundle = supervisor_bundle()
    assert json.loads(unpack(tmp_path, tarball([("payload", bundle)]), f"payload/{bundle.digest}").stdout)["ok"]
    script = tmp_path / "payload" / bundle.digest / "supervisor.py"
    job = tmp_path / "jobs" / "j1"
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"job_id": "j1", "state": "SUCCEEDED", "exit_code": 0}))
    (job / "output.log").write_bytes(b"hello\n")
    for verb in (["status", "--ids-on-stdin"], ["logs", "--job-id", "j1", "--offset", "0"],
                 ["logs", "--job-id", "j1", "--offset", "0", "--stream"]):
        done = subprocess.run([sys.executable, "-S", "-X", "importtime", str(script), *verb, "--root", str(tmp_path)],
                              input='["j1"]', cwd="/", capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert json.loads(done.stdout.splitlines()[0])["ok"], (verb, done.stdout, done.stderr)
        loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                  if line.startswith("import time:")}
        assert "remote_payload.supervision.files" in loaded
        heavy = {"typing", "signal", "importlib", "subprocess", "shutil", "hashlib", "argparse",
                 "remote_payload.supervision.record", "remote_payload.supervision.budget",
                 "remote_payload.host.systemd", "remote_payload.supervision.start", "remote_payload.slurm.batch"}
        assert sorted(heavy & loaded) == [], verb
        assert "base64" not in loaded or "--stream" not in verb  # a stream sends raw bytes


# -- the bundles' digests, recorded in the state dir against their files' stamps -------------------------------

def _a_new_command(monkeypatch, copy):
    """What a new `runner` process starts from: no bundle in memory, the host code at `copy`."""
    monkeypatch.setattr(host, "payload_dir", lambda: copy)
    monkeypatch.setattr(host, "_SUPERVISOR", [])
    return host.supervisor_bundle()


def _host_code(tmp_path):
    copy = tmp_path / "remote_payload"
    shutil.copytree(REPO / "remote_payload", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_a_recorded_digest_is_used_only_while_no_file_changed(tmp_path, monkeypatch):
    copy = _host_code(tmp_path)
    first = _a_new_command(monkeypatch, copy)
    read_now = Bundle(dict(first.files)).digest
    assert first.digest == read_now
    again = _a_new_command(monkeypatch, copy)
    assert again.digest == first.digest and again.files == first.files  # the recorded digest, the files read on use
    # An edit of the same size, its mtime put back (`cp -p`, `rsync -t`): its ctime still tells.
    contract = copy / "contract.py"
    before, stamp = contract.read_bytes(), contract.stat()
    time.sleep(0.02)  # past the file system's timestamp granularity
    contract.write_bytes(before.replace(b"PROTOCOL", b"PROTOCOX", 1))
    os.utime(contract, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    edited = _a_new_command(monkeypatch, copy)
    assert edited.digest != first.digest
    assert edited.digest == Bundle({name: data for name, data in edited.files.items()}).digest
    assert edited.files["contract.py"] == contract.read_bytes()
    contract.write_bytes(before)  # back as it was: the digest is the first one again, read and hashed afresh
    assert _a_new_command(monkeypatch, copy).digest == first.digest


def test_files_changed_after_their_digest_was_taken_are_never_uploaded_under_it(tmp_path, monkeypatch):
    copy = _host_code(tmp_path)
    _a_new_command(monkeypatch, copy)
    recorded = _a_new_command(monkeypatch, copy)  # its digest from the record, its files not read yet
    digest = recorded.digest
    supervisor = copy / "supervisor.py"
    before = supervisor.read_bytes()
    supervisor.write_bytes(before + b"\n# changed meanwhile\n")
    for read in (lambda: recorded.files, lambda: tarball([("payload", recorded)])):
        with pytest.raises(LocalStateError, match="changed while this command ran"):
            read()
    supervisor.write_bytes(before.replace(b"import", b"IMPORT", 1))  # the same size: the host tells
    sent = tarball([("payload", recorded)])  # the host checks each file against the sha256 its frame names
    done = unpack(tmp_path / "root", sent, f"payload/{digest}")
    assert done.returncode == 1 and json.loads(done.stdout)["error"] == "bad-bundle"
    assert not (tmp_path / "root" / "payload" / digest).exists()
    assert _a_new_command(monkeypatch, copy).digest != digest


def test_an_unreadable_digest_record_is_a_miss(tmp_path, monkeypatch):
    copy = _host_code(tmp_path)
    digest = _a_new_command(monkeypatch, copy).digest
    record = Path(os.environ["RUNNER_STATE_DIR"]) / host.INDEX_FILE
    bad_files = {str(copy / "supervisor.py"): {"stamp": "x", "sha256": 7}}
    for text in ("{torn", "[]", json.dumps({"files": bad_files, "bundles": {str(copy): {"files": "x", "digest": 7}}})):
        record.write_text(text)
        assert _a_new_command(monkeypatch, copy).digest == digest
    recorded = json.loads(record.read_text())["bundles"][str(copy)]
    assert recorded["digest"] == digest and len(recorded["files"]) == len(_a_new_command(monkeypatch, copy).files)


def test_an_unchanged_closure_is_neither_read_nor_parsed_again(tmp_path, monkeypatch):
    """A submit's payload bundle: its files' digests and imports come from the state dir's index while their
    stamps hold; a changed module is read again, and only it."""
    (tmp_path / "run.py").write_text("import helper\n")
    (tmp_path / "helper.py").write_text("from . import data\n")
    (tmp_path / "data.py").write_text("X = 1\n")
    first = payload_bundle(tmp_path / "run.py")
    assert sorted(first.entries) == ["data.py", "helper.py", "run.py"]
    read = []
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.name) or real_read(self))
    again = payload_bundle(tmp_path / "run.py")
    assert again.digest == first.digest and read == []
    time.sleep(0.02)
    (tmp_path / "helper.py").write_text("from . import data\nimport more\n")
    (tmp_path / "more.py").write_text("")
    edited = payload_bundle(tmp_path / "run.py")
    assert sorted(read) == ["helper.py", "more.py"]
    assert sorted(edited.entries) == ["data.py", "helper.py", "more.py", "run.py"] and edited.digest != first.digest
