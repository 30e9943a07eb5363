"""Payloads travel apart from the supervisor: a job uploads the supervisor's bundle (the host code, never a
benchmark) and its own payload bundle (the script and its local import closure), each content-addressed."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from runner.deadline import Deadline
from runner.commands import controller
from runner.remote import bundles
from tests.cli_helpers import REPO, Target, run_cli, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

BENCHMARK_FILE = ("bench_", "marlin_")


@pytest.fixture
def local() -> Target:
    root = shared_tmpdir("runner-root-")
    yield Target("local", {"address": "local", "root": str(root)}, root, {})
    shutil.rmtree(root, ignore_errors=True)


def uploaded(root: Path) -> list[str]:
    """Every file a job left under ROOT's bundle dirs, relative to ROOT (bytecode caches aside)."""
    return sorted(str(p.relative_to(root)) for kind in ("payload", "payloads") if (root / kind).is_dir()
                  for p in (root / kind).rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_demo_job_uploads_no_benchmark_code(local, work):
    job = write_job(work / "job.yaml", local, script="demo_payload.py", args={"seconds": 1, "sizes": [1]})
    plan = controller.local_plan(str(job), [])
    assert not [n for n in plan.bundle.files if Path(n).name.startswith(BENCHMARK_FILE)]
    assert sorted(plan.payload_bundle.files) == ["demo_payload.py"]
    assert plan.wire["payload"]["bundle"] == plan.payload_bundle.digest
    job_id = submit(local, job)
    assert wait_terminal(local, job_id)["state"] == "SUCCEEDED"
    files = uploaded(local.root)
    assert f"payloads/{plan.payload_bundle.digest}/demo_payload.py" in files
    assert f"payload/{plan.bundle.digest}/supervisor.py" in files
    assert [f for f in files if Path(f).name.startswith(BENCHMARK_FILE)] == [], files


def test_a_benchmark_only_edit_leaves_the_supervisor_digest(tmp_path, monkeypatch):
    copy = tmp_path / "remote_payload"
    shutil.copytree(REPO / "remote_payload", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bundles, "payload_dir", lambda: copy)
    before = bundles.supervisor_bundle().digest
    benchmark = next(copy.rglob("marlin_stats.py"))
    benchmark.write_text(benchmark.read_text() + "\n# tuned\n")
    assert bundles.supervisor_bundle().digest == before
    supervisor = copy / "supervisor.py"
    supervisor.write_text(supervisor.read_text() + "\n# changed\n")
    assert bundles.supervisor_bundle().digest != before


def test_the_supervisor_bundle_holds_its_packages_but_no_payload(tmp_path, monkeypatch):
    copy = tmp_path / "remote_payload"
    shutil.copytree(REPO / "remote_payload", copy, ignore=shutil.ignore_patterns("__pycache__"))
    write(copy / "rooms" / "__init__.py", "")
    write(copy / "rooms" / "deep.py", "X = 1\n")
    monkeypatch.setattr(bundles, "payload_dir", lambda: copy)
    files = bundles.supervisor_bundle().files
    assert {"supervisor.py", "contract.py", "rooms/__init__.py", "rooms/deep.py"} <= set(files)
    assert not [n for n in files if n.startswith("payloads/") or Path(n).name.startswith(BENCHMARK_FILE)]


def test_the_benchmark_bundle_is_its_script_and_the_modules_it_imports():
    plan = controller.local_plan(str(REPO / "jobs" / "k26_marlin.yaml"), [])
    names = sorted(plan.payload_bundle.files)
    assert names[0] == "bench_marlin_moe.py" and all(n.startswith("marlin_") for n in names[1:])
    expected = sorted(p.name for p in (REPO / "remote_payload" / "payloads" / "marlin_moe").glob("marlin_*.py"))
    assert names[1:] == expected
    assert plan.wire["payload"]["script"] == "bench_marlin_moe.py"


HELPER_SCRIPT = """
    import json, os, sys
    from helper import GREETING
    from tools import shout

    def main():
        print(shout(GREETING), flush=True)
        with open(os.environ["RUNNER_RESULT"], "w") as fh:
            json.dump({"said": shout(GREETING)}, fh)

    if __name__ == "__main__":
        main()
"""


def test_a_user_script_outside_the_repo_travels_with_its_own_modules_and_runs(local, work):
    scripts = work / "mine"
    write(scripts / "bench.py", HELPER_SCRIPT)
    write(scripts / "helper.py", "GREETING = 'hello from the helper'\n")
    write(scripts / "tools" / "__init__.py", "from .loud import shout\n")
    write(scripts / "tools" / "loud.py", "def shout(text):\n    return text.upper()\n")
    write(scripts / "unrelated.py", "raise SystemExit('never imported')\n")
    job = write_job(scripts / "job.yaml", local, script="bench.py")
    job_id = submit(local, job)
    assert wait_terminal(local, job_id)["state"] == "SUCCEEDED"
    tail = run_cli(local, "tail", job_id, "--from-start")
    assert b"HELLO FROM THE HELPER" in tail.stdout, tail.stderr
    bundles = {Path(f).parts[1] for f in uploaded(local.root) if f.startswith("payloads/")}
    assert len(bundles) == 1
    names = sorted(str(Path(*Path(f).parts[2:])) for f in uploaded(local.root) if f.startswith("payloads/"))
    assert names == ["bench.py", "helper.py", "tools/__init__.py", "tools/loud.py"]


ESTIMATING_SCRIPT = """
    import argparse

    def build_parser():
        parser = argparse.ArgumentParser()
        parser.add_argument("--gib", type=int, default=1)
        return parser

    def parse_args(argv):
        return build_parser().parse_args(argv)

    def estimate_peak_bytes(args):
        return args.gib << 30
"""


def test_a_user_script_with_its_own_estimate_gets_min_free_mib_auto(work):
    write(work / "sized.py", ESTIMATING_SCRIPT)
    spec = {"name": "sized", "host": {"address": "local"}, "service": {"manager": "none"},
            "gpu": {"min_free_mib": "auto"}, "payload": {"script": "sized.py", "args": {"gib": 3}},
            "limits": {"max_runtime": "1m"}}
    (work / "job.yaml").write_text(yaml.safe_dump(spec))
    plan = controller.local_plan(str(work / "job.yaml"), [])
    assert plan.wire["gpu"]["required_mib"] == 3 * 1024
    assert "checked against sized.py" in plan.args_note
    sweep = dict(spec, sweep={"matrix": {"gib": [2, 5]}})
    (work / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    assert controller.local_plan(str(work / "sweep.yaml"), []).wire["gpu"]["required_mib"] == 5 * 1024


def test_min_free_mib_auto_without_an_estimate_names_what_is_missing(work):
    write(work / "plain.py", "def parse_args(argv):\n    return argv\n")
    spec = {"name": "plain", "host": {"address": "local"}, "service": {"manager": "none"},
            "gpu": {"min_free_mib": "auto"}, "payload": {"script": "plain.py"}, "limits": {"max_runtime": "1m"}}
    (work / "job.yaml").write_text(yaml.safe_dump(spec))
    from runner.errors import SpecError

    with pytest.raises(SpecError, match=r"gpu.min_free_mib: `auto` needs .*estimate_peak_bytes.*plain.py"):
        controller.local_plan(str(work / "job.yaml"), [])


def test_the_import_closure_ignores_the_stdlib_and_installed_packages(tmp_path):
    script = write(tmp_path / "run.py", """
        import json, os.path, collections.abc
        import yaml, pytest
        from local_mod import thing
        from pkg import sub
        try:
            import fast_path
        except ImportError:
            fast_path = None

        def later():
            import pkg.deeper.leaf
            from pkg.deeper import missing_name
    """)
    write(tmp_path / "local_mod.py", "from . import sibling\nthing = 1\n")
    write(tmp_path / "sibling.py", "")
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "sub.py", "import json\n")
    write(tmp_path / "pkg" / "deeper" / "__init__.py", "")
    write(tmp_path / "pkg" / "deeper" / "leaf.py", "from .. import sub\n")
    write(tmp_path / "pkg" / "unused.py", "")
    write(tmp_path / "fast_path.py", "")
    write(tmp_path / "yaml_notes.txt", "not code")
    closure = bundles.payload_bundle(script).files
    assert sorted(closure) == ["fast_path.py", "local_mod.py", "pkg/__init__.py", "pkg/deeper/__init__.py",
                               "pkg/deeper/leaf.py", "pkg/sub.py", "run.py", "sibling.py"]
    assert closure["run.py"] == script.read_bytes()


def test_the_import_closure_leaves_out_what_resolves_outside_the_scripts_directory(tmp_path):
    write(tmp_path / "outside.py", "")
    script = write(tmp_path / "inner" / "run.py", "import outside\nimport linked\nfrom .. import outside\n")
    (tmp_path / "inner" / "linked.py").symlink_to(tmp_path / "outside.py")
    assert sorted(bundles.payload_bundle(script).entries) == ["run.py"]


def test_a_file_the_controller_cannot_parse_still_travels_with_its_imports(tmp_path):
    """payload.python may be newer than the controller's: the host's probe judges the syntax; each import
    statement is read by itself, so such a file's own imports travel too."""
    script = write(tmp_path / "run.py", "import helper\n")
    write(tmp_path / "helper.py", "match = (\nimport followed\nprint(f'{x!r:>{w}}' if (y := 1) else z)\n")
    write(tmp_path / "followed.py", "")
    assert sorted(bundles.payload_bundle(script).entries) == ["followed.py", "helper.py", "run.py"]


def test_import_statements_are_found_wherever_they_stand_and_nothing_else_counts(tmp_path):
    script = write(tmp_path / "run.py", """
        import a_mod, os.path as p; from b_pkg import (c_sub,  # one (of two)
            d_sub)
        if p: import e_mod
        else:from.f_mod import g
        from h_pkg \\
            import i_sub
        importlib.import_module("j_mod"); reimport = k_mod; __import__("l_mod")
        note = "see: import m_mod"
    """)
    for name in ("a_mod", "e_mod", "f_mod", "j_mod", "k_mod", "l_mod", "m_mod"):
        write(tmp_path / f"{name}.py", "")
    for package, subs in (("b_pkg", ("c_sub", "d_sub")), ("h_pkg", ("i_sub",))):
        write(tmp_path / package / "__init__.py", "")
        for sub in subs:
            write(tmp_path / package / f"{sub}.py", "")
    assert sorted(bundles.payload_bundle(script).entries) == [
        "a_mod.py", "b_pkg/__init__.py", "b_pkg/c_sub.py", "b_pkg/d_sub.py", "e_mod.py", "f_mod.py",
        "h_pkg/__init__.py", "h_pkg/i_sub.py", "run.py"]


def test_both_bundles_travel_in_one_upload_and_a_warm_submit_is_one_round_trip(local, work):
    from runner.state.store import Store

    demo = write_job(work / "demo.yaml", local, script="demo_payload.py", args={"seconds": 1, "sizes": [1]})
    write(work / "other.py", "print('other')\n")
    other = write_job(work / "other.yaml", local, script="other.py")
    store = Store()
    trips = [controller.submit(str(job), [], store=store, progress=lambda _m: None,
                               deadline=Deadline.for_command(50)) for job in (demo, demo, other)]
    # a payload this controller has just hashed goes up before its submit (no host has it): the upload of both
    # bundles, the submit; warm: one; a new payload on a warm host: its upload, the submit
    assert [t.round_trips for t in trips] == [2, 1, 2]
    for done in trips:
        assert wait_terminal(local, done.job_id)["state"] == "SUCCEEDED"
    assert len(list((local.root / "payload").iterdir())) == 1
    assert len(list((local.root / "payloads").iterdir())) == 2
    # a host without a bundle this controller hashed before: its payload-missing answer, the upload, again
    shutil.rmtree(local.root / "payload")
    again = controller.submit(str(other), [], store=store, progress=lambda _m: None, deadline=Deadline.for_command(50))
    assert again.round_trips == 3
    assert wait_terminal(local, again.job_id)["state"] == "SUCCEEDED"


def test_every_module_of_the_supervisor_bundle_imports_on_a_bare_host(tmp_path):
    """Nothing in the host code reaches into a payload (the estimator registry did): each module of the
    bundle imports from the bundle's dir alone, under `python -S`, as BOOT runs it."""
    import subprocess
    import sys

    bundle = bundles.supervisor_bundle()
    for name, data in bundle.files.items():  # the package's tree, as supervisor.py binds it
        write(tmp_path / "remote_payload" / name, data.decode())
    modules = sorted("remote_payload." + n[:-3].replace("/", ".").removesuffix(".__init__")
                     for n in bundle.files if n not in ("__init__.py", "supervisor.py"))
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    done = subprocess.run([sys.executable, "-S", "-c", code, *modules], cwd=tmp_path, capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-1000:]


def test_a_cut_upload_goes_on_where_it_stopped(local, work, monkeypatch):
    """A submit whose upload was cut (its --max-wait, a lost link) left the files that arrived whole on the
    host; the next submit of the job is told which by the payload-missing answer and sends only the rest."""
    import subprocess
    import sys

    from runner.remote.bundles import Upload
    from runner.remote.host import unpack_program
    from runner.remote.transport import LocalTransport, input_chunks
    from runner.state.store import Store

    write(work / "big.py", "import part_a, part_b\nprint('whole')\n")
    for name in ("part_a", "part_b"):
        write(work / f"{name}.py", f"DATA = {'x' * (1 << 20)!r}\n")
    job = write_job(work / "big.yaml", local, script="big.py")
    plan = controller.local_plan(str(job), [])
    payload = plan.payload_bundle
    whole = b"".join(Upload([("payload", plan.bundle), ("payloads", payload)]))
    cut = whole[:whole.index(b'"part_b.py"') + 1000]  # the supervisor's, big.py and part_a.py whole; part_b.py begun
    where = f"payloads/{payload.digest}"
    done = subprocess.run([sys.executable, "-c", unpack_program(), str(local.root), f"payload/{plan.bundle.digest}",
                           where], input=cut, capture_output=True)
    assert b"upload-cut" in done.stdout and not (local.root / where).exists()
    sent = []
    real_run = LocalTransport.run

    def counting_run(self, argv, *, stdin=b"", deadline):
        sent.append(b"".join(input_chunks(stdin)))
        return real_run(self, argv, stdin=sent[-1], deadline=deadline)

    monkeypatch.setattr(LocalTransport, "run", counting_run)
    again = controller.submit(str(job), [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
    assert again.round_trips == 3  # payload-missing (what it kept named), the rest, the submit
    upload = max(sent, key=len)
    assert b'"part_b.py"' in upload and b'"part_a.py"' not in upload and len(upload) < (1 << 20) + 200_000
    assert wait_terminal(local, again.job_id)["state"] == "SUCCEEDED"
    assert (local.root / where / "part_a.py").read_bytes() == (work / "part_a.py").read_bytes()
