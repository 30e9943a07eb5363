"""Re-capture the Slurm outputs in this directory from a real test cluster (root; tests/hosts/install_slurm.sh).

    python -m tests.data.slurm.capture

Provokes each job state on a 2-node cluster with accounting and saves, at chosen moments, exactly what the
parsers in remote_payload/slurm/states.py read: `squeue -h -o FORMAT` / `sacct -n -P -o FIELDS` (and the
`--json` forms of both, for reference). Takes ~2 minutes: a time limit cannot be shorter than 1 minute and
Slurm checks limits every 30 s.
"""

from __future__ import annotations

import time
from pathlib import Path

from remote_payload.slurm.states import SACCT_FIELDS, SQUEUE_FORMAT
from tests.hosts._proc import wait_until
from tests.hosts.slurm_cluster import start_slurm_cluster

HERE = Path(__file__).resolve().parent


def save(cluster, name: str, jobs: list[str]) -> None:
    ids = ",".join(jobs)
    outputs = {
        f"{name}.squeue.txt": ["squeue", "-h", "-t", "all", "-j", ids, "-o", SQUEUE_FORMAT],
        f"{name}.squeue.json": ["squeue", "--json"],
        f"{name}.sacct.txt": ["sacct", "-n", "-P", "-X", "-j", ids, "-o", SACCT_FIELDS],
        f"{name}.sacct.json": ["sacct", "--json", "-j", ids],
    }
    for filename, argv in outputs.items():
        (HERE / filename).write_text(cluster.run(argv, check=True).stdout)


def sacct_states(cluster, jobs: list[str]) -> dict[str, str]:
    text = cluster.run(["sacct", "-n", "-P", "-X", "-j", ",".join(jobs), "-o", "JobID,State"]).stdout
    return dict(line.split("|", 1) for line in text.splitlines() if line)


def main() -> None:
    cluster = start_slurm_cluster(nodes=2)
    try:
        capture(cluster)
    finally:
        cluster.stop()


def capture(cluster) -> None:
    sub = cluster.sbatch
    timeout = sub("-w", "node1", "-J", "timeout", "--time=1", "-o", "/dev/null", "--wrap", "sleep 300")
    running = sub("-w", "node1", "-J", "running", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 300")
    # --no-requeue as runner submits: else Slurm requeues it after the node failure (PENDING, BeginTime)
    node_fail = sub("-w", "node2", "-J", "node-fail", "--no-requeue", "-o", "/dev/null", "--wrap", "sleep 300")
    requeued = sub("-w", "node2", "-J", "requeued", "--requeue", "-o", "/dev/null", "--wrap", "sleep 300")
    running_jobs = [timeout, running, node_fail, requeued]
    for job in running_jobs:
        cluster.wait_job_state(job, {"RUNNING"})
    resources = sub("-w", "node1", "-J", "resources", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
    priority = sub("-w", "node1", "-J", "priority", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
    pending = [resources, priority]
    # "Priority" is what a job behind another shows until the backfill scheduler looks at it (~1-2 s here)
    wait_until(lambda: cluster.job_field(priority, "Reason") == "Priority", 5, "reason Priority", 0.05)
    save(cluster, "pending-priority", pending)
    wait_until(lambda: cluster.job_field(resources, "Reason") == "Resources", 30, "reason Resources", 0.2)
    save(cluster, "pending-resources", pending)
    wait_until(lambda: {sacct_states(cluster, running_jobs).get(job) for job in running_jobs} == {"RUNNING"},
               30, "sacct to show the running jobs", 0.2)
    save(cluster, "running", running_jobs)

    cluster.run(["scontrol", "requeue", requeued], check=True)
    time.sleep(1)
    save(cluster, "requeued", [requeued])
    cluster.run(["scancel", requeued, priority], check=True)  # priority: cancelled while PENDING
    cluster.run(["scancel", running], check=True)             # running: cancelled while RUNNING
    # a dead slurmd stops answering pings: after SlurmdTimeout (30 s) node2 is DOWN and its job NODE_FAIL
    # (its slurmstepd lives on; cluster.stop() kills it)
    cluster.daemons["slurmd-node2"].kill()
    succeeded = sub("-w", "node1", "-J", "succeeded", "-o", "/dev/null", "--wrap", "true")
    failed = sub("-w", "node1", "-J", "failed", "-o", "/dev/null", "--wrap", "exit 3")
    everything = [timeout, running, resources, priority, node_fail, requeued, succeeded, failed]
    final = {"TIMEOUT", "COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"}
    wait_until(lambda: all(state.split()[0] in final for state in sacct_states(cluster, everything).values())
               and len(sacct_states(cluster, everything)) == len(everything), 200, "every job to end", 1.0)
    time.sleep(2)  # sacct is eventually consistent
    save(cluster, "ended", everything)
    forgot = cluster.run(["squeue", "-h", "-t", "all", "-j", "999999", "-o", SQUEUE_FORMAT])
    (HERE / "forgot.squeue.stderr").write_text(f"# exit {forgot.returncode}\n{forgot.stderr}")
    rejected = cluster.run(["sbatch", "--parsable", "--gres=gpu:3", "--wrap", "true"])
    (HERE / "rejected-gpus.sbatch.stderr").write_text(f"# exit {rejected.returncode}\n{rejected.stderr}")
    rejected = cluster.run(["sbatch", "--parsable", "-p", "nosuch", "--wrap", "true"])
    (HERE / "rejected-partition.sbatch.stderr").write_text(f"# exit {rejected.returncode}\n{rejected.stderr}")


if __name__ == "__main__":
    main()
