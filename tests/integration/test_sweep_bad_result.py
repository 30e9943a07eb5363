"""A sweep variant whose result is not a JSON object (a top-level list of rows, a string, garbage bytes) is
that variant's failure, with a message; the other variants still run and the combined result keeps them.
Real supervisor processes (tests/harness/supervisor_calls.Host), no service."""
from __future__ import annotations

import json

import pytest

from tests.harness.supervisor_calls import Host, sweep_spec

WRITER = r"""
import json, os, sys
kind = sys.argv[1]
body = {"object": json.dumps({"rows": [{"m": 1, "us": 2.5}]}), "list": json.dumps([{"m": 1, "us": 2.5}]),
        "string": json.dumps("done"), "garbage": "{not json"}[kind]
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    fh.write(body)
print("wrote", kind, flush=True)
"""


@pytest.fixture
def host(tmp_path):
    host = Host(tmp_path)
    yield host
    host.cleanup()


@pytest.mark.parametrize("bad", ["list", "string", "garbage"])
def test_a_bad_variant_result_fails_that_variant_only(host, tmp_path, bad):
    host.start("sweep-" + bad, sweep_spec(host, tmp_path, WRITER, ["object", bad, "object"]))
    final = host.wait("sweep-" + bad, "FAILED", "SUCCEEDED")
    assert final["state"] == "FAILED" and "2 succeeded, 1 failed" in final["message"], final
    combined = host.ok("result", "--job-id", "sweep-" + bad)["result"]
    assert combined["sweep"] == {"variants": 3, "succeeded": 2, "failed": 1, "skipped": 0}
    good, broken, later = combined["variants"]
    assert good["result"] == later["result"] == {"rows": [{"m": 1, "us": 2.5}]}
    assert broken["result"] is None and "variant-2.json" in broken["reason"], broken
    assert "supervisor error" not in final["message"]
    json.dumps(combined, allow_nan=False)
