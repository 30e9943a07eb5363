"""The spec reference and `runner schema` are generated from the models and cannot fall behind them."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runner.spec.spec_reference import json_schema
from tests.lint.spec_reference import markdown, missing_descriptions

REPO = Path(__file__).resolve().parents[2]


def test_every_key_of_the_schema_is_described():
    assert missing_descriptions() == []


def test_the_committed_reference_is_the_generated_one():
    assert (REPO / "docs" / "spec-reference.md").read_text() == markdown(), \
        "run: python tests/lint/spec_reference.py > docs/spec-reference.md"


def test_runner_schema_validates_the_shipped_jobs_and_refuses_a_typo():
    jsonschema = pytest.importorskip("jsonschema")
    done = subprocess.run([sys.executable, "-m", "runner", "schema"], capture_output=True, cwd=REPO, check=True)
    schema = json.loads(done.stdout)
    assert schema == json.loads(json.dumps(json_schema()))
    for job in sorted((REPO / "jobs").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(job.read_text()), schema)
    bad = yaml.safe_load((REPO / "jobs" / "demo.yaml").read_text())
    bad["limits"]["max_runtim"] = "5m"
    with pytest.raises(jsonschema.ValidationError, match="max_runtim"):
        jsonschema.validate(bad, schema)


def _section_model(annotation):
    """The section model behind a field's annotation (`RolloutSpec | None` too), or None for a plain value."""
    from pydantic import BaseModel

    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def every_key(model, prefix=""):
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path
        section = _section_model(field.annotation)
        if section is not None:
            yield from every_key(section, path + ".")


def test_every_nested_key_has_a_row_and_a_description():
    from runner.spec.spec import JobSpec

    rows = {line.split("|")[1].strip().strip("`") for line in markdown().splitlines() if line.startswith("| `")}
    keys = list(every_key(JobSpec))
    assert {"rollout.max_unavailable", "rollout.stop_on_failure", "sweep.matrix", "slurm.partition"} <= set(keys)
    nested = [k for k in keys if "." in k]
    assert [k for k in nested if k not in rows] == []
    described = {line.split("|")[1].strip().strip("`") for line in markdown().splitlines()
                 if line.startswith("| `") and line.rstrip().rstrip("|").rsplit("|", 1)[1].strip()}
    assert [k for k in keys if k not in described] == []


def test_the_reference_says_how_to_write_null_in_set():
    assert "--set KEY=null" in markdown()
