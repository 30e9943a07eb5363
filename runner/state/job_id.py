"""Job ids: chosen by the controller, readable in `runner list`, and safe as a host directory name and argv
word (the rule itself is contract.job_id_problem, the same one the supervisor applies)."""
from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from typing import Any

from remote_payload.contract import JOB_ID_RE, job_id_problem

from ..errors import SpecError

__all__ = ["JOB_ID_RE", "check_job_id", "job_id_for"]

_SLUG_DROP_RE = re.compile(r"[^A-Za-z0-9._]+")  # "-" too, so runs of separators collapse
_RAND_RE = re.compile(r"[0-9a-f]{6}")


def job_id_for(name: str, now: datetime, rand: str) -> str:
    """`<slug of name>-YYYYmmdd-HHMMSS-<rand>`: readable in `runner list`, unique by time and 6 random hex."""
    if not _RAND_RE.fullmatch(rand):
        raise ValueError(f"rand must be 6 lowercase hex digits; got {rand!r}")
    return check_job_id(f"{_slug(name)}-{now.strftime('%Y%m%d-%H%M%S')}-{rand}")


def _slug(name: str) -> str:
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    slug = _SLUG_DROP_RE.sub("-", ascii_name).strip("-.")[:40].rstrip("-.")
    return slug or "job"


def check_job_id(job_id: Any) -> str:
    """Job ids become directory names and argv words on the host: [A-Za-z0-9._-], not `.`/`..`, no leading `-`."""
    problem = job_id_problem(job_id)
    if problem is not None:
        raise SpecError(f"bad job id: {problem}")
    return job_id
