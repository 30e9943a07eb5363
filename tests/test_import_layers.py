"""The import layers, enforced: the controller's modules and the host tree's import only their own layer or
those below it, with no cycle (function-local imports count: they hide cycles, they do not remove them); the
host side imports nothing but the standard library and its own modules, each in one way only: package-relative,
never as a top-level module beside it (no try/except ImportError pair). Read from the source (AST), nothing
is imported."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Lowest first. A module may import from its own layer and the layers below; a new module gets a line here.
CONTROLLER_LAYERS = [
    ("primitives", {"errors", "deadline", "printable", "cli_echo", "local_files", "spec_fields", "job_id",
                    "import_closure"}),
    ("spec and local state", {"spec", "spec_fleet", "spec_slurm", "spec_load", "spec_reference", "store", "fleet_store",
                              "payload_args", "preflight", "answers", "results", "gate", "gate_report"}),
    ("hosts and records", {"transport", "transport_openssh", "host", "plan_cache", "history", "history_report"}),
    ("commands", {"controller", "watch"}),
    ("applications", {"ci", "app", "fleet", "fleet_view", "fleet_results", "mcp_policy"}),
    ("front ends", {"fleet_cli", "mcp_server", "cli", "__main__", "__init__"}),
]
# The host tree (remote_payload/), lowest first; "pkg.*" places every module of a sub-package, a name of its own
# overrides that. The shared rules are pure and stdlib-only: the controller imports them too.
HOST_LAYERS = [
    ("shared rules", {"__init__", "contract", "admission", "progress", "sweep", "slurm.batch", "slurm.states"}),
    ("host primitives", {"host", "host.*"}),
    ("supervision", {"supervision", "supervision.*"}),
    ("slurm launcher", {"slurm", "slurm.*"}),
    ("entry", {"commands", "supervisor"}),
]
# Cycles the host side still has (each hidden by a function-local import): none; listed here if one must be
# tolerated for a while, so that no new cycle can join it.
KNOWN_HOST_CYCLES: list[list[str]] = []


def imports_of(path: Path, package: str, siblings: set[str]) -> tuple[set[str], set[str]]:
    """(sibling modules, other top-level modules) that `path` imports anywhere in its body."""
    own, other = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                names = [node.module] if node.module else [a.name for a in node.names]
                own.update(n.split(".")[0] for n in names)
            elif node.module and node.module.split(".")[0] == package:
                rest = node.module.split(".")[1:]
                own.update([rest[0]] if rest else [a.name for a in node.names])
            elif node.module:
                top = node.module.split(".")[0]
                (own if top in siblings else other).add(top)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package and len(parts) > 1:
                    own.add(parts[1])
                else:
                    (own if parts[0] in siblings else other).add(parts[0])
    return own & siblings - {path.stem}, other


def graph(package: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = sorted((REPO / package).glob("*.py"))
    siblings = {f.stem for f in files}
    own, other = {}, {}
    for f in files:
        own[f.stem], other[f.stem] = imports_of(f, package, siblings)
    return own, other


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
    own, _ = graph("runner")
    assert cycles(own) == []


def test_no_import_cycle_on_the_host_but_the_known_one():
    own, _ = host_graph()
    assert sorted(cycles(own)) == KNOWN_HOST_CYCLES


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


def test_every_controller_module_has_a_layer():
    own, _ = graph("runner")
    placed = set().union(*(members for _, members in CONTROLLER_LAYERS))
    assert sorted(set(own) - placed) == [], "add the new module to CONTROLLER_LAYERS"
    assert sorted(placed - set(own)) == [], "a module in CONTROLLER_LAYERS no longer exists"


def test_controller_modules_import_only_their_layer_or_below():
    own, _ = graph("runner")
    layer = {m: i for i, (_, members) in enumerate(CONTROLLER_LAYERS) for m in members}
    upward = [f"{m} ({CONTROLLER_LAYERS[layer[m]][0]}) imports {d} ({CONTROLLER_LAYERS[layer[d]][0]})"
              for m, deps in sorted(own.items()) for d in sorted(deps) if layer[d] > layer[m]]
    assert upward == []


def test_the_host_side_never_imports_the_controller_or_third_party_code():
    _, other = host_graph()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = {}
    for module, names in other.items():
        if names - stdlib and not is_payload(module):  # a payload (bundled apart, per job) imports what it needs
            bad[module] = sorted(names - stdlib)
    assert bad == {}
