"""docs/protocol.md's verb and error-code tables are made from the contract, and the contract is what the code
does: every verb the host dispatches is in contract.VERBS with the flags its parser takes, every code the host
raises is in contract.ERRORS."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from remote_payload import commands, contract
from tests.lint import protocol_tables

REPO = Path(__file__).resolve().parents[2]
HOST_CODE = REPO / "remote_payload"


def test_the_committed_tables_are_the_generated_ones():
    text = protocol_tables.DOC.read_text()
    assert protocol_tables.rewritten(text) == text, "run: python tests/lint/protocol_tables.py --write"


def test_a_missing_block_is_an_error_not_a_silent_pass():
    with pytest.raises(ValueError, match="no generated block"):
        protocol_tables.rewritten("no markers here")


def test_the_verbs_the_host_dispatches_are_the_contracts():
    public = {verb for verb in commands.COMMANDS if not verb.startswith("_")}
    assert public == set(contract.VERBS)


@pytest.mark.parametrize("verb", sorted(contract.VERBS))
def test_each_verbs_flags_are_the_ones_its_parser_takes(verb):
    documented = set(re.findall(r"--[a-z][a-z-]*", contract.VERBS[verb][0])) | {"--root"}
    parser = commands.build_parser(verb)
    taken = set(parser.options)
    assert documented == taken


def _raised_codes(root: Path = HOST_CODE) -> set[str]:
    """Every literal code the host side raises: Fail("code", …) and subclasses' super().__init__("code", …)."""
    codes = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name in ("Fail", "__init__") and isinstance(node.args[0].value, str):
                    codes.add(node.args[0].value)
    return codes


def test_every_code_the_host_raises_is_in_the_contract():
    raised = _raised_codes()
    assert raised, "the scan found no Fail(...) at all: it no longer sees the host's errors"
    assert raised - set(contract.ERRORS) == set()


def test_the_scan_sees_a_new_code(tmp_path):
    (tmp_path / "new.py").write_text('raise Fail("made-up-code", "x")\n'
                                     'class E(Fail):\n    def __init__(self):\n        super().__init__("other-code", "y")\n')
    assert _raised_codes(tmp_path) == {"made-up-code", "other-code"}
