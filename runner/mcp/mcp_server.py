"""`runner mcp`: the runner's commands as MCP tools over stdio, for AI agents (the `mcp` extra).

What a call may ask is bounded by the server's Policy (mcp_policy.py). Like the CLI, no call blocks longer
than its max_wait (at most 100 s) plus one round trip; `tail` keeps the cursor's rule (each byte once, across
calls and across `runner tail`); a fleet run's id is answered as the CLI answers it (fleet/targets.py decides,
this module only renders).

Every tool answers one JSON object, as structured content and as its JSON text. A failure is a tool error:
text `CODE: message [exit code N] hint: …` and structured content `{error, message, hint, exit}`, the object
of the CLI's `--json` errors. An unknown argument or a bad value is one line naming it (`bad-args`, exit 2).
The tools are plain methods, which the SDK runs in a worker thread: the session keeps answering while a long
poll waits. stdout is the protocol: nothing else prints.
"""
from __future__ import annotations

import inspect
import io
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, Tool
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from ..commands import controller, render, unattended, upkeep
from ..deadline import Deadline
from ..errors import EXIT_OK, EXIT_STILL_RUNNING, EXIT_USAGE, RunnerError, SpecError, exit_code
from ..fleet import targets
from ..printable import printable, printable_json
from ..results import gate, gate_report
from ..state.store import Store

if TYPE_CHECKING:
    from ..spec.spec import JobSpec
from .mcp_policy import Policy

MAX_WAIT_LIMIT_S = 100.0
DEFAULT_MAX_WAIT_S = 50.0
DEFAULT_MAX_BYTES = 64 * 1024
BAD_ARGS = "bad-args"  # the wire's code for a call's invalid arguments

MaxWait = Annotated[float, Field(ge=0, le=MAX_WAIT_LIMIT_S, description="seconds this call may wait (≤ 100)")]
Answer = dict[str, Any]
INSTRUCTIONS = """\
Detached benchmark jobs on GPU hosts that serve a model through a service: submit stops the service if
the GPU memory is needed, runs the job detached, and the host brings the service back however it ends.
Call `tail` again while call_again is true (a 6-minute JIT compile is many calls); every byte comes once.
Job files come from the server's jobs dirs; overrides may set payload.args.*, sweep.*, limits.*, gpu.*, name.
A job file with a list of hosts is a fleet: submit returns its run id and drives the rollout for max_wait
(submit again with that job_id goes on); status, tail, cancel and results take the run id, each host on its own.
Errors carry a code and the CLI's exit code: 2 bad spec/usage/unknown id/not allowed, 3 unreachable/host key,
4 preflight refused, 5 host busy (the message names the job holding it)."""


class Tools:
    """The tools as plain methods (the server registers them; tests call them); each raises RunnerError."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def submit(self, job_file: str, overrides: list[str] | None = None, queue: bool = False,
               job_id: str | None = None, max_wait: MaxWait = DEFAULT_MAX_WAIT_S) -> Answer:
        path = self.policy.job_file(job_file)
        overrides = self.policy.overrides(overrides or [])
        spec = _spec(path, overrides)
        if overrides:
            self.policy.arguments(_spec(path, []), spec)
        self.policy.host(spec.host.model_dump())
        notes: list[str] = []
        plan = controller.local_plan(path, overrides)
        if plan.is_fleet:  # like `runner submit`: the run's id, its rollout driven for up to max_wait
            run = targets.submit_fleet(plan, run_id=job_id, queue=queue, store=Store(), max_wait=max_wait,
                                       progress=notes.append)
            assert run.run is not None  # a fleet's outcome carries its run record (targets.run_outcome)
            return {**run.document, "cli_exit_code": run.exit, "progress": notes,
                    "next": f"call tail or status with job_id {run.run.run_id!r}"
                            + ("" if run.run.finished else "; submit again with this job_id drives the rollout on")}
        done = controller.submit(path, overrides, queue=queue, job_id=job_id, store=Store(), progress=notes.append,
                                 planned=plan, deadline=Deadline.for_command(max_wait))
        return {**asdict(done), "progress": notes, "next": f"call tail with job_id {done.job_id!r}"}

    def tail(self, job_id: str, max_wait: MaxWait = DEFAULT_MAX_WAIT_S,
             max_bytes: Annotated[int, Field(ge=1024, le=1 << 20)] = DEFAULT_MAX_BYTES, follow: bool = True) -> Answer:
        store = Store()
        if store.is_run(job_id):
            return _run_tail(job_id, store, max_wait)
        chunk = unattended.tail_text(job_id, store=store, max_wait=max_wait, max_bytes=max_bytes, follow=follow)
        return {**asdict(chunk), "cli_exit_code": exit_code(chunk.state, settled=not chunk.call_again)}

    def status(self, job_id: str | None = None, detail: bool = False) -> Answer:
        """detail: each job's status.json as the host answered it (`runner status --json`); else its state and
        the CLI's text of it, a quarter of the bytes and no supervisor internals (budget, pids)."""
        found = targets.status(job_id, store=Store(), deadline=_deadline())
        if found.of_run:
            return {**found.document, "cli_exit_code": found.exit}
        jobs = [job.raw if detail else {"job_id": job.job_id, "state": job.state, "text": render.job_text(job)}
                for job in found.detail]
        return {"jobs": jobs, "cli_exit_code": found.exit}

    def list_jobs(self, detail: bool = False) -> Answer:
        """detail: every job's whole record (its spec as submitted, its cursor); else `runner list`'s lines."""
        if detail:
            return {"jobs": [asdict(r) for r in Store().all()]}
        records, _skipped, older = Store().recent()
        jobs = [{"job_id": r.job_id, "state": r.last_state, "host": r.host.get("address"), "name": r.name,
                 "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.submitted_at))} for r in records]
        return {"jobs": jobs, **({"older_not_listed": older} if older else {})}

    def cancel(self, job_id: str) -> Answer:
        found = targets.cancel(job_id, store=Store(), deadline=_deadline())
        if found.of_run:
            return {"run_id": job_id, "hosts": found.document, "cli_exit_code": found.exit}
        return {**found.document, "cli_exit_code": found.exit}

    def results(self, job_id: str, baseline: str | None = None, tolerance: str = "5%") -> Answer:
        from ..results.results import render_any, strict_json

        try:
            fraction = gate.parse_tolerance(tolerance)
        except ValueError as exc:
            raise SpecError(f"tolerance: {exc}") from None
        baseline = self.policy.baseline(baseline) if baseline else None
        if not baseline and Store().is_run(job_id):  # like `runner results RUN`: every host's, side by side
            return _run_results(job_id)
        collected = unattended.collect_job(job_id, store=Store(), deadline=_deadline())  # by id only: never a path
        answer = {"table": render_any(collected.result), "result": strict_json(collected.result),
                  "service_window": strict_json(collected.window),
                  "service_window_text": "\n".join(render.window_lines(collected.window)) if collected.window else None,
                  "history_warning": collected.warning, "cli_exit_code": EXIT_OK}
        if baseline:
            verdicts = unattended.gate_against(baseline, collected, fraction)
            answer["gate"] = {"exit_code": gate.exit_code(verdicts), "markdown": gate_report.render(
                verdicts, "markdown", baseline=baseline, current=collected.source, tolerance=fraction,
                notes=unattended.gate_clock_lines(baseline, collected)),
                "verdicts": {v.name: v.verdict for v in verdicts}}
        return answer

    def restore_service(self, job_file: str | None = None, host: str | None = None, unit: str | None = None,
                        max_wait: MaxWait = DEFAULT_MAX_WAIT_S) -> Answer:
        if job_file and (host or unit):
            raise SpecError("give either job_file, or host and unit, not both")
        if not job_file and not (host and unit):
            raise SpecError("restore_service needs job_file, or both host and unit")
        if host:
            self.policy.host({"address": host})
        if job_file:
            path = self.policy.job_file(job_file)
        else:
            assert host and unit  # checked above: without job_file both are given
            path = self.policy.known_service(host, unit)
        overrides = [f"host.address={host}"] if host else []  # one host of a fleet's job file
        host_spec, service = upkeep.restore_target(path, unit=unit, overrides=overrides)  # unit: one of `services`
        self.policy.host(host_spec)
        answer = upkeep.restore_service(host_spec, service, max_wait=max_wait)
        return {**answer, "cli_exit_code": exit_code(answer.get("state"))}


def _run_tail(run_id: str, store: Store, max_wait: float) -> dict:
    """A run's new log, as `runner tail RUN -f --max-wait` prints it (each line `[HOST] `, every byte once)."""
    out = io.BytesIO()
    notes: list[str] = []
    found = targets.run_tail(run_id, store=store, out=out, follow=True, max_wait=max_wait, from_start=False,
                             progress=notes.append)
    return {"job_id": run_id, "text": out.getvalue().decode("utf-8", "replace"), **found.document,
            "call_again": found.exit == EXIT_STILL_RUNNING, "cli_exit_code": found.exit, "progress": notes}


def _run_results(run_id: str) -> dict:
    from ..results.fleet_results import side_by_side
    from ..results.results import strict_json

    found = targets.run_results(run_id, store=Store(), deadline=_deadline())
    return {"table": side_by_side(found.detail.results, found.detail.missing),
            **strict_json(found.document), "cli_exit_code": found.exit}


def _deadline() -> Deadline:
    """The deadline of a call that takes no max_wait (status, cancel, results): the default's, made here, the
    front end, and handed to every host call below."""
    return Deadline.for_command(DEFAULT_MAX_WAIT_S)


def _spec(path: str, overrides: list[str]) -> JobSpec:
    from ..spec.spec_load import load_spec

    return load_spec(path, overrides)


# -- the server ---------------------------------------------------------------------------------------------------

class _Server(MCPServer):
    """MCPServer that refuses unknown arguments, and answers every failure as one line plus {error, …}."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arguments: dict[str, list[str]] = {}

    def register(self, name: str, description: str, fn: Callable[..., Any]) -> None:
        self.arguments[name] = list(inspect.signature(fn).parameters)
        self.tool(name=name, description=description)(fn)

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        for tool in tools:
            tool.input_schema["additionalProperties"] = False
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        known = self.arguments.get(name)
        unknown = sorted(set(arguments) - set(known)) if known is not None else []
        if known is not None and unknown:
            return _error(BAD_ARGS, f"{name}: unknown argument{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))} ({name} takes {', '.join(known) or 'none'})", "",
                          EXIT_USAGE)
        try:
            return _printable_text(await super().call_tool(name, arguments, context))
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                return _error(BAD_ARGS, f"{name}: " + "; ".join(_argument_problem(e) for e in cause.errors()), "",
                              EXIT_USAGE)
            if isinstance(cause, RunnerError):
                return _error(cause.code, str(cause), cause.hint, cause.exit_code)
            raise


def _printable_text(result: Any) -> Any:
    """A tool's answer with its JSON text made printable (printable_json: the same JSON): an agent's client
    may show it to a person as it is."""
    for block in getattr(result, "content", None) or ():
        if isinstance(block, TextContent):
            block.text = printable_json(block.text)
    return result


def _argument_problem(error: ErrorDetails) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    return f"{where}: {error['msg']}"


def _error(code: str, message: str, hint: str, exit: int) -> CallToolResult:
    text = printable(f"{code}: {message} [exit code {exit}]" + (f" hint: {hint}" if hint else ""), multiline=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True,
                          structured_content={"error": code, "message": message, "hint": hint, "exit": exit})


def build_server(policy: Policy) -> MCPServer:
    tools = Tools(policy)  # each a plain method: the server runs it in a worker thread
    server = _Server("runner", instructions=INSTRUCTIONS)
    server.register("submit", "Validate a job file (from the server's jobs dirs), preflight its host and start "
                    "it detached. overrides are KEY=VALUE like payload.args.experts=128. Returns the job id; for a job "
                    "file with a list of hosts, the run id, the rollout driven for up to max_wait s.", tools.submit)
    server.register("tail", "New log text after the cursor, following it until the job ends, max_bytes are read or "
                    "max_wait s pass (follow=false: returns at the first bytes); state, and call_again (true until "
                    "the job ended and all was read). A run id: every host's new log for max_wait s, lines prefixed "
                    "[HOST].", tools.tail)
    server.register("status", "State and the CLI's status text (phase, rows, service, downtime, exit code) of one "
                    "job, of a run's hosts, or of the recent and unfinished jobs; detail=true: each job's status "
                    "record whole.", tools.status)
    server.register("list", "Jobs this controller knows (local index, no network): id, state, host, name, submitted "
                    "(UTC) of the 50 newest and every unfinished one; detail=true: every job's whole record.",
                    tools.list_jobs)
    server.register("cancel", "Stop the job's payload (TERM, grace, KILL); the host restores the service.",
                    tools.cancel)
    server.register("results", "The job's result (by job id) as a table and as JSON; with baseline (a file in the "
                    "server's baselines dirs), the regression gate (exit_code 0 within, 1 regression).", tools.results)
    server.register("restore_service", "Start the service if inactive and wait up to max_wait s until healthy "
                    "(state healthy / starting: call again / failed). Give job_file, or host and unit of a job "
                    "file in the server's jobs dirs.", tools.restore_service)
    return server


def serve(policy: Policy) -> None:
    build_server(policy).run("stdio")
