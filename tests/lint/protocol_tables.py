"""docs/protocol.md's tables of verbs and error codes, made from the contract itself: a maintainer's tool, which
reads the code as tests/lint/import_layers.py does, not a part of runner.

The host's verbs and wire error codes are data in remote_payload/contract.py (VERBS, ERRORS); the controller's
own codes and exit statuses are the classes of runner/errors.py (what `--json` errors and MCP carry).
tests/unit/test_protocol_tables.py checks that the committed document holds exactly these tables, so the
document cannot fall behind the code.

    python tests/lint/protocol_tables.py            # print the tables
    python tests/lint/protocol_tables.py --write    # rewrite them in docs/protocol.md
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script: the repository's own runner and remote_payload

from remote_payload import contract  # noqa: E402
from runner import errors  # noqa: E402

DOC = REPO / "docs" / "protocol.md"
BEGIN = "<!-- generated: {} (python tests/lint/protocol_tables.py --write) -->"
END = "<!-- end generated: {} -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def verbs_table() -> str:
    rows = ["| verb | arguments (besides `--root ROOT`) | stdin | does |", "|---|---|---|---|"]
    for verb, (argv, stdin, does) in contract.VERBS.items():
        rows.append(f"| `{verb}` | `{_cell(argv)}` | {stdin} | {_cell(does)} |")
    return "\n".join(rows)


def wire_errors_table() -> str:
    rows = ["| code | means |", "|---|---|"]
    for code, means in contract.ERRORS.items():
        rows.append(f"| `{code}` | {_cell(means)} |")
    return "\n".join(rows)


def _classes(base: type[errors.RunnerError]) -> list[type[errors.RunnerError]]:
    found: list[type[errors.RunnerError]] = []
    for cls in base.__subclasses__():
        found.append(cls)
        found.extend(_classes(cls))
    return found


def controller_codes_table() -> str:
    rows = ["| code | exit | class | what |", "|---|---|---|---|"]
    seen: set[str] = set()
    classes: list[type[errors.RunnerError]] = [errors.RunnerError, *_classes(errors.RunnerError)]
    for cls in classes:
        if cls.code in seen:
            continue
        seen.add(cls.code)
        what = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        rows.append(f"| `{cls.code}` | {cls.exit_code} | `{cls.__name__}` | {_cell(what)} |")
    rows.append(f"| `{errors.CODE_USAGE}` | {errors.EXIT_USAGE} | (click) | an unknown option, a missing argument |")
    rows.append(f"| `{errors.Interrupted.code}` | {errors.Interrupted.exit_code} | `Interrupted` | "
                f"{_cell(' '.join((errors.Interrupted.__doc__ or '').split()))} |")
    return "\n".join(rows)


TABLES = {"verbs": verbs_table, "wire-errors": wire_errors_table, "controller-codes": controller_codes_table}


def block(name: str) -> str:
    return "\n".join([BEGIN.format(name), TABLES[name](), END.format(name)])


def rewritten(text: str) -> str:
    """text with every generated block replaced by its current content; a missing block is an error."""
    for name in TABLES:
        begin, end = BEGIN.format(name), END.format(name)
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise ValueError(f"docs/protocol.md has no generated block {name!r} ({begin} … {end})")
        text = text[:start] + block(name) + text[stop + len(end):]
    return text


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        DOC.write_text(rewritten(DOC.read_text()))
        return 0
    print("\n\n".join(block(name) for name in TABLES))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
