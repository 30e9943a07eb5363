"""The payload bundle: content-addressed, uploaded once, unpacked safely (UNPACK runs here for real)."""
import io
import json
import subprocess
import sys
import tarfile

from runner.host import UNPACK, Bundle, build_bundle


def unpack(root, digest, data):
    return subprocess.run([sys.executable, "-c", UNPACK, str(root), digest], input=data, capture_output=True)


def test_digest_depends_on_names_and_contents():
    a = Bundle({"x.py": b"1"})
    assert a.digest == Bundle({"x.py": b"1"}).digest
    assert a.digest != Bundle({"x.py": b"2"}).digest
    assert a.digest != Bundle({"y.py": b"1"}).digest


def test_bundle_holds_the_supervisor_and_a_user_script(tmp_path):
    script = tmp_path / "my bench; $(x).py"
    script.write_text("print('hi')\n")
    bundle, name = build_bundle(script)
    assert "supervisor.py" in bundle.files or "demo_payload.py" in bundle.files
    assert name == "user/my bench; $(x).py"
    assert bundle.files[name] == b"print('hi')\n"


def test_unpack_is_atomic_and_idempotent(tmp_path):
    bundle = Bundle({"a.py": b"print(1)\n", "user/b c.py": b"x"})
    done = unpack(tmp_path, bundle.digest, bundle.tarball())
    assert json.loads(done.stdout) == {"ok": True}
    dest = tmp_path / "payload" / bundle.digest
    assert (dest / "user" / "b c.py").read_bytes() == b"x"
    again = unpack(tmp_path, bundle.digest, b"")  # already there: nothing read, nothing changed
    assert json.loads(again.stdout) == {"ok": True}
    assert [p.name for p in (tmp_path / "payload").iterdir()] == [bundle.digest]


def test_unpack_refuses_traversal_and_wrong_hash(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    done = unpack(tmp_path, "0" * 16, buf.getvalue())
    assert done.returncode == 1 and b"unsafe member" in done.stdout
    assert not (tmp_path / "escape.py").exists()
    bundle = Bundle({"a.py": b"1"})
    done = unpack(tmp_path, "f" * 16, bundle.tarball())
    assert done.returncode == 1 and b"hash mismatch" in done.stdout


def test_unpacked_bundle_runs_the_supervisor_and_its_rooms_as_a_script(tmp_path):
    """BOOT runs ROOT/payload/<digest>/supervisor.py as a script: its rooms and contract.py must travel and
    import from there (sys.path[0] is the payload dir), with no remote_payload package on the host."""
    bundle, _ = build_bundle()
    rooms = {"contract.py", "supervisor.py", "supervisor_files.py", "supervisor_host.py", "supervisor_job.py",
             "supervisor_record.py", "supervisor_settle.py", "supervisor_spec.py"}
    assert rooms <= set(bundle.files)
    assert json.loads(unpack(tmp_path, bundle.digest, bundle.tarball()).stdout) == {"ok": True}
    script = tmp_path / "payload" / bundle.digest / "supervisor.py"
    done = subprocess.run([sys.executable, "-S", str(script), "status", "--root", str(tmp_path)], cwd="/",
                          capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout) == {"ok": True, "jobs": []}, done.stderr
