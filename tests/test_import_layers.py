"""The import layers, enforced: the controller's modules import only their own layer or those below it, with
no cycle (function-local imports count: they hide cycles, they do not remove them); the host side imports
nothing but the standard library and its own modules. Read from the source (AST), nothing is imported."""
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
    own, _ = graph("remote_payload")
    assert sorted(cycles(own)) == KNOWN_HOST_CYCLES


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
    _, other = graph("remote_payload")
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = {}
    for module, names in other.items():  # the payloads (payloads/, each bundled apart) import what they need
        if names - stdlib:
            bad[module] = sorted(names - stdlib)
    assert bad == {}
