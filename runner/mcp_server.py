"""`runner mcp`: the runner's commands as MCP tools over stdio, for AI agents (the `mcp` extra).

Tools: submit, tail, status, list, cancel, results, restore_service. Like the CLI, no call blocks longer than
its max_wait (at most 100 s) plus one round trip; `tail` returns at most max_bytes of new log per call with
`call_again` (cursor semantics: each byte once, across calls and across `runner tail`). A RunnerError comes
back as a tool error carrying our message, its hint and the CLI's exit code. Blocking work runs in a worker
thread so the session keeps answering while a long poll waits. stdout is the protocol: nothing else prints.
Every tool answers one JSON object (lists sit under a key: the SDK would split a bare list into blocks).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Callable

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from . import ci, controller, gate, gate_report
from .errors import RunnerError, SpecError
from .store import Store

MAX_WAIT_LIMIT_S = 100.0
DEFAULT_MAX_WAIT_S = 50.0
DEFAULT_MAX_BYTES = 64 * 1024
EXIT_STILL_RUNNING = 75

MaxWait = Annotated[float, Field(ge=0, le=MAX_WAIT_LIMIT_S, description="seconds this call may wait (≤ 100)")]
INSTRUCTIONS = """\
Detached benchmark jobs on GPU hosts that serve a model through a service: submit stops the service if
the GPU memory is needed, runs the job detached, and the host brings the service back however it ends.
Call `tail` again while call_again is true (a 6-minute JIT compile is many calls); every byte comes once.
Errors carry the CLI's exit code: 2 bad spec/usage/unknown id, 3 unreachable/host key, 4 preflight
refused, 5 host busy (the message names the job holding it)."""


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run blocking controller code in a worker thread; a RunnerError becomes a tool error with its exit code."""
    try:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    except RunnerError as exc:
        hint = f" hint: {exc.hint}" if exc.hint else ""
        raise ToolError(f"{exc} [exit code {exc.exit_code}]{hint}") from exc


def _job_exit(state: str, terminal: bool) -> int:
    return (0 if state == "SUCCEEDED" else 1) if terminal else EXIT_STILL_RUNNING


# -- tools (plain functions: the server registers them, tests may call them) ------------------------------------

def submit(job_file: str, overrides: list[str] | None = None, queue: bool = False, job_id: str | None = None) -> dict:
    notes: list[str] = []
    done = controller.submit(job_file, list(overrides or []), queue=queue, job_id=job_id, store=Store(),
                             progress=notes.append)
    return {**asdict(done), "progress": notes, "next": f"call tail with job_id {done.job_id!r}"}


def tail(job_id: str, max_wait: float = DEFAULT_MAX_WAIT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    chunk = ci.tail_text(job_id, store=Store(), max_wait=max_wait, max_bytes=max_bytes)
    return {**asdict(chunk), "cli_exit_code": _job_exit(chunk.state, not chunk.call_again)}


def status(job_id: str | None = None) -> dict:
    return {"jobs": controller.status([job_id] if job_id else [], store=Store())}


def list_jobs() -> dict:
    return {"jobs": [asdict(r) for r in Store().all()]}


def cancel(job_id: str) -> dict:
    return controller.cancel(job_id, store=Store())


def results(job_id: str, baseline: str | None = None, tolerance: str = "5%") -> dict:
    from .results import render_any

    try:
        fraction = gate.parse_tolerance(tolerance)
    except ValueError as exc:
        raise SpecError(f"tolerance: {exc}") from None
    collected = ci.collect(job_id, store=Store())
    answer = {"table": render_any(collected.result), "result": collected.result, "history_warning": collected.warning}
    if baseline:
        verdicts = ci.gate_against(baseline, collected, fraction)
        answer["gate"] = {"exit_code": gate.exit_code(verdicts), "markdown": gate_report.render(
            verdicts, "markdown", baseline=baseline, current=collected.source, tolerance=fraction),
            "verdicts": {v.name: v.verdict for v in verdicts}}
    return answer


def restore_service(job_file: str | None = None, host: str | None = None, unit: str | None = None,
                    scope: str = "system", sudo: bool = False, max_wait: float = DEFAULT_MAX_WAIT_S) -> dict:
    host_spec, service = controller.restore_target(job_file, address=host, unit=unit, scope=scope, sudo=sudo)
    answer = controller.restore_service(host_spec, service, max_wait=max_wait)
    from .cli import exit_code

    return {**answer, "cli_exit_code": exit_code(answer.get("state"))}


# -- the server ---------------------------------------------------------------------------------------------------

def build_server() -> MCPServer:
    server = MCPServer("runner", instructions=INSTRUCTIONS)

    @server.tool(name="submit", description="Validate a job file, preflight its host and start it detached. "
                 "overrides are KEY=VALUE like payload.args.experts=128. Returns the job id.")
    async def submit_tool(job_file: str, overrides: list[str] | None = None, queue: bool = False,
                          job_id: str | None = None) -> dict:
        return await _call(submit, job_file, overrides, queue, job_id)

    @server.tool(name="tail", description="New log text after the cursor (at most max_bytes), waiting up to "
                 "max_wait s for the first byte; state, and call_again (true until the job ended and all was read).")
    async def tail_tool(job_id: str, max_wait: MaxWait = DEFAULT_MAX_WAIT_S,
                        max_bytes: Annotated[int, Field(ge=1024, le=1 << 20)] = DEFAULT_MAX_BYTES) -> dict:
        return await _call(tail, job_id, max_wait, max_bytes)

    @server.tool(name="status", description="State, phase, service and GPU readings of one job, or of all known jobs.")
    async def status_tool(job_id: str | None = None) -> dict:
        return await _call(status, job_id)

    @server.tool(name="list", description="Jobs this controller knows (local index, no network).")
    async def list_tool() -> dict:
        return await _call(list_jobs)

    @server.tool(name="cancel", description="Stop the job's payload (TERM, grace, KILL); the host restores the service.")
    async def cancel_tool(job_id: str) -> dict:
        return await _call(cancel, job_id)

    @server.tool(name="results", description="The job's result (job id or result.json path) as a table and as "
                 "JSON; with baseline, the regression gate (exit_code 0 within, 1 regression).")
    async def results_tool(job_id: str, baseline: str | None = None, tolerance: str = "5%") -> dict:
        return await _call(results, job_id, baseline, tolerance)

    @server.tool(name="restore_service", description="Start the service if inactive and wait up to max_wait s "
                 "until healthy (state healthy / starting: call again / failed). Give job_file, or host and unit.")
    async def restore_service_tool(job_file: str | None = None, host: str | None = None, unit: str | None = None,
                                   scope: str = "system", sudo: bool = False,
                                   max_wait: MaxWait = DEFAULT_MAX_WAIT_S) -> dict:
        return await _call(restore_service, job_file, host, unit, scope, sudo, max_wait)

    return server


def serve() -> None:
    build_server().run("stdio")
