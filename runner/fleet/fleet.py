"""A fleet run: one job per host of `host.address: [h1, h2, …]`, rolled out so that at most
`rollout.max_unavailable` hosts have their service stopped at a time.

The rollout is driven in the foreground, bounded like every command: `runner submit` drives it for up to
--max-wait and returns 75 while it is unfinished; `runner submit JOB.yaml --job-id RUN` or `runner wait RUN`
drive it on, from the run record (fleet_store.py) and the hosts. A host's job has a fixed id (RUN.N): a start
cut by a lost link or a killed driver is resumed, never doubled. One process drives a run (a lock); others watch.

Each host has a thread: preflight (is it reachable, may it run, will it stop the service?) → wait for its
turn (a job that will stop the service waits until fewer than max_unavailable hosts are stopped, and takes
its turn in list order — a host whose preflight has not answered yet keeps its place —; one that will not
starts at once) → start (the ordinary submit: preflight again, start) → poll until its job ends.
A host that is refused or unreachable is skipped and reported, without holding back the others; a host
whose service did not come back keeps its slot (the fleet is that much smaller), and when no slot can
free again the hosts still waiting are held with the reason.

The spec is planned once per command (commands/plan.py; the `runner submit` that creates the run passes its
own plan down), and each host's submit gets that plan retargeted to its address. At most `forks` host calls
(preflight, start, one status poll) are in flight at once, granted in list order (Forks); a thread waiting for
its turn or for its job's end holds none. Every call is bounded by the command's deadline (a start by one round trip past it),
so a host that never answers ends with the command and holds back no one but its own fork meanwhile.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from remote_payload.admission import never_stops
from remote_payload.contract import is_terminal

from ..commands import controller, render
from ..commands.plan import Plan
from ..deadline import ROUND_TRIP_ALLOWANCE_S, Deadline
from ..errors import RunnerError, SpecError, TransportError, first_line
from ..remote.job_answers import JobStatus
from ..state.fleet_store import DONE, HELD, PENDING, SKIPPED, STARTED, STARTING, HostEntry, RunRecord, RunStore
from ..state.job_id import check_job_id, job_id_for
from ..state.store import NOT_STARTED, Store

POLL_S = 1.0
FOLLOW_WAIT_S = 30.0  # a long poll's wait on the host (forks >= hosts), well inside the keepalives
FOLLOW_MARGIN_S = 1.0  # a long poll's answer comes this long before the driver's deadline, to be read in time
START_MARGIN_S = 2.0  # no start begins this close to the deadline (it could not be confirmed in time)
T = TypeVar("T")  # what for_each_host's call answers per host

Progress = Callable[[str], None]


def host_job_id(run_id: str, index: int) -> str:
    """Host N's job in run R is `R.N` (1-based, in host.address order): fixed, so a start is idempotent."""
    return check_job_id(f"{run_id}.{index + 1}")


def spec_digest(spec_path: str) -> str:
    return hashlib.sha256(Path(spec_path).read_bytes()).hexdigest()


# -- submit: a new run, or the same run resumed -------------------------------------------------------------

def submit(spec_path: str, overrides: list[str], *, run_id: str | None, queue: bool, store: Store,
           max_wait: float, progress: Progress, forks: int | None = None, planned: Plan | None = None) -> RunRecord:
    """forks: this run's host calls at once (`--forks`), instead of the spec's rollout.forks. planned: the
    command's plan of the spec (else made here): every host's job is started from it."""
    runs = RunStore(store)
    if run_id is not None and runs.exists(check_job_id(run_id)):
        run = runs.load(run_id)
        if Path(spec_path).resolve() != Path(run.spec_path) or spec_digest(spec_path) != run.spec_sha256 \
                or list(overrides) != run.overrides:
            raise SpecError(f"run {run_id} was submitted from another spec (or {spec_path} changed since)",
                            hint=f"Continue it with `runner wait {run_id}`, or choose another --job-id.")
        progress(f"run {run_id}: continuing the rollout")
        if forks is not None and forks != run.forks:
            run.forks = forks
            runs.save(run)
    else:
        planned = planned if planned is not None else controller.local_plan(spec_path, overrides)
        run = new_run(planned, run_id=run_id, queue=queue, progress=progress, forks=forks)
        runs.save(run)
    return drive(run.run_id, store=store, max_wait=max_wait, progress=progress, planned=planned)


def new_run(plan: Plan, *, run_id: str | None, queue: bool, progress: Progress, forks: int | None = None) -> RunRecord:
    """The run record for a fleet's plan (checked locally already: spec, payload args); no host is contacted."""
    progress(plan.args_note)
    run_id = check_job_id(run_id) if run_id is not None else \
        job_id_for(plan.name, datetime.now(timezone.utc), secrets.token_hex(3))
    rollout = plan.rollout
    assert rollout is not None  # a fleet's plan always has its rollout section
    return RunRecord(run_id=run_id, name=plan.name, spec_path=plan.spec_path,
                     spec_sha256=spec_digest(plan.spec_path), overrides=list(plan.overrides),
                     max_unavailable=rollout["max_unavailable"], stop_on_failure=rollout["stop_on_failure"],
                     queue=queue, forks=forks or rollout["forks"],
                     hosts=[HostEntry(address, host_job_id(run_id, i)) for i, address in enumerate(plan.addresses)])


def drive(run_id: str, *, store: Store, max_wait: float, progress: Progress, planned: Plan | None = None) -> RunRecord:
    """Drive the rollout for up to max_wait (plus one start's round trip); the run as it stands then.
    When another process is driving it, only watch the record until it finishes or max_wait passes.
    planned: the command's plan of the run's spec (else the first host that needs it makes it)."""
    runs = RunStore(store)
    deadline = Deadline(max_wait)
    with runs.driving(run_id) as mine:
        run = runs.load(run_id)
        if mine:
            return Rollout(run, runs, store, deadline, progress, planned).run()
        progress(f"run {run_id} is being driven by another runner process; watching it")
        while not run.finished and deadline.left() > 0:
            time.sleep(min(POLL_S, deadline.left()))
            run = runs.load(run_id)
        return run


class Forks:
    """At most n host calls in flight at once (like Ansible's forks), granted in list order, so the first
    host (the canary) is asked first; a caller waits for one no longer than its deadline. `first`: the hosts
    whose first call is still to come: a host is not granted before a lower one that has yet to make its
    first call (whose thread may simply be slower to ask), unless that one is `done` without a call."""

    def __init__(self, n: int, first: Iterable[int] = ()) -> None:
        self.free = n
        self.asking: set[int] = set()  # the hosts (list indexes) waiting for a fork
        self.first = set(first)
        self.cond = threading.Condition()

    def done(self, index: int) -> None:
        """This host makes no more calls: none after it waits for its first."""
        with self.cond:
            self.first.discard(index)
            self.cond.notify_all()

    @contextmanager
    def call(self, index: int, deadline: Deadline) -> Iterator[bool]:
        """Yield True holding a fork, or False when the deadline passed first (make no call then)."""
        with self.cond:
            self.asking.add(index)
            granted = self.cond.wait_for(lambda: self.free > 0 and index == min(self.asking | self.first),
                                         timeout=deadline.left())
            self.asking.discard(index)
            self.first.discard(index)  # asked: granted, or given up at its deadline
            if granted:
                self.free -= 1
            self.cond.notify_all()  # the next host in the list may ask now
        try:
            yield granted
        finally:
            if granted:
                with self.cond:
                    self.free += 1
                    self.cond.notify_all()


class Rollout:
    """One driver's pass over a run: a thread per host, the max_unavailable rule under one lock, the host
    calls through `forks`."""

    def __init__(self, run: RunRecord, runs: RunStore, store: Store, deadline: Deadline, progress: Progress,
                 plan: Plan | None = None) -> None:
        self.run_record, self.runs, self.store, self.deadline = run, runs, store, deadline
        self.progress = progress
        self.forks = Forks(run.forks, (i for i, e in enumerate(run.hosts) if not e.final))
        self.version = self.written = 0  # the record's changes made, and the last one on disk
        self.saving = True
        self.write_lock = threading.Lock()
        self._plan = plan
        self._plan_lock = threading.Lock()
        self.cond = threading.Condition()
        self.waiting: set[int] = set()  # hosts whose preflight says "will stop", waiting for their turn
        # Hosts still in preflight: none after them takes a turn first, so the rollout follows the list
        # (the first host is the canary that stop_on_failure watches), whichever preflight answers first.
        self.undecided = {i for i, e in enumerate(run.hosts) if e.phase == PENDING}
        self.starting = 0               # starts in flight (the driver waits for them past its deadline)
        self.unasked: set[str] = set()  # the jobs started without a preflight of their own (_takes_no_turn)

    def run(self) -> RunRecord:
        threads = [threading.Thread(target=self._host, args=(i, e), daemon=True, name=f"fleet-{e.address}")
                   for i, e in enumerate(self.run_record.hosts) if not e.final]
        saver = threading.Thread(target=self._keep_saved, daemon=True, name="fleet-record")
        for thread in [saver, *threads]:
            thread.start()
        for thread in threads:
            thread.join(timeout=self.deadline.left())
        with self.cond:  # a start in flight is confirmed (or not) within one round trip
            self.cond.wait_for(lambda: self.starting == 0, timeout=ROUND_TRIP_ALLOWANCE_S)
            self.saving = False
            self.cond.notify_all()
        saver.join()
        with self.cond:
            self._save_now()
            return self.run_record

    # -- one host ------------------------------------------------------------------------------------------

    def _host(self, index: int, entry: HostEntry) -> None:
        try:
            if entry.phase == PENDING and not (self._takes_no_turn(entry) or self._preflight(index, entry)):
                return
            if entry.phase == PENDING and not self._wait_turn(index, entry):
                return
            if entry.phase == STARTING and not self._start(index, entry):
                return
            self._follow(index, entry)
        except Exception as exc:  # a bug in one host's thread must not hide the others' outcome
            self._finish(entry, SKIPPED, f"internal error: {type(exc).__name__}: {exc}", exit=1)
        finally:
            self.forks.done(index)
            with self.cond:
                self.waiting.discard(index)
                self.undecided.discard(index)
                self.cond.notify_all()

    def _planned(self, entry: HostEntry) -> Plan:
        """The run's plan (made once, by the first host that needs it) retargeted to this host."""
        with self._plan_lock:
            if self._plan is None:
                self._plan = controller.local_plan(self.run_record.spec_path, self.run_record.overrides)
        return self._plan.for_address(entry.address)

    def _takes_no_turn(self, entry: HostEntry) -> bool:
        """A job that stops no service (admission.never_stops) waits for no turn, so its host needs no preflight
        before the start: its submit is preflighted, and refused, in its one call. True: decided (stops False)."""
        if not never_stops(self._planned(entry).wire):
            return False
        with self.cond:
            entry.stops, entry.note = False, "leaves the service running"
            self.unasked.add(entry.job_id)
            self._save()
        return True

    def _preflight(self, index: int, entry: HostEntry) -> bool:
        """True: decided (entry.stops). False: skipped, or still pending for the next driver call."""
        try:
            with self.forks.call(index, self.deadline) as granted:
                plan = controller.dry_run(self.run_record.spec_path, self.run_record.overrides,
                                          queue=self.run_record.queue, job_id=entry.job_id,
                                          planned=self._planned(entry), deadline=self.deadline) if granted else None
        except TransportError as exc:
            if self.deadline.left() > START_MARGIN_S:
                self._finish(entry, SKIPPED, _why(exc), exit=exc.exit_code)
            else:  # cut by this call's deadline rather than the host's own timeout: ask again next call
                self._note(entry, f"preflight not answered before this call's deadline; the next call asks "
                                  f"again: {exc}")
            return False
        except RunnerError as exc:
            self._finish(entry, SKIPPED, _why(exc), exit=exc.exit_code)
            return False
        if plan is None:
            self._note(entry, "no fork free before this call's deadline; the next call goes on")
            return False
        with self.cond:
            entry.stops = plan.stop_service
            entry.note = "will stop the service" if plan.stop_service else "leaves the service running"
            self._save()
        self.progress(f"{entry.address}: preflight: {entry.note}")
        return True

    def _wait_turn(self, index: int, entry: HostEntry) -> bool:
        """Wait until this host may start; mark it STARTING (holding its slot) under the lock. False: held."""
        with self.cond:
            if entry.stops:
                self.waiting.add(index)
            self.undecided.discard(index)
            while True:
                reason = self._hold_reason()
                if reason:
                    self._finish_locked(entry, HELD, reason)
                    return False
                if self.deadline.left() <= START_MARGIN_S:
                    return False  # still pending: the next driver call goes on
                if not entry.stops or (self._used() < self.run_record.max_unavailable
                                       and index == min(self.waiting | self.undecided)):
                    self.waiting.discard(index)
                    entry.phase, entry.note = STARTING, "starting"
                    self._saved()  # on disk before the start: a driver killed meanwhile resumes it by job id
                    self.cond.notify_all()  # the next host in the list may take its turn now, not at a timeout
                    return self._start_locked(index, entry)
                if self._no_slot_can_free():
                    down = ", ".join(e.address for e in self.run_record.hosts if e.service_down)
                    self._finish_locked(entry, HELD, f"not started: the service did not come back on {down}, "
                                                     "which leaves no host free to stop")
                    return False
                self.cond.wait(timeout=0.5)

    def _start_locked(self, index: int, entry: HostEntry) -> bool:
        self.cond.release()
        try:
            return self._start(index, entry)
        finally:
            self.cond.acquire()

    def _start(self, index: int, entry: HostEntry) -> bool:
        """The ordinary submit with the host's fixed job id. Refused → skipped (its slot freed). A lost link
        leaves it STARTING (slot held: it may have started); the next try adopts or starts it. A start begun
        before the deadline may take one round trip past it, to be confirmed."""
        with self.cond:
            self.starting += 1
        try:
            with self.forks.call(index, Deadline(max(0.0, self.deadline.left() - START_MARGIN_S))) as granted:
                if not granted:
                    self._note(entry, "not started: no fork free before this call's deadline; the next call starts it")
                    return False
                done = controller.submit(self.run_record.spec_path, self.run_record.overrides,
                                         queue=self.run_record.queue, job_id=entry.job_id, store=self.store,
                                         progress=lambda m: self.progress(f"{entry.address}: {m}"),
                                         planned=self._planned(entry),
                                         deadline=Deadline.for_command(self.deadline.left()))
        except TransportError as exc:
            if entry.job_id in self.unasked and self._never_reached(entry):
                return self._unreached(entry, exc)
            with self.cond:
                entry.note, entry.exit = f"start not confirmed, retried by the next driver call: {exc}", exc.exit_code
                self._save()
            self.progress(f"{entry.address}: {entry.note}")
            return False
        except RunnerError as exc:
            self._finish(entry, SKIPPED, _why(exc), exit=exc.exit_code)
            return False
        finally:
            with self.cond:
                self.starting -= 1
                self.cond.notify_all()
        with self.cond:
            entry.phase, entry.state, entry.exit = STARTED, done.state, None
            entry.note = f"job {entry.job_id}" + (" (already started)" if done.already else "")
            self._save()
        self.progress(f"{entry.address}: started {entry.job_id} ({done.state})")
        return True

    def _never_reached(self, entry: HostEntry) -> bool:
        """The submit reached no host (its record ended NOT_STARTED): nothing started there."""
        try:
            return self.store.load(entry.job_id).last_state == NOT_STARTED
        except RunnerError:
            return False

    def _unreached(self, entry: HostEntry, exc: TransportError) -> bool:
        """A start that never reached its host, with no preflight before it: what the preflight's unreachable
        host gets — skipped, or pending for the next driver call when this call's deadline cut it."""
        if self.deadline.left() > START_MARGIN_S:
            self._finish(entry, SKIPPED, _why(exc), exit=exc.exit_code)
        else:
            with self.cond:
                entry.phase, entry.stops = PENDING, None
                self._save()
            self._note(entry, f"not reached before this call's deadline; the next call asks again: {exc}")
        return False

    def _follow(self, index: int, entry: HostEntry) -> None:
        """Poll the host's job until it ends (or the deadline): its end frees its slot, if the service is back.
        With a fork for every host, each poll is a long one (the host answers once the job changed state or
        ended, at most FOLLOW_WAIT_S); otherwise a poll a second, each holding its fork for one round trip."""
        long_polls = self.run_record.forks >= len(self.run_record.hosts)
        while self.deadline.left() > 0:
            wait = max(0.0, min(FOLLOW_WAIT_S, self.deadline.left() - FOLLOW_MARGIN_S)) if long_polls else 0.0
            try:
                with self.forks.call(index, self.deadline) as granted:
                    if not granted:
                        return
                    job = controller.status([entry.job_id], store=self.store, deadline=self.deadline, wait=wait)[0]
            except TransportError as exc:
                with self.cond:
                    entry.note = f"unreachable since {time.strftime('%H:%M:%S')}: {exc}"
                    self._save()
                time.sleep(min(POLL_S, self.deadline.left()))
                continue
            if is_terminal(job.state):
                with self.cond:
                    entry.service_down = bool(job.service.stopped) and job.service.healthy is not True
                    entry.state = job.state
                self._finish(entry, DONE, _ended(job, entry.service_down))
                return
            with self.cond:
                changed = entry.state != job.state
                if changed:
                    entry.state = job.state
                    self._save()
            if not (long_polls and (changed or wait > 0)):  # a long poll that ended by itself: the next at once
                time.sleep(min(POLL_S, self.deadline.left()))

    # -- the rules, under self.cond ------------------------------------------------------------------------

    def _used(self) -> int:
        return sum(1 for e in self.run_record.hosts if e.holds_slot)

    def _no_slot_can_free(self) -> bool:
        """Every slot is held by a host whose service did not come back: no one will release one."""
        return sum(1 for e in self.run_record.hosts if e.service_down) >= self.run_record.max_unavailable

    def _hold_reason(self) -> str | None:
        run = self.run_record
        if self.runs.cancel_requested(run.run_id):
            return "not started: the run was cancelled"
        failed = [e.address for e in run.hosts if _failed(e)]
        if run.stop_on_failure and failed:
            return f"not started: rollout.stop_on_failure after {', '.join(failed)} failed"
        return None

    def _note(self, entry: HostEntry, note: str) -> None:
        with self.cond:
            entry.note = note
            self._save()
        self.progress(f"{entry.address}: {note}")

    def _finish(self, entry: HostEntry, phase: str, note: str, exit: int | None = None) -> None:
        with self.cond:
            self._finish_locked(entry, phase, note, exit)

    def _finish_locked(self, entry: HostEntry, phase: str, note: str, exit: int | None = None) -> None:
        entry.phase, entry.note, entry.exit = phase, note, exit
        self._save()
        self.cond.notify_all()
        self.progress(f"{entry.address}: {phase}: {note}")

    # -- the run record: written by one thread, the latest state, never under the rollout's lock -------------

    def _save(self) -> None:
        """(under self.cond) The record changed: the saver thread writes it soon, outside the lock (a write
        is an fsync: each under the lock would hold every host's step behind it)."""
        self.version += 1
        self.cond.notify_all()

    def _saved(self) -> None:
        """(under self.cond) The record changed and must be on disk before going on: the saver thread writes it,
        once for every host that marked a change meanwhile (each write is an fsync; one per host, under this
        lock, held every host's start behind the others')."""
        if not self.saving:
            self._save_now()
            return
        self._save()
        mine = self.version
        self.cond.wait_for(lambda: self.written >= mine or not self.saving)
        if self.written < mine:
            self._save_now()

    def _save_now(self) -> None:
        """(under self.cond) Write the record before going on."""
        self.version += 1
        self._write(self.version, self.runs.dump(self.run_record))

    def _keep_saved(self) -> None:
        with self.cond:
            while self.saving:
                self.cond.wait_for(lambda: self.version > self.written or not self.saving)
                if self.version > self.written:
                    version, text = self.version, self.runs.dump(self.run_record)
                    self.cond.release()
                    try:
                        self._write(version, text)
                    finally:
                        self.cond.acquire()
                        self.cond.notify_all()  # the hosts waiting for this version on disk (_saved)

    def _write(self, version: int, text: str) -> None:
        """An older state never replaces a newer one on disk."""
        with self.write_lock:
            if version > self.written:
                self.runs.write(self.run_record.run_id, text)
                self.written = version


def _failed(entry: HostEntry) -> bool:
    return entry.phase == SKIPPED or (entry.phase == DONE and (entry.state != "SUCCEEDED" or entry.service_down))


def _why(exc: RunnerError) -> str:
    kind = {3: "unreachable", 4: "preflight refused", 5: "host busy", 2: "refused"}.get(exc.exit_code, "failed")
    return f"{kind}: {exc}".splitlines()[0]


def _ended(job: JobStatus, service_down: bool) -> str:
    text = f"job {job.job_id} ended {job.state}{render.exit_note(job.exit_code)}"
    if service_down:
        text += "; the service it stopped did NOT come back"
    return text


# -- cancel -------------------------------------------------------------------------------------------------

def cancel(run_id: str, *, store: Store, deadline: Deadline) -> dict[str, dict]:
    """Start no more hosts, and cancel every host's job that may be running (concurrently); per host the
    host's answer or {"error": …}. Hosts not started are held (now, or by the driver that holds the run)."""
    runs = RunStore(store)
    runs.request_cancel(check_job_id(run_id))
    with runs.driving(run_id) as mine:
        run = runs.load(run_id)
        if mine:
            for entry in run.hosts:
                if entry.phase == PENDING:
                    entry.phase, entry.note = HELD, "not started: the run was cancelled"
            runs.save(run)
    live = [e for e in run.hosts if e.phase in (STARTING, STARTED)]
    answers, errors = for_each_host(live, lambda e: controller.cancel(e.job_id, store=store, deadline=deadline),
                                    run.forks)
    answers.update({a: {"error": first_line(exc), "exit": exc.exit_code} for a, exc in errors.items()})
    return {e.address: answers.get(e.address, {"state": e.phase, "already": True, "note": e.note}) for e in run.hosts}


def for_each_host(entries: list[HostEntry], call: Callable[[HostEntry], T],
                  forks: int | None = None) -> tuple[dict[str, T], dict[str, RunnerError]]:
    """call(entry) for each host, at most `forks` at once in list order (None: every host at once, as a
    `tail -f` of each needs): (answers, errors) by address; one host's error is its own."""
    answers: dict[str, T] = {}
    errors: dict[str, RunnerError] = {}
    todo = iter(entries)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                entry = next(todo, None)
            if entry is None:
                return
            try:
                answers[entry.address] = call(entry)
            except RunnerError as exc:
                errors[entry.address] = exc

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(forks or len(entries), len(entries)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers, errors
