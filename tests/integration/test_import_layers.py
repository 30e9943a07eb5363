"""The import layers, enforced: the controller's modules import only their own folder or the folders of lower
layers (runner/__init__.py draws the tree), and the host tree's only their own layer or those below it, with no
cycle (function-local imports count: they hide cycles, they do not remove them), and no package __init__ imports
anything; the host side imports nothing but the standard library and its own modules, each in one way only:
package-relative, never as a top-level module beside it (no try/except ImportError pair). Read from the source
(AST), nothing is imported."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]

# The controller's packages, lowest first (runner/__init__.py draws the same tree). A module imports from its own
# package, or from a package on a lower line; packages on one line sit side by side and import none of each other.
# "runner" is the primitives (runner/*.py); a new folder gets a place here.
CONTROLLER_LAYERS = [
    ("primitives", {"runner"}),
    ("local state", {"runner.state"}),
    ("parts", {"runner.spec", "runner.remote", "runner.results"}),
    ("commands", {"runner.commands"}),
    ("fleet", {"runner.fleet"}),
    ("mcp", {"runner.mcp"}),
    ("front end", {"runner.cli"}),
]
ENTRY_MODULES = {"runner.__main__"}  # `python -m runner`: above every layer
# Folders whose modules import only the standard library, the host side's shared modules and LIGHT_THIRD_PARTY:
# what every command loads first stays light (no pydantic, yaml, paramiko, tenacity).
STDLIB_ONLY = {"runner", "runner.state"}
LIGHT_THIRD_PARTY = {"platformdirs"}  # where the state dir is
# The host tree (remote_payload/), lowest first; "pkg.*" places every module of a sub-package, a name of its own
# overrides that. The shared rules are pure and stdlib-only: the controller imports them too.
HOST_LAYERS = [
    ("shared rules", {"__init__", "contract", "admission", "progress", "sweep", "slurm.batch", "slurm.states"}),
    ("host primitives", {"host", "host.*"}),
    ("supervision", {"supervision", "supervision.*"}),
    ("slurm launcher", {"slurm", "slurm.*"}),
    ("verbs", {"verbs", "verbs.*"}),
    ("entry", {"commands", "supervisor"}),
]
# Cycles the host side still has (each hidden by a function-local import): none; listed here if one must be
# tolerated for a while, so that no new cycle can join it.
KNOWN_HOST_CYCLES: list[list[str]] = []




def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root` by dotted name; a package's own file is `pkg.__init__`."""
    return {".".join(path.relative_to(root).with_suffix("").parts): path
            for path in sorted((root / package).rglob("*.py"))}


def resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted import names: itself, or its package's __init__; None when outside `modules`."""
    if target in modules:
        return target
    return f"{target}.__init__" if f"{target}.__init__" in modules else None


def package_imports(module: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(modules of the package that `module` imports anywhere in its body, other top-level names it imports);
    relative imports resolved from the file's own folder."""
    top = module.split(".")[0]
    here = module.rsplit(".", 1)[0].split(".")  # a package's __init__ and its modules start from the same folder
    own, other = set(), set()

    def add(target: str, names: list[str]) -> None:
        found = [resolve(f"{target}.{name}", modules) for name in names]
        if names and all(found):  # `from pkg import a, b` of submodules
            own.update(found)
        elif resolve(target, modules):
            own.add(resolve(target, modules))

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1])
                add(f"{base}.{node.module}" if node.module else base, [a.name for a in node.names])
            elif node.module and node.module.split(".")[0] == top:
                add(node.module, [a.name for a in node.names])
            elif node.module:
                other.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == top:
                    add(alias.name, [])
                else:
                    other.add(alias.name.split(".")[0])
    return own - {module}, other


def controller_graph(root: Path = REPO, package: str = "runner") -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = module_names(root, package)
    own, other = {}, {}
    for name, path in modules.items():
        own[name], other[name] = package_imports(name, path, modules)
    return own, other


def folder_of(module: str) -> str:
    return module.rsplit(".", 1)[0]


def layer_violations(edges: dict[str, set[str]], layers: list[tuple[str, set[str]]],
                     entry: set[str] = frozenset()) -> list[str]:
    """Each import of a package beside or above the importer's own ("a (its layer) imports b (b's layer)")."""
    level = {folder: i for i, (_, folders) in enumerate(layers) for folder in folders}
    found = []
    for module, deps in sorted(edges.items()):
        if module in entry:
            continue
        mine = folder_of(module)
        for dep in sorted(deps):
            theirs = folder_of(dep)
            if theirs != mine and level[theirs] >= level[mine]:
                where = "beside" if level[theirs] == level[mine] else "above"
                found.append(f"{module} ({layers[level[mine]][0]}) imports {dep} ({where}: {layers[level[theirs]][0]})")
    return found


def host_module_name(path: Path) -> str:
    """remote_payload/supervision/files.py → supervision.files; a sub-package's __init__.py is the package."""
    parts = list(path.relative_to(REPO / "remote_payload").with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def host_files() -> dict[str, Path]:
    return {host_module_name(p): p for p in sorted((REPO / "remote_payload").rglob("*.py"))
            if "__pycache__" not in p.parts}


def is_payload(module: str) -> bool:
    return module == "payloads" or module.startswith("payloads.")


def host_imports_of(module: str, path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(host modules, other top-level modules) that `module` imports anywhere in its body, relative imports
    resolved against its package. A payload's bare imports of its flat siblings count as its own."""
    package = module.split(".") if path.name == "__init__.py" and module != "__init__" else module.split(".")[:-1]
    own, other = set(), set()

    def add(target: list[str], names: list[str]) -> None:
        found = {".".join(target + [n]) for n in names if ".".join(target + [n]) in modules}
        own.update(found or ({".".join(target)} if ".".join(target) in modules else set()))

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                add(base + (node.module.split(".") if node.module else []), names)
            elif node.module and node.module.split(".")[0] == "remote_payload":
                add(node.module.split(".")[1:], names)
            elif node.module:
                top = node.module.split(".")[0]
                (own if is_payload(module) and top in modules else other).add(top)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "remote_payload" and len(parts) > 1:
                    add(parts[1:], [])
                else:
                    (own if is_payload(module) and parts[0] in modules else other).add(parts[0])
    return own - {module}, other


def host_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = host_files()
    own, other = {}, {}
    for module, path in files.items():
        own[module], other[module] = host_imports_of(module, path, set(files))
    return own, other


def host_layer(module: str) -> int | None:
    for i, (_, members) in enumerate(HOST_LAYERS):
        if module in members:
            return i
    for i, (_, members) in enumerate(HOST_LAYERS):
        if any(m.endswith(".*") and module.startswith(m[:-1]) for m in members):
            return i
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_hidden_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_controller():
    own, _ = controller_graph()
    assert cycles(own) == []


def test_no_import_cycle_on_the_host_but_the_known_one():
    own, _ = host_graph()
    assert sorted(cycles(own)) == KNOWN_HOST_CYCLES


def test_every_controller_folder_has_a_layer():
    own, _ = controller_graph()
    folders = {folder_of(module) for module in own}
    placed = set().union(*(members for _, members in CONTROLLER_LAYERS))
    assert sorted(folders - placed) == [], "add the new folder to CONTROLLER_LAYERS"
    assert sorted(placed - folders) == [], "a folder in CONTROLLER_LAYERS no longer exists"
    assert sorted(ENTRY_MODULES - set(own)) == []


def test_controller_modules_import_only_their_folder_or_lower_layers():
    own, _ = controller_graph()
    assert layer_violations(own, CONTROLLER_LAYERS, ENTRY_MODULES) == []


def test_no_package_init_imports_anything():
    """A warm submit must not pay for a folder it only passes through (tests/unit/test_command_imports.py)."""
    own, other = controller_graph()
    inits = {m for m in own if m.endswith(".__init__")}
    assert {m: sorted(own[m] | other[m] - {"__future__"}) for m in inits if own[m] | other[m] - {"__future__"}} == {}


def test_the_light_folders_import_only_the_standard_library_and_the_host_contract():
    _, other = controller_graph()
    allowed = set(sys.stdlib_module_names) | {"__future__", "remote_payload"} | LIGHT_THIRD_PARTY
    bad = {m: sorted(names - allowed) for m, names in other.items()
           if folder_of(m) in STDLIB_ONLY and names - allowed}
    assert bad == {}


def host_modules_imported_by_the_controller() -> dict[str, set[str]]:
    """Each controller module's imports of the host side (`remote_payload.X` as X)."""
    found: dict[str, set[str]] = {}
    for name, path in module_names(REPO, "runner").items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("remote_payload."):
                found.setdefault(name, set()).add(node.module.split(".", 1)[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "remote_payload":
                found.setdefault(name, set()).update(a.name for a in node.names)
    return found


def test_the_controller_imports_only_the_host_sides_shared_rules():
    """The spec, a tail and a status never load the host's engine client, systemd or supervision code: only the
    pure rules both sides share."""
    shared = HOST_LAYERS[0][1]
    bad = {m: sorted(names - shared) for m, names in host_modules_imported_by_the_controller().items() if names - shared}
    assert bad == {}


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


def test_every_host_module_has_a_layer():
    modules = [m for m in host_files() if not is_payload(m)]
    assert [m for m in modules if host_layer(m) is None] == [], "add the new module to HOST_LAYERS"
    for _, members in HOST_LAYERS:
        for m in members:
            assert m.endswith(".*") or m in modules, f"{m} in HOST_LAYERS no longer exists"


def test_host_modules_import_only_their_layer_or_below():
    own, _ = host_graph()
    upward = [f"{m} ({HOST_LAYERS[host_layer(m)][0]}) imports {d} ({HOST_LAYERS[host_layer(d)][0]})"
              for m, deps in sorted(own.items()) if not is_payload(m)
              for d in sorted(deps) if not is_payload(d) and host_layer(d) > host_layer(m)]
    assert upward == []


def test_the_host_tree_imports_no_payload():
    own, _ = host_graph()
    assert {m: sorted(d for d in deps if is_payload(d)) for m, deps in own.items()
            if not is_payload(m) and any(is_payload(d) for d in deps)} == {}


def test_the_host_side_has_no_try_except_import_pair():
    """One way to import a host module: package-relative. A fallback to a top-level import would load the same
    file a second time under another name (two Fail classes, two sets of constants) wherever it is taken."""
    pairs = []
    for module, path in host_files().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id in (
                    "ImportError", "ModuleNotFoundError") for h in node.handlers):
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(node)):
                    pairs.append(f"{module}:{node.lineno}")
    assert pairs == []


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (tests/test_*.py) that `path` imports, however spelled: `from tests.test_x import`,
    `from tests import test_x`, `import tests.test_x`, `from .test_x import`, or a "tests.test_x" string
    (importorskip, import_module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            found.update(n.split(".")[-1] for n in names if re.fullmatch(r"(tests\.)?test_\w+", n))
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[-1] for a in node.names if re.fullmatch(r"(tests\.)?test_\w+", a.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"tests\.test_\w+", node.value):
                found.add(node.value.split(".")[-1])
    return found - {path.stem}


def test_no_test_module_imports_another():
    """What tests (and benchmarks) share lives in tests/harness/, tests/hosts/ or tests/conftest.py: a test
    module imported by another drags its own fixtures and module-level state along, and hides what the importer
    depends on."""
    files = sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "bench").rglob("*.py"))
    found = [f"{path.relative_to(REPO)} imports {name}" for path in files
             for name in sorted(imported_test_modules(path))]
    assert found == []


def test_the_test_import_check_sees_every_spelling(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("from tests.test_a import x\nfrom tests import test_b\nimport tests.test_c\nfrom .test_d import y\n"
                     "def f():\n    pytest.importorskip('tests.test_e')\n"
                     "from tests.harness import pace\nfrom tests.cli_helpers import run_cli\n")
    assert imported_test_modules(probe) == {"test_a", "test_b", "test_c", "test_d", "test_e"}


def test_the_host_side_never_imports_the_controller_or_third_party_code():
    _, other = host_graph()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = {}
    for module, names in other.items():
        if names - stdlib and not is_payload(module):  # a payload (bundled apart, per job) imports what it needs
            bad[module] = sorted(names - stdlib)
    assert bad == {}


# ── callbacks: a lower module never receives a higher one's function ─────────────────────────────────

def host_sources() -> dict[str, str]:
    return {m: p.read_text() for m, p in host_files().items() if not is_payload(m)}


def upward_callbacks(sources: dict[str, str]) -> list[str]:
    """Each call that hands a function of a higher layer (a name bound to one of its module's top-level functions,
    imported or its own) to a function of a lower layer: a callback upward, which the import graph cannot see
    ("m:line passes h.f (its layer) to l.g (its layer)"). The callee is resolved where it is a module's function
    (imported by name, or module.function); a method of an object is not. A lambda or a nested function is the
    caller's data (a value to measure, a record to keep), not a room's function, and is not counted."""
    trees = {m: ast.parse(text, m) for m, text in sources.items()}
    functions = {m: {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                 for m, tree in trees.items()}
    found = []
    for module, tree in sorted(trees.items()):
        package = module.split(".")[:-1]
        bound = {name: (module, name) for name in functions[module]}  # name -> (module, function or None)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                for a in node.names:
                    sub = ".".join(base + [a.name])
                    bound[a.asname or a.name] = (sub, None) if sub in trees else (".".join(base), a.name)

        def owner(expr: ast.expr):
            """(module, function name) of a module function the expression names; None otherwise."""
            if isinstance(expr, ast.Name) and expr.id in bound:
                where, name = bound[expr.id]
                return (where, name) if name is not None else None
            if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in bound:
                where, name = bound[expr.value.id]
                return (where, expr.attr) if name is None else None
            return None

        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            callee = owner(call.func)
            if callee is None or callee[0] not in trees or host_layer(callee[0]) is None:
                continue
            for arg in call.args + [k.value for k in call.keywords]:
                given = owner(arg)
                if given is None or given[0] not in trees or given[1] not in functions[given[0]]:
                    continue
                if host_layer(given[0]) > host_layer(callee[0]):
                    found.append(f"{module}:{call.lineno} passes {given[0]}.{given[1]} "
                                 f"({HOST_LAYERS[host_layer(given[0])][0]}) to {callee[0]}.{callee[1]} "
                                 f"({HOST_LAYERS[host_layer(callee[0])][0]})")
    return found


def test_no_host_module_hands_a_lower_one_its_own_function():
    """A lower room that calls back up (submit handed the entry's preflight and start, the detached launch handed
    the entry's main) depends on the room above as surely as an import would: it gets what it needs itself."""
    assert upward_callbacks(host_sources()) == []


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
