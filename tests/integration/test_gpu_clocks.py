"""The GPU clocks a result was measured at: the Marlin benchmark's nvidia-smi reading around its timed part
(the pure parser on captured-format output; the payload on the CPU torch backend with the test stand-in
nvidia-smi on PATH, and with none), `runner results` showing them beside the lever, and the gate's note when
the baseline and the run were measured at different clocks (runner/results/clocks.py).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


from runner.results import clocks, gate, gate_report
from runner.results.results import render_any

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = REPO / "remote_payload" / "payloads" / "marlin_moe"
DATA = REPO / "tests" / "data" / "nvidia-smi"
STAND_IN = REPO / "tests" / "hosts" / "bin"
RUN2 = REPO / "results" / "h200" / "run2"
sys.path.insert(0, str(PAYLOAD))          # the payload's modules import each other as top-level modules

import marlin_env  # noqa: E402


def clocked(name: str, sm: tuple[int, int], temp: tuple[int, int] = (53, 60), limit: float = 700.0) -> dict:
    res = json.loads((RUN2 / f"{name}.json").read_text())
    res["gpu_clocks"] = {"gpu": "GPU-aaaa8a08", "source": "nvidia-smi",
                         "start": {"index": 0, "sm_mhz": sm[0], "mem_mhz": 3201, "temp_c": temp[0], "power_limit_w": limit},
                         "end": {"index": 0, "sm_mhz": sm[1], "mem_mhz": 3201, "temp_c": temp[1], "power_limit_w": limit}}
    return res


# -- the payload's parser -----------------------------------------------------------------------------------

def test_the_parser_reads_a_cards_clocks_temperature_and_power_limit():
    text = (DATA / "h200-clocks.csv").read_text()
    assert marlin_env.parse_gpu_clocks(text) == {"index": 0, "sm_mhz": 1740, "mem_mhz": 3201, "temp_c": 53,
                                                 "power_limit_w": 700}


def test_cells_nvidia_smi_cannot_read_are_null_and_other_lines_are_no_reading():
    text = (DATA / "na-values-clocks.csv").read_text()
    assert marlin_env.parse_gpu_clocks(text) == {"index": 0, "sm_mhz": None, "mem_mhz": None, "temp_c": 41,
                                                 "power_limit_w": None}
    assert marlin_env.parse_gpu_clocks("") is None
    assert marlin_env.parse_gpu_clocks('Field "clocks.sm" is not a valid field to query.\n') is None
    assert marlin_env.parse_gpu_clocks("0, 1740, 3201\n") is None


# -- the payload, CPU torch backend ---------------------------------------------------------------------------

def run_bench(tmp_path: Path, path: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(PAYLOAD / "bench_marlin_moe.py"), "--experts", "8", "--hidden", "128",
         "--intermediate", "64", "--topk", "2", "--batch-sizes", "1,2", "--device", "cpu", "--backend", "torch",
         "--iterations", "2", "--repeats", "2", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PATH": path, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.read_text())


def fake_gpus(tmp_path: Path, cards: list[dict]) -> dict:
    state = tmp_path / "gpu-state"
    state.mkdir()
    (state / "gpus.json").write_text(json.dumps(cards))
    return {"RUNNER_FAKE_GPU_DIR": str(state)}


def card(index: int, **clock) -> dict:
    return {"index": index, "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000", "name": "NVIDIA H200",
            "total_mib": 143771, "clocks": clock}


def test_the_result_records_the_visible_cards_clocks_at_the_start_and_end_of_the_timed_part(tmp_path):
    env = fake_gpus(tmp_path, [card(0, sm=1980), card(1, sm=1755, temp=57, power_limit="[N/A]")])
    _, result = run_bench(tmp_path, f"{STAND_IN}:/usr/bin:/bin", {**env, "CUDA_VISIBLE_DEVICES": "1"})
    record = result["gpu_clocks"]
    assert record["gpu"] == "1" and record["source"] == "nvidia-smi"
    for end in ("start", "end"):
        assert record[end] == {"index": 1, "sm_mhz": 1755, "mem_mhz": 3201, "temp_c": 57, "power_limit_w": None}
    assert [r["m"] for r in result["rows"]] == [1, 2]


def test_without_nvidia_smi_the_clocks_are_null_and_the_run_succeeds(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    _, result = run_bench(tmp_path, str(empty))
    assert result["gpu_clocks"] is None and [r["m"] for r in result["rows"]] == [1, 2]


def test_a_card_nvidia_smi_does_not_know_is_no_reading_not_a_failure(tmp_path):
    env = fake_gpus(tmp_path, [card(0)])
    _, result = run_bench(tmp_path, f"{STAND_IN}:/usr/bin:/bin", {**env, "CUDA_VISIBLE_DEVICES": "7"})
    assert result["gpu_clocks"] is None and result["rows"]


# -- results and the gate -------------------------------------------------------------------------------------

def test_results_show_the_clocks_beside_the_lever():
    text = render_any(clocked("warm1", (1710, 1740)))
    line = next(line for line in text.splitlines() if line.startswith("lever(512)"))
    assert line.endswith("x at SM 1710–1740 MHz, memory 3201 MHz, 53–60 °C, 700 W limit "
                         "(start and end of the timed part)"), line
    assert not any("at SM" in line for line in render_any(json.loads((RUN2 / "warm1.json").read_text())).splitlines())


def test_hostile_clock_records_are_left_out_not_rendered():
    res = clocked("warm1", (1710, 1740))
    res["gpu_clocks"]["start"] = {"sm_mhz": "1710\nfake", "mem_mhz": 3201, "temp_c": float("nan"),
                                  "power_limit_w": True}
    res["gpu_clocks"]["end"] = ["not", "an", "object"]
    assert clocks.clocks_of(res) == {"mem_mhz": [3201]}
    assert clocks.clocks_of({"gpu_clocks": "x"}) == {} and clocks.clocks_of([1]) == {}


def test_a_two_percent_sm_clock_difference_is_a_note_not_a_failure():
    slow, fast = clocks.clocks_of(clocked("warm1", (1710, 1740))), clocks.clocks_of(clocked("warm2", (1770, 1815)))
    assert "SM clocks differ by 3.9% (more than 2%)" in clocks.different_clocks(slow, fast)
    near = clocks.clocks_of(clocked("warm2", (1740, 1760)))
    assert clocks.different_clocks(slow, near) is None
    assert clocks.different_clocks(slow, {}) is None
    capped = clocks.clocks_of(clocked("warm2", (1710, 1740), limit=600.0))
    assert "power limits differ (700 W, 600 W)" in clocks.different_clocks(slow, capped)


def runner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60)


def test_the_gate_says_the_baseline_and_the_run_were_measured_at_different_clocks(tmp_path):
    gate.write_baseline(tmp_path / "base.json", clocked("warm1", (1710, 1740)), "warm1")
    assert json.loads((tmp_path / "base.json").read_text())["gpu_clocks"]["start"]["sm_mhz"] == 1710
    (tmp_path / "fast.json").write_text(json.dumps(clocked("warm2", (1770, 1815))))
    done = runner("results", str(tmp_path / "fast.json"), "--baseline", str(tmp_path / "base.json"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "PASSED" in lines[0]
    assert lines[1] == "clocks: baseline SM 1710–1740 MHz, memory 3201 MHz, 53–60 °C, 700 W limit · this run " \
                       "SM 1770–1815 MHz, memory 3201 MHz, 53–60 °C, 700 W limit"
    assert lines[2].startswith("note: measured at different clocks: SM clocks differ by 3.9%")
    junit = runner("results", str(tmp_path / "fast.json"), "--baseline", str(tmp_path / "base.json"),
                   "--format", "junit")
    assert "measured at different clocks" in ET.fromstring(junit.stdout).find(".//testsuite/system-out").text


def test_same_clocks_no_note_and_old_baselines_without_clocks_still_gate(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(clocked("warm2", (1720, 1745))))
    gate.write_baseline(tmp_path / "base.json", clocked("warm1", (1710, 1740)), "warm1")
    done = runner("results", str(tmp_path / "run.json"), "--baseline", str(tmp_path / "base.json"))
    assert done.returncode == 0 and "clocks: baseline SM 1710–1740 MHz" in done.stdout and "note:" not in done.stdout
    old = json.loads((tmp_path / "base.json").read_text())
    del old["gpu_clocks"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    done = runner("results", str(tmp_path / "run.json"), "--baseline", str(tmp_path / "old.json"))
    assert done.returncode == 0 and "clocks: baseline not recorded · this run SM 1720–1745 MHz" in done.stdout


def test_two_runs_side_by_side_show_both_clocks_and_the_note():
    a, b = clocked("warm1", (1710, 1740)), clocked("warm2", (1770, 1815))
    verdicts = gate.compare(gate.extract_metrics(a), gate.extract_metrics(b), 0.05)
    text = gate_report.side_by_side(a, b, verdicts, name_a="a", name_b="b")
    assert "clocks: A SM 1710–1740 MHz" in text and "note: measured at different clocks" in text
    plain = gate_report.side_by_side(copy.deepcopy(a) | {"gpu_clocks": None}, b, verdicts, name_a="a", name_b="b")
    assert "clocks: A not recorded · B SM 1770–1815 MHz" in plain
