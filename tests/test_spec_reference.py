"""The spec reference and `runner schema` are generated from the models and cannot fall behind them."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runner.spec_reference import json_schema, markdown, missing_descriptions

REPO = Path(__file__).resolve().parents[1]


def test_every_key_of_the_schema_is_described():
    assert missing_descriptions() == []


def test_the_committed_reference_is_the_generated_one():
    assert (REPO / "docs" / "spec-reference.md").read_text() == markdown(), \
        "run: python -m runner.spec_reference > docs/spec-reference.md"


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
