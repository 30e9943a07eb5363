"""payload.files: data files beside a benchmark travel with it, content-addressed in its payload bundle. Through
the real CLI on the loopback sshd (OpenSSH transport, root login)."""
from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import yaml

from tests.cli_helpers import Target, run_cli, submit, wait_terminal
from tests.hosts._proc import shared_tmpdir

BENCH = """\
    import json, pathlib, sys
    here = pathlib.Path(__file__).parent
    config = json.loads((here / "data" / "config.json").read_text())
    weights = (here / "data" / "weights" / "w.bin").read_bytes()
    print("config", config["layers"], "weights", len(weights), sys.argv[1:])
"""


@pytest.fixture
def target(ssh_host) -> Target:
    root = shared_tmpdir("runner-root-files-")
    yield Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                 {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)
    shutil.rmtree(root, ignore_errors=True)


def write_bench(work, target: Target, files: list[str]):
    (work / "bench.py").write_text(textwrap.dedent(BENCH))
    (work / "data" / "weights").mkdir(parents=True)
    (work / "data" / "config.json").write_text(json.dumps({"layers": 61}))
    (work / "data" / "weights" / "w.bin").write_bytes(bytes(range(256)) * 40)
    (work / "data" / "notes.txt").write_text("not shipped")
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "reads its data", "host": target.host, "service": {"manager": "none"},
                                   "payload": {"script": "bench.py", "files": files}}))
    return job


def output_of(target: Target, job_id: str) -> str:
    return run_cli(target, "tail", job_id, "--from-start", "--max-wait", "5").stdout.decode()


def test_a_benchmark_that_reads_a_data_file_beside_it_runs_on_the_host(target, work):
    job = write_bench(work, target, ["data/*.json", "data/weights/**"])
    dry = run_cli(target, "submit", str(job), "--dry-run")
    assert dry.returncode == 0, dry.stderr.decode()
    assert "payload       3 files, 0.0 MiB" in dry.stdout.decode()  # bench.py, config.json, w.bin
    job_id = submit(target, job)
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED", output_of(target, job_id)
    assert "config 61 weights 10240" in output_of(target, job_id)
    bundle = next((target.root / "payloads").iterdir())
    assert sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()) == \
        ["bench.py", "data/config.json", "data/weights/w.bin"]
    # an edit of a data file is a new bundle: the job reads the file as it is now
    (work / "data" / "config.json").write_text(json.dumps({"layers": 62}))
    again = submit(target, job)
    assert wait_terminal(target, again)["state"] == "SUCCEEDED"
    assert "config 62" in output_of(target, again)
    assert len(list((target.root / "payloads").iterdir())) == 2


def test_payload_files_are_refused_before_any_host_when_they_match_nothing_leave_the_folder_or_pass_the_cap(
        target, work, monkeypatch):
    job = write_bench(work, target, ["data/*.csv"])
    done = run_cli(target, "submit", str(job))
    assert done.returncode == 2 and b"payload.files: 'data/*.csv' matches no file" in done.stderr
    (work / "sub").mkdir()
    (work / "sub" / "bench.py").write_text("print(1)\n")
    spec = yaml.safe_load(job.read_text())
    spec["payload"].update(script="sub/bench.py", files=["data/config.json"])
    job.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(job))
    assert done.returncode == 2 and b"outside the script's folder" in done.stderr
    big = work / "data" / "big.bin"
    with open(big, "wb") as fh:
        fh.truncate((1 << 30) + 1)  # sparse: over the cap without writing a gigabyte
    spec["payload"].update(script="bench.py", files=["data/*.bin"])
    job.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(job))
    assert done.returncode == 2 and b"payload.files: 1 files of 1024.0 MiB, over the 1024 MiB" in done.stderr
    assert not (target.root / "payloads").exists()  # no host was asked
    spec["payload"] = {"command": ["true"], "files": ["data/config.json"]}
    job.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(job))
    assert done.returncode == 2 and b"files" in done.stderr
