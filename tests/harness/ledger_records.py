"""A job's records on a real ROOT layout (spec.json, status.json) and the host ledger's stop of its unit, written
directly: what a restorer reads when it must decide whom to believe."""
from __future__ import annotations

import json

from remote_payload.supervision import ledger
from remote_payload.supervision.files import JobPaths
from remote_payload.supervision.record import initial_status
from remote_payload.supervision.spec import check_spec

UNIT = "dummy-infer.service"


def job(tmp_path, job_id="j1"):
    paths = JobPaths(str(tmp_path), job_id)
    (tmp_path / "jobs" / job_id).mkdir(parents=True)
    spec = check_spec({"service": {"manager": "systemd", "unit": UNIT, "health_url": "http://127.0.0.1:9/health",
                                   "health_timeout": 30},
                       "payload": {"command": ["/bin/true"]}}, job_id)
    (tmp_path / "jobs" / job_id / "spec.json").write_text(json.dumps(spec))
    status = initial_status(spec)
    (tmp_path / "jobs" / job_id / "status.json").write_text(json.dumps(status))
    return paths, spec, status


def stopped_by(tmp_path, paths, spec, **payload):
    service = dict(spec["service"], was="active")
    ledger.record_stop(str(tmp_path), UNIT, paths.job_id, service, ["0"])
    if payload:
        ledger.note(str(tmp_path), UNIT, paths.job_id, payload=ledger.ident(payload))
