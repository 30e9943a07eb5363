"""A payload script's local import closure: the script plus every module it imports, directly or through
another, that resolves inside the script's own directory (sys.path[0] when it runs as `python script.py`).

Read from the source (AST), nothing is imported. Every import statement counts, wherever it is (inside a
function, a try/except pair); a name that resolves to no file in the directory (the standard library, an
installed package, a module the host provides) is not bundled. Relative imports resolve against the
importing file's own folder. A file that does not parse with the controller's Python travels, but its own
imports are not followed (the host's start check compiles the script with payload.python). Not found: imports by computed name (`importlib.import_module(x)`) and data
files; put them in the script's directory and import them by name, or ship them another way.
"""
from __future__ import annotations

import ast
from pathlib import Path


def local_closure(script: Path) -> dict[str, bytes]:
    """{name relative to the script's directory (`/`-separated): content} for the script and its closure."""
    real = script.resolve()  # a link to a file of another name: its imports are the target's, beside the target
    base = real.parent
    found = {script.name: real.read_bytes()}
    todo = [real]
    while todo:
        path = todo.pop()
        for module in _local_imports(path, base):
            name = module.relative_to(base).as_posix()
            if name not in found:
                found[name] = module.read_bytes()
                todo.append(module)
    return found


def _local_imports(path: Path, base: Path) -> list[Path]:
    """The files inside `base` that the imports of `path` load (package `__init__.py` files included)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError:  # payload.python may be newer than ours: the file travels, its own imports are not seen
        return []
    files: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                files += _resolve(base, alias.name.split("."), base)
        elif isinstance(node, ast.ImportFrom):
            start = base if not node.level else _parent(path, node.level)
            parts = node.module.split(".") if node.module else []
            files += _resolve(start, parts, base)
            package = _package_dir(start, parts)
            if package is not None:  # `from pkg import name`: name may be a submodule
                for alias in node.names:
                    files += _resolve(package, [alias.name], base)
    return files


def _parent(path: Path, level: int) -> Path:
    folder = path.parent
    for _ in range(level - 1):
        folder = folder.parent
    return folder


def _resolve(start: Path, parts: list[str], base: Path) -> list[Path]:
    """The files `import a.b.c` loads from `start`: each package's __init__.py, then the module; a part that
    is neither a folder nor a module ends the walk (the rest is no local file)."""
    files: list[Path] = []
    folder = start
    for part in parts:
        if part == "*":
            break
        module, package = folder / f"{part}.py", folder / part
        if (package / "__init__.py").is_file():
            files.append(package / "__init__.py")
            folder = package
        elif module.is_file():
            files.append(module)
            break
        elif package.is_dir():  # a namespace package: no file of its own
            folder = package
        else:
            break
    return [f for f in files if _inside(f, base)]


def _package_dir(start: Path, parts: list[str]) -> Path | None:
    folder = start.joinpath(*parts)
    return folder if folder.is_dir() else None


def _inside(path: Path, base: Path) -> bool:
    """In the script's directory, also once links are followed (a link out of it would upload its target)."""
    try:
        path.resolve().relative_to(base)
        path.relative_to(base)
        return True
    except ValueError:
        return False
