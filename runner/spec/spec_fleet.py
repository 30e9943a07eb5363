"""The spec's fleet part: `host.address` as one host or a list of them, and the `rollout` section.

    host: {address: [h200-a, h200-b, h200-c], …}   the rest of host, service, gpu apply to each host
    rollout: {max_unavailable: 1, stop_on_failure: false, forks: 16}

A list is a fleet: one run, one job per host (runner/fleet/fleet.py drives it); a single string is one job.
The same host twice would queue a job behind itself on one service lock, so a list with a duplicate is
refused (exit 2 naming host.address) before any host is contacted.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ..state.fleet_store import DEFAULT_FORKS
from .spec_fields import _check_address, short

MAX_HOSTS = 256


def _check_addresses(value: Any) -> Any:
    """One address, or a list of them: not empty, not too long, each a valid address, none twice (host
    names compare case-blind)."""
    if not isinstance(value, list):
        return _check_address(value)
    if not value:
        raise ValueError("an empty list of hosts; give one address or a list of them")
    if len(value) > MAX_HOSTS:
        raise ValueError(f"{len(value)} hosts; at most {MAX_HOSTS} in one run")
    checked = []
    for index, address in enumerate(value):
        try:
            checked.append(_check_address(address))
        except ValueError as exc:
            raise ValueError(f"host {index + 1}: {exc}") from None
    lowered = [address.lower() for address in checked]
    twice = [address for index, address in enumerate(checked) if address.lower() in lowered[:index]]
    if twice:
        raise ValueError(f"hosts listed twice: {', '.join(short(a) for a in dict.fromkeys(twice))}")
    return checked


Addresses = Annotated[str | list[str], BeforeValidator(_check_addresses)]


class RolloutSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_unavailable: Annotated[int, Field(ge=1, le=MAX_HOSTS)] = 1
    stop_on_failure: bool = False
    forks: Annotated[int, Field(ge=1, le=MAX_HOSTS)] = DEFAULT_FORKS
