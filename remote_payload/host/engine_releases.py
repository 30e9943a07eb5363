"""The engine releases runner frees GPU memory through, one row per release range, chosen by the version the engine
reports. Adding a release is a row here and its stand-in (tests/hosts/standin_releases.py), not a branch in the code.

SGLang rows: `load` the route that counts its requests per DP rank; `modes` the pause modes it can release after,
the first its default; `idle` its release's assertion: "strict" (the waiting queue must be empty too, so a retract
pause with requests in flight kills the server) or "paused" (after a retract pause only the running batch must be
empty). vLLM rows: `quiesce` the POSTs that put it to sleep once the requests in flight have finished, `wake` the
POSTs that bring it back.
"""
from __future__ import annotations

SGLANG = (
    {"first": "0.5.17", "last": "0.5.20", "load": "/get_load", "modes": ("drain", "abort"), "idle": "strict"},
    {"first": "0.5.21", "last": "0.5.23", "load": "/v1/loads", "modes": ("retract", "drain", "abort"),
     "idle": "paused"},
)
VLLM = (
    # /pause lets the requests in flight finish and holds arrivals; the sleep after it has nothing to abort
    {"first": "0.12", "last": "0.16", "quiesce": ("/pause?wait_for_inflight_requests=true", "/sleep?level=1"),
     "wake": ("/wake_up", "/resume")},
    # /sleep's mode=wait: the engine steps until the requests in flight finish, queues arrivals, then sleeps
    # (without a mode it aborts them)
    {"first": "0.17", "last": "0.34", "quiesce": ("/sleep?level=1&mode=wait",), "wake": ("/wake_up",)},
)
RELEASES = {"sglang": SGLANG, "vllm": VLLM}
NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


class UnknownRelease(ValueError):
    """The engine reports a version no row covers (too old, too new, or none)."""


def version_tuple(text) -> tuple:
    """(0, 5, 21) of "0.5.21", "0.5.21rc1" or "v0.5.21"; () when nothing leads with a number."""
    parts = []
    for piece in str(text or "").lstrip("v").split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def covers(row: dict, version: tuple) -> bool:
    last = version_tuple(row["last"])
    return version_tuple(row["first"]) <= version and version[:len(last)] <= last


def supported(engine: str) -> str:
    return ", ".join("%s-%s" % (row["first"], row["last"]) for row in RELEASES[engine])


def choose(engine: str, version) -> dict:
    """The row of the release `version` belongs to; UnknownRelease names the ones runner supports."""
    found = version_tuple(version)
    for row in RELEASES[engine]:
        if found and covers(row, found):
            return dict(row, version=str(version))
    raise UnknownRelease("%s reports version %r: runner frees memory through %s %s only (each release's routes and "
                         "idle rule read from its code); use service.free: stop for another release" % (
                             NAMES[engine], version, NAMES[engine], supported(engine)))


def sequence(offers: dict) -> str:
    """What the release will do, in order, for the dry run and the preflight's note."""
    row = offers["release"]
    if offers["engine"] == "vllm":
        return " → ".join(["POST " + route for route in row["quiesce"]] + ["payload"]
                          + ["POST " + route for route in row["wake"]]) + " (requests in flight finish; arrivals wait)"
    steps = {"retract": "pause_generation retract (requests in flight go back to its queue, none aborted) → "
                        "/flush_cache until its running batch is empty",
             "drain": "serve on until idle (/flush_cache, at most service.drain_timeout; else nothing is released) → "
                      "pause_generation in_place",
             "abort": "pause_generation abort (requests in flight come back truncated)"}[offers["mode"]]
    return steps + " → release kv_cache → payload → resume → continue_generation (held requests complete)"
