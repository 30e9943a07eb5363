"""A host's preflight report, shaped like the supervisor's `preflight` answer, for the submit-time decision."""
from __future__ import annotations


def report(free=143156, total=143771, active="active", locks=(), apps=()):
    return {"gpus": [{"index": 0, "uuid": "GPU-aaaa", "total_mib": total, "used_mib": total - free, "free_mib": free}],
            "apps": list(apps), "service": {"active_state": active}, "locks": list(locks), "nvidia_smi": True}
