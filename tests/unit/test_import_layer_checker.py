"""The import-layer checker (tests/lint/import_layers.py, a lint step of `.ci/run`) sees what it must: an upward or
sideways import, a cycle hidden in a function, every import spelling, a function handed down, a test module
imported by another; and its main names each violation and exits 1."""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.lint.import_layers import (CONTROLLER_LAYERS, ENTRY_MODULES, controller_graph, cycles, imported_test_modules,
                                      layer_violations, main, upward_callbacks)

REPO = Path(__file__).resolve().parents[2]


def test_the_cycle_finder_finds_a_hidden_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_layer_check_fails_on_an_upward_or_sideways_import():
    edges = {"runner.state.store": {"runner.errors"}, "runner.spec.spec": {"runner.state.store"},
             "runner.errors": {"runner.cli.cli"}, "runner.remote.host": {"runner.spec.spec"},
             "runner.cli.cli": {"runner.commands.controller"}, "runner.__main__": {"runner.cli.cli"}}
    assert layer_violations(edges, CONTROLLER_LAYERS, ENTRY_MODULES) == [
        "runner.errors (primitives) imports runner.cli.cli (above: front end)",
        "runner.remote.host (parts) imports runner.spec.spec (beside: parts)",
    ]


def test_relative_imports_are_read_from_the_files_own_folder(tmp_path):
    """Two levels of folders, each import spelling the tree uses: the graph the layer check sees is the real one."""
    files = {
        "pkg/__init__.py": "",
        "pkg/errors.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from ..errors import X\nfrom ..high import b\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "def f():\n    from ..low.a import Y\n    from . import c\n    import pkg.errors\n",
        "pkg/high/c.py": "from pkg import errors\nfrom pkg.low import a\nimport json\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    own, other = controller_graph(tmp_path, "pkg")
    assert own["pkg.low.a"] == {"pkg.errors", "pkg.high.b"}
    assert own["pkg.high.b"] == {"pkg.low.a", "pkg.high.c", "pkg.errors"}
    assert own["pkg.high.c"] == {"pkg.errors", "pkg.low.a"} and other["pkg.high.c"] == {"json"}
    layers = [("bottom", {"pkg"}), ("low", {"pkg.low"}), ("high", {"pkg.high"})]
    assert layer_violations(own, layers) == ["pkg.low.a (low) imports pkg.high.b (above: high)"]
    assert cycles(own) == [["pkg.high.b", "pkg.high.c", "pkg.low.a"]]


def test_the_test_import_check_sees_every_spelling(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("from tests.test_a import x\nfrom tests import test_b\nimport tests.test_c\nfrom .test_d import y\n"
                     "def f():\n    pytest.importorskip('tests.test_e')\n"
                     "from tests.integration.test_f import z\nfrom tests.unit import test_g\nfrom test_h import w\n"
                     "import_module('tests.unit.test_i')\nprint('test_j')\n"
                     "from tests.harness import pace\nfrom tests.cli_helpers import run_cli\n")
    assert imported_test_modules(probe) == {f"test_{x}" for x in "abcdefghi"}


def test_the_callback_check_sees_a_function_handed_down():
    sources = {
        "host.primitives": "def run(call):\n    return call()\n",
        "supervision.start": "from ..host.primitives import run\ndef launch(main, argv):\n    main(argv)\n"
                             "def local():\n    pass\ndef same_layer():\n    run(local)\n",
        "supervision.job": "from . import start\ndef go():\n    pass\ndef f():\n    start.launch(go, [])\n",
        "commands": "\n".join([
            "from .supervision.start import launch", "from .supervision import start", "from .host import primitives",
            "from .supervision import job", "def main(argv):",
            "    launch(main, argv)",                  # 6: the entry's own function, handed down
            "    start.launch(lambda: main([]), [])",  # a lambda: the caller's data, not counted
            "    start.launch(job.go, [])",            # a room's function to a room of its own layer
            "    primitives.run(main)",                # 9
            "    primitives.run(job.go)",              # 10: supervision's function to host/
            "    launch(print, argv)", ""]),
    }
    assert upward_callbacks(sources) == [
        "commands:6 passes commands.main (entry) to supervision.start.launch (supervision)",
        "commands:9 passes commands.main (entry) to host.primitives.run (host primitives)",
        "commands:10 passes supervision.job.go (supervision) to host.primitives.run (host primitives)",
        "supervision.start:7 passes supervision.start.local (supervision) to host.primitives.run (host primitives)",
    ]


def test_the_script_names_each_violation_in_a_checkout_and_exits_1(tmp_path, capsys):
    """A copy of this checkout's code, four rules broken in it: main prints a line for each and exits 1."""
    for folder in ("runner", "remote_payload"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_x.py").write_text("from tests.unit.test_y import helper\n")
    with (tmp_path / "runner" / "errors.py").open("a") as fh:
        fh.write("\n\ndef _late():\n    from .cli import cli\n")
    with (tmp_path / "remote_payload" / "contract.py").open("a") as fh:
        fh.write("\n\ndef _late():\n    from .verbs import reap\n    import yaml\n")
    assert main([str(tmp_path)]) == 1
    printed = capsys.readouterr().out.splitlines()
    for expected in (
            "a controller import beside or above the importer's layer: runner.errors (primitives) imports "
            "runner.cli.cli (above: front end)",
            "a host import above the importer's layer: contract (shared rules) imports verbs.reap (verbs)",
            "the host side importing the controller or third-party code: contract imports yaml",
            "a test module imported by another: tests/unit/test_x.py imports test_y"):
        assert expected in printed, printed
