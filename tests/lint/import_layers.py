"""The import layers, checked from the source (AST; nothing is imported or run): `.ci/run` runs it after mypy.

    python tests/lint/import_layers.py [REPO]

Prints each violation, one a line, and exits 1 when there is any. The rules: the controller's modules import only
their own folder or the folders of lower layers (runner/__init__.py draws the tree), and the host tree's only their
own layer or those below it, with no cycle (function-local imports count: they hide cycles, they do not remove
them), and no package __init__ imports anything; the host side imports nothing but the standard library and its
own modules, each in one way only: package-relative, never as a top-level module beside it (no try/except
ImportError pair), and never hands a lower layer a function of its own; no test module imports another.
tests/unit/test_import_layer_checker.py tests the checker itself.
"""
from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
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
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
TEST_MODULE = re.compile(r"(tests\.(\w+\.)*)?test_\w+")  # test_x, tests.test_x, tests.unit.test_x


# ── the controller's import graph ────────────────────────────────────────────────────────────────────────────

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
    own: set[str] = set()
    other: set[str] = set()

    def add(target: str, names: list[str]) -> None:
        found = [resolve(f"{target}.{name}", modules) for name in names]
        if names and all(found):  # `from pkg import a, b` of submodules
            own.update(f for f in found if f)
        elif resolved := resolve(target, modules):
            own.add(resolved)

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


def controller_graph(root: Path, package: str = "runner") -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(each module's imports of its own package, each module's other top-level imports)."""
    modules = module_names(root, package)
    own, other = {}, {}
    for name, path in modules.items():
        own[name], other[name] = package_imports(name, path, modules)
    return own, other


def folder_of(module: str) -> str:
    return module.rsplit(".", 1)[0]


def layer_violations(edges: dict[str, set[str]], layers: list[tuple[str, set[str]]],
                     entry: set[str] | frozenset[str] = frozenset()) -> list[str]:
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


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

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


# ── the host tree's import graph ─────────────────────────────────────────────────────────────────────────────

def host_module_name(path: Path, host_root: Path) -> str:
    """remote_payload/supervision/files.py → supervision.files; a sub-package's __init__.py is the package."""
    parts = list(path.relative_to(host_root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def host_files(repo: Path) -> dict[str, Path]:
    host_root = repo / "remote_payload"
    return {host_module_name(p, host_root): p for p in sorted(host_root.rglob("*.py")) if "__pycache__" not in p.parts}


def is_payload(module: str) -> bool:
    return module == "payloads" or module.startswith("payloads.")


def host_imports_of(module: str, path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(host modules, other top-level modules) that `module` imports anywhere in its body, relative imports
    resolved against its package. A payload's bare imports of its flat siblings count as its own."""
    package = module.split(".") if path.name == "__init__.py" and module != "__init__" else module.split(".")[:-1]
    own: set[str] = set()
    other: set[str] = set()

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


def host_graph(repo: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = host_files(repo)
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


def layer_name(module: str) -> str:
    level = host_layer(module)
    return HOST_LAYERS[level][0] if level is not None else "no layer"


# ── callbacks: a lower module never receives a higher one's function ─────────────────────────────────────────

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
        bound = names_bound_to_functions(module, tree, functions[module], set(trees))

        def owner(expr: ast.expr, bound: dict[str, tuple[str, str | None]] = bound) -> tuple[str, str] | None:
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
                if (host_layer(given[0]) or 0) > (host_layer(callee[0]) or 0):
                    found.append(f"{module}:{call.lineno} passes {given[0]}.{given[1]} ({layer_name(given[0])}) "
                                 f"to {callee[0]}.{callee[1]} ({layer_name(callee[0])})")
    return found


def names_bound_to_functions(module: str, tree: ast.Module, own_functions: set[str],
                             modules: set[str]) -> dict[str, tuple[str, str | None]]:
    """Each name in `module` that stands for a host module (module, None) or a module's function (module, name):
    its own top-level functions and what it imports package-relative."""
    package = module.split(".")[:-1]
    bound: dict[str, tuple[str, str | None]] = {name: (module, name) for name in own_functions}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            for a in node.names:
                sub = ".".join(base + [a.name])
                bound[a.asname or a.name] = (sub, None) if sub in modules else (".".join(base), a.name)
    return bound


# ── tests: what they share lives in tests/harness, tests/hosts or conftest, never in another test module ─────

def imported_test_modules(path: Path) -> set[str]:
    """The test modules (tests/**/test_*.py) that `path` imports, however spelled: `from tests.test_x import`,
    `from tests.unit import test_x`, `import tests.integration.test_x`, `from .test_x import`, `from test_x import`
    (pytest puts a test's own folder on sys.path), or a "tests.….test_x" string (importorskip, import_module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            found.update(n.split(".")[-1] for n in names if TEST_MODULE.fullmatch(n))
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[-1] for a in node.names if TEST_MODULE.fullmatch(a.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if TEST_MODULE.fullmatch(node.value) and node.value.startswith("tests."):
                found.add(node.value.split(".")[-1])
    return found - {path.stem}


# ── the checks over a checkout: each returns its violations, one line each ──────────────────────────────────

def controller_cycles(repo: Path) -> list[str]:
    own, _ = controller_graph(repo)
    return [" <-> ".join(cycle) for cycle in cycles(own)]


def unplaced_controller_folders(repo: Path) -> list[str]:
    own, _ = controller_graph(repo)
    folders = {folder_of(module) for module in own}
    placed = set().union(*(members for _, members in CONTROLLER_LAYERS))
    return ([f"{f}: a folder with no place in CONTROLLER_LAYERS" for f in sorted(folders - placed)]
            + [f"{f}: in CONTROLLER_LAYERS, no longer a folder" for f in sorted(placed - folders)]
            + [f"{m}: in ENTRY_MODULES, no longer a module" for m in sorted(ENTRY_MODULES - set(own))])


def controller_layer_violations(repo: Path) -> list[str]:
    own, _ = controller_graph(repo)
    return layer_violations(own, CONTROLLER_LAYERS, ENTRY_MODULES)


def package_inits_that_import(repo: Path) -> list[str]:
    """A warm submit must not pay for a folder it only passes through (tests/unit/test_command_imports.py)."""
    own, other = controller_graph(repo)
    return [f"{m} imports {', '.join(sorted(own[m] | other[m] - {'__future__'}))}"
            for m in sorted(own) if m.endswith(".__init__") and own[m] | other[m] - {"__future__"}]


def heavy_imports_of_the_light_folders(repo: Path) -> list[str]:
    _, other = controller_graph(repo)
    allowed = STDLIB | {"remote_payload"} | LIGHT_THIRD_PARTY
    return [f"{m} imports {', '.join(sorted(names - allowed))}" for m, names in sorted(other.items())
            if folder_of(m) in STDLIB_ONLY and names - allowed]


def host_modules_imported_by_the_controller(repo: Path) -> dict[str, set[str]]:
    """Each controller module's imports of the host side (`remote_payload.X` as X)."""
    found: dict[str, set[str]] = {}
    for name, path in module_names(repo, "runner").items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("remote_payload."):
                found.setdefault(name, set()).add((node.module or "").split(".", 1)[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "remote_payload":
                found.setdefault(name, set()).update(a.name for a in node.names)
    return found


def controller_imports_of_host_internals(repo: Path) -> list[str]:
    """The spec, a tail and a status never load the host's engine client, systemd or supervision code: only the
    pure rules both sides share."""
    shared = HOST_LAYERS[0][1]
    return [f"{m} imports remote_payload.{', remote_payload.'.join(sorted(names - shared))}"
            for m, names in sorted(host_modules_imported_by_the_controller(repo).items()) if names - shared]


def host_cycles(repo: Path) -> list[str]:
    own, _ = host_graph(repo)
    return [" <-> ".join(cycle) for cycle in cycles(own)]


def unplaced_host_modules(repo: Path) -> list[str]:
    modules = [m for m in host_files(repo) if not is_payload(m)]
    found = [f"{m}: a module with no place in HOST_LAYERS" for m in modules if host_layer(m) is None]
    return found + [f"{m}: in HOST_LAYERS, no longer a module" for _, members in HOST_LAYERS for m in sorted(members)
                    if not m.endswith(".*") and m not in modules]


def upward_host_imports(repo: Path) -> list[str]:
    own, _ = host_graph(repo)
    return [f"{m} ({layer_name(m)}) imports {d} ({layer_name(d)})"
            for m, deps in sorted(own.items()) if not is_payload(m) and host_layer(m) is not None
            for d in sorted(deps) if not is_payload(d) and (host_layer(d) or 0) > (host_layer(m) or 0)]


def payload_imports_of_the_host_tree(repo: Path) -> list[str]:
    own, _ = host_graph(repo)
    return [f"{m} imports {', '.join(sorted(d for d in deps if is_payload(d)))}" for m, deps in sorted(own.items())
            if not is_payload(m) and any(is_payload(d) for d in deps)]


def try_except_import_pairs(repo: Path) -> list[str]:
    """One way to import a host module: package-relative. A fallback to a top-level import would load the same
    file a second time under another name (two Fail classes, two sets of constants) wherever it is taken."""
    pairs = []
    for module, path in host_files(repo).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id in (
                    "ImportError", "ModuleNotFoundError") for h in node.handlers):
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(node)):
                    pairs.append(f"{module}:{node.lineno}")
    return pairs


def host_imports_beyond_the_standard_library(repo: Path) -> list[str]:
    """A payload (bundled apart, per job) imports what it needs; the host tree nothing but the standard library."""
    _, other = host_graph(repo)
    return [f"{m} imports {', '.join(sorted(names - STDLIB))}" for m, names in sorted(other.items())
            if names - STDLIB and not is_payload(m)]


def host_callbacks_upward(repo: Path) -> list[str]:
    """A lower room that calls back up (submit handed the entry's preflight and start, the detached launch handed
    the entry's main) depends on the room above as surely as an import would: it gets what it needs itself."""
    return upward_callbacks({m: p.read_text() for m, p in host_files(repo).items() if not is_payload(m)})


def test_modules_imported_by_others(repo: Path) -> list[str]:
    """What tests (and benchmarks) share lives in tests/harness/, tests/hosts/ or tests/conftest.py: a test
    module imported by another drags its own fixtures and module-level state along, and hides what the importer
    depends on."""
    files = sorted((repo / "tests").rglob("*.py")) + sorted((repo / "bench").rglob("*.py"))
    return [f"{path.relative_to(repo)} imports {name}" for path in files for name in sorted(imported_test_modules(path))]


CHECKS: list[tuple[str, Callable[[Path], list[str]]]] = [
    ("an import cycle in the controller", controller_cycles),
    ("a controller folder without a layer", unplaced_controller_folders),
    ("a controller import beside or above the importer's layer", controller_layer_violations),
    ("a package __init__ that imports", package_inits_that_import),
    ("a light folder importing beyond the standard library and the host contract", heavy_imports_of_the_light_folders),
    ("the controller importing more of the host side than its shared rules", controller_imports_of_host_internals),
    ("an import cycle on the host side", host_cycles),
    ("a host module without a layer", unplaced_host_modules),
    ("a host import above the importer's layer", upward_host_imports),
    ("the host tree importing a payload", payload_imports_of_the_host_tree),
    ("a try/except import pair on the host side", try_except_import_pairs),
    ("the host side importing the controller or third-party code", host_imports_beyond_the_standard_library),
    ("a host function handed down to a lower layer", host_callbacks_upward),
    ("a test module imported by another", test_modules_imported_by_others),
]


def violations(repo: Path) -> list[str]:
    """Every violation in the checkout at `repo`, each as "what rule: where"."""
    return [f"{rule}: {found}" for rule, check in CHECKS for found in check(repo)]


def main(argv: list[str]) -> int:
    repo = Path(argv[0]) if argv else REPO
    found = violations(repo)
    for line in found:
        print(line)
    if found:
        print(f"import layers: {len(found)} violation(s); the rules: tests/lint/import_layers.py", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
