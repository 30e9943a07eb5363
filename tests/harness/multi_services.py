"""Two services on one host, each on its own GPUs (`services:` with `gpus:`), on the confined real systemd +
sshd test host with the nvidia-smi stand-in showing 8 GPUs: `dummy-infer.service` on GPUs 0-1 and
`second-infer.service` on GPUs 2-3. Shared by the tests of several services on one host."""
from __future__ import annotations

import yaml

from tests.cli_helpers import write_job
from tests.harness.systemd_jobs import HOLD, target_for
from tests.hosts._proc import free_port, wait_until

SECOND = "second-infer.service"


def two_services(host) -> list:
    """8 GPUs; the default unit declared on GPUs 0-1, a second dummy unit on GPUs 2-3 (its own port)."""
    host.set_gpu(count=8)
    port = free_port()
    host.install_unit(SECOND, port=port, hold_mib=100, ready_delay=0.5)
    host.systemctl("start", SECOND).check_returncode()
    second_url = f"http://127.0.0.1:{port}/health"
    wait_until(lambda: host.ssh(["curl", "-sf", second_url]).returncode == 0, timeout=20, what=f"{SECOND} healthy")
    return [
        {"manager": "systemd", "unit": host.unit, "stop": "always", "health_url": host.health_url,
         "health_timeout": "30s", "gpus": [0, 1]},
        {"manager": "systemd", "unit": SECOND, "stop": "always", "health_url": second_url, "health_timeout": "30s",
         "gpus": [2, 3]},
    ]


def multi_job(path, host, services: list, devices: list, command=None, max_runtime="2m"):
    """A job file with a `services:` list instead of one `service:` section."""
    write_job(path, target_for(host), command=command or ["python3", HOLD, "100", "1"], max_runtime=max_runtime,
              gpu={"devices": devices, "min_free_mib": 1000, "drain_timeout": "20s"})
    spec = yaml.safe_load(path.read_text())
    del spec["service"]
    spec["services"] = services
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
