"""GPUs through nvidia-smi: the cards a spec names (by index or UUID) with their memory, the compute processes on them,
and which cards cannot give a job's need now or ever (contract.memory_verdict).
"""
from __future__ import annotations

from ..contract import memory_verdict
from .answer import Fail
from .parsers import parse_apps_csv, parse_gpu_csv
from .processes import run_command

SMI_TIMEOUT_S = 60.0         # one nvidia-smi call


def select_gpus(gpus: list, devices: list) -> list:
    """The spec's devices, by index or UUID, in spec order; a device the host lacks is a clear error."""
    by_key = {g["index"]: g for g in gpus}
    by_key.update({g["uuid"]: g for g in gpus})
    missing = [d for d in devices if d not in by_key]
    if missing:
        have = ", ".join("%s (%s)" % (g["index"], g["uuid"]) for g in gpus) or "no GPUs"
        raise Fail("bad-spec", "GPU %s not found on this host; it has: %s" % (", ".join(missing), have))
    return [by_key[d] for d in devices]


def short_gpus(gpus: list, required_mib: int) -> list:
    """GPUs that cannot give required_mib now (contract.memory_verdict: unknown free memory counts as short)."""
    return [g for g in gpus if memory_verdict(g, required_mib) != "ok"]


def refuse_too_small(gpus: list, required_mib: int) -> None:
    """A card whose total is below the need: no stop and no wait can help, so say so at once."""
    small = [g for g in gpus if memory_verdict(g, required_mib) == "too-small"]
    if small:
        raise Fail("bad-spec", "; ".join("GPU %s has %s MiB in total, less than the %d MiB the job needs" % (
            g["index"], g["total_mib"], required_mib) for g in small) + ": stopping the service cannot free that")


def describe_apps(apps: list) -> str:
    if not apps:
        return "no compute process is listed by nvidia-smi"
    return ", ".join("pid %d (%s MiB)" % (a["pid"], a["used_mib"] if a["used_mib"] is not None else "?")
                     for a in apps)


GPU_QUERY = ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def nvidia_smi(args: list) -> str:
    import shutil  # only a GPU query needs it: the read-only verbs never load it

    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise Fail("internal", "nvidia-smi is not on PATH, but the job asks for GPUs")
    done = run_command([exe] + args, timeout=SMI_TIMEOUT_S)
    if done.returncode != 0:
        raise Fail("internal", "nvidia-smi failed (exit %d): %s" % (
            done.returncode, done.stderr.decode("utf-8", "replace").strip()[-300:]))
    return done.stdout.decode("utf-8", "replace")


def query_gpus(devices: list) -> list:
    return select_gpus(parse_gpu_csv(nvidia_smi(GPU_QUERY)), devices)


def query_apps() -> list:
    return parse_apps_csv(nvidia_smi(APPS_QUERY))
