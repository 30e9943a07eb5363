"""A payload script's local import closure: the script plus every module it imports, directly or through
another, that resolves inside the script's own directory (sys.path[0] when it runs as `python script.py`).

Read from the source, nothing is imported. Every import statement counts, wherever it is (inside a function, a
try/except pair, after `if x:` or `;`): each `import` word is found in the file's bytes and the statement around
it parsed by itself (ast), so the cost is a scan of the bytes, not a syntax tree of the whole file, and a file
that does not parse with the controller's Python (a newer payload.python) has its imports followed too. A statement written inside a string may count as well:
the module it names travels if it is a file of the directory. A name that resolves to no file there (the
standard library, an installed package) is not bundled; relative imports resolve from the importing file's
folder. Not found: imports by computed name (`importlib.import_module(x)`): ship those with payload.files.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

# [level, module parts, imported names] of one import statement: `import a.b` is [0, ["a", "b"], []],
# `from ..c import d, e` [2, ["c"], ["d", "e"]].
ImportRef = list
WORD = b"import"
WORD_RE = re.compile(WORD)
IDENTIFIER = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def local_closure(script: Path, imports_of: Callable[[Path], list[ImportRef]]) -> dict[str, Path]:
    """{name relative to the script's directory (`/`-separated): path} of the script and its closure.
    imports_of(path): the import statements of a file (imports_in of its bytes, or as recorded for them)."""
    real = script.resolve()  # a link to a file of another name: its imports are the target's, beside the target
    base = real.parent
    found = {script.name: real}
    todo = [real]
    while todo:
        path = todo.pop()
        for module in _local_imports(path, base, imports_of(path)):
            name = module.relative_to(base).as_posix()
            if name not in found:
                found[name] = module
                todo.append(module)
    return found


def imports_in(source: bytes) -> list[ImportRef]:
    """Each import statement of a file's source, in order."""
    found: list[ImportRef] = []
    for match in WORD_RE.finditer(source):
        statement = _statement_at(source, match.start())
        if statement is not None:
            found += _parsed(statement)
    return found


def _statement_at(source: bytes, at: int) -> list[bytes] | None:
    """The texts that may be the statement whose `import` keyword is at `at` (more than one when a `)` may
    close its parenthesised names), or None when the word is not that keyword at a statement's start."""
    end_of_word = at + len(WORD)
    if (at and source[at - 1] in IDENTIFIER) or (end_of_word < len(source) and source[end_of_word] in IDENTIFIER):
        return None
    line = _line_start(source, at)
    head = source[line:at]
    cut = max(head.rfind(b";"), head.rfind(b":")) + 1  # `if x: import y`, `a = 1; import y`
    start = line + cut
    words = head[cut:].replace(b"\\\n", b" ").split()
    if words and not (words[0] == b"from" or words[0].startswith(b"from.")):
        return None
    rest = source[end_of_word:end_of_word + 4096].lstrip(b" \t\\\r\n")
    if rest.startswith(b"("):  # `from a import (b, c)`: until a `)` (one in a comment inside: the next one)
        ends: list[bytes] = []
        close = source.find(b")", end_of_word)
        while close >= 0 and len(ends) < 8:
            ends.append(source[start:close + 1])
            close = source.find(b")", close + 1)
        return ends
    end = _line_end(source, end_of_word)
    text = source[start:end]
    for mark in (b";", b"#"):
        text = text.split(mark, 1)[0]
    return [text]


def _line_start(source: bytes, at: int) -> int:
    """Where the logical line holding `at` starts (before any backslash continuation)."""
    start = source.rfind(b"\n", 0, at) + 1
    while start and _continued(source, start - 1):
        start = source.rfind(b"\n", 0, start - 1) + 1
    return start


def _line_end(source: bytes, at: int) -> int:
    end = source.find(b"\n", at)
    while end >= 0 and _continued(source, end):
        end = source.find(b"\n", end + 1)
    return len(source) if end < 0 else end


def _continued(source: bytes, newline: int) -> bool:
    """Whether the line ending at the newline at `newline` ends in a backslash (its next line continues it)."""
    before = newline - 1 - (source[newline - 1:newline] == b"\r")
    return before >= 0 and source[before:before + 1] == b"\\"


def _parsed(candidates: list[bytes]) -> list[ImportRef]:
    """The import statement of the first candidate that parses as one; [] when none does."""
    for text in candidates:
        try:
            tree = ast.parse(text.replace(b"\\\r\n", b" ").replace(b"\\\n", b" ").strip())
        except (SyntaxError, ValueError):
            continue
        if len(tree.body) != 1:
            continue
        node = tree.body[0]
        if isinstance(node, ast.Import):
            return [[0, alias.name.split("."), []] for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            return [[node.level, node.module.split(".") if node.module else [], [a.name for a in node.names]]]
    return []


def _local_imports(path: Path, base: Path, refs: list[ImportRef]) -> list[Path]:
    """The files inside `base` that the imports of `path` load (package `__init__.py` files included)."""
    files: list[Path] = []
    for level, parts, names in refs:
        start = base if not level else _parent(path, level)
        files += _resolve(start, parts, base)
        package = start.joinpath(*parts)
        if package.is_dir():  # `from pkg import name`: name may be a submodule
            for name in names:
                files += _resolve(package, [name], base)
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


def _inside(path: Path, base: Path) -> bool:
    """In the script's directory, also once links are followed (a link out of it would upload its target)."""
    try:
        path.resolve().relative_to(base)
        path.relative_to(base)
        return True
    except ValueError:
        return False
