"""The submit-time decision as the controller's errors: remote_payload/admission.py's verdict, raised.

The host's `submit` applies the same `admit` and starts or refuses in one call; the controller applies it
itself only for `submit --dry-run` (and the fleet's preflight), so the two can never say different things.
The supervisor decides the stop again on the host when the job holds its locks (time passes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from remote_payload.admission import admit

from ..errors import HostBusy, PreflightError


@dataclass
class Decision:
    stop_service: bool
    notes: list[str] = field(default_factory=list)


def decide(wire: dict, report: dict, *, queue: bool = False) -> Decision:
    """Raise PreflightError/HostBusy when the job cannot run; else say whether the service will be stopped."""
    verdict = admit(wire, report, queue)
    if "refuse" in verdict:
        raise refusal_error(verdict["refuse"])
    return Decision(verdict["stop_service"], list(verdict["notes"]))


def refusal_error(refusal: dict) -> HostBusy | PreflightError:
    """A verdict's refusal as the error the CLI renders: busy is exit 5, anything else exit 4."""
    if refusal["code"] == "busy":
        return HostBusy(f"host busy: {refusal['message']}", hint=refusal.get("hint", ""))
    return PreflightError(refusal["message"], hint=refusal.get("hint", ""))
