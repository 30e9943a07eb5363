"""docs/spec-reference.md, written from the job spec's JSON Schema (runner/spec/spec_reference.py: the models and
what each key is for): a maintainer's tool, not a part of runner. tests/unit/test_spec_reference.py checks that
the committed document is what it writes.

    python tests/lint/spec_reference.py > docs/spec-reference.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's own runner

from runner.spec.spec import JobSpec  # noqa: E402
from runner.spec.spec_reference import DESCRIPTIONS, json_schema, sections  # noqa: E402


def missing_descriptions() -> list[str]:
    """The keys of the schema that DESCRIPTIONS does not describe."""
    schema = JobSpec.model_json_schema()
    return [f"{path}.{key}" if path else key for path, section in sections(schema) for key in section["properties"]
            if (f"{path}.{key}" if path else key) not in DESCRIPTIONS]


def markdown() -> str:
    """docs/spec-reference.md: one table row per key (type, default, allowed values, what it is for)."""
    schema = json_schema()
    lines = ["# Job spec reference", "",
             "Generated from the schema by `python tests/lint/spec_reference.py > docs/spec-reference.md` "
             "(tests/unit/test_spec_reference.py checks it is current). `runner schema` prints the JSON Schema "
             "for editors: put `# yaml-language-server: $schema=./job-spec.schema.json` at the top of a "
             "job file after `runner schema > job-spec.schema.json`.", "",
             "Durations are seconds or text like `30s`, `5m`, `1h30m`, `2d`. Every key, nested ones included, is "
             "listed; every key not listed is an error.", "",
             "`submit --set KEY=VALUE` sets one key; VALUE is YAML (`5`, `true`, `[1, 2]`, `30m`). An empty value "
             "is refused: write `--set KEY=null` for null (an argument set to null is left out of the script's "
             "argv), `--set \"KEY=''\"` for an empty string.", "",
             "| key | type | default | what it is for |", "|---|---|---|---|"]
    for path, section in sections(schema):
        for key, prop in section["properties"].items():
            name = f"{path}.{key}" if path else key
            needed = "**required**" if key in section.get("required", []) else _default(prop)
            lines.append(f"| `{name}` | {_type(prop)} | {needed} | {prop.get('description', '')} |")
    return "\n".join(lines) + "\n"


def _type(prop: dict) -> str:
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        return " or ".join(dict.fromkeys(_type(p) for p in prop["anyOf"] if p.get("type") != "null"))
    if "$ref" in prop or "allOf" in prop:
        return "section"
    kind = prop.get("type", "any")
    if kind == "string" and "pattern" in prop:
        return "duration"
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object":
        return "mapping"
    return " or ".join(kind) if isinstance(kind, list) else kind


def _default(prop: dict) -> str:
    if "default" not in prop:
        return ""
    return f"`{json.dumps(prop['default'])}`"


if __name__ == "__main__":
    print(markdown(), end="")
