"""TEST STAND-IN part: the clients of an engine stand-in (tests/hosts/engine_standin.py) and what each one saw.

N clients each send a request of S s of scheduler work once the load starts; with `loop` each sends its next one
as soon as one ends (a saturating load: the scheduler is never idle). Every request is followed to its end, so a
test can compare what runner reported with what the clients saw:
- completed: answered whole (HTTP 200, every token), however long it was held;
- truncated: aborted while it ran (SGLang: 200 with the tokens so far; vLLM: finish_reason abort);
- failed: aborted before it ever ran (SGLang's abort pause re-aborts while requests hold its lock: 499);
- refused: turned away at the door (vLLM >= 0.33 during a user /pause: 503 engine_paused).
held: requests that waited while the engine was paused, asleep or released; hold_s: the longest such wait;
first_held_at / first_served_at: the first request held and the first one served after it (the window as clients saw
it). Time runs lazily: `advance` brings the requests up to now on each call to the stand-in. Stdlib only.
"""

import time


class Request:
    def __init__(self, work_s: float):
        self.work_s, self.left, self.held_since = work_s, work_s, None

    def hold(self, now: float):
        if self.held_since is None:
            self.held_since = now


class Load:
    """running: requests the scheduler works on; waiting: in its queue (retracted ones: recomputed when they run);
    held: arrivals kept out of the scheduler (in SGLang's tokenizer or vLLM's paused front end)."""

    def __init__(self, clients: int, request_s: float, loop: bool):
        self.clients, self.request_s, self.loop = clients, request_s, loop
        self.started, self.last = False, time.monotonic()
        self.running, self.waiting, self.held = [], [], []
        self.outcomes = {"completed": 0, "truncated": 0, "failed": 0, "refused": 0}
        self.ever_held, self.hold_s, self.turned_away = 0, 0.0, 0
        self.first_held_at = self.first_served_at = None

    def start(self):
        if not self.started:
            self.started, self.last = True, time.monotonic()
            self.running = [Request(self.request_s) for _ in range(self.clients)]

    def advance(self, runs: bool, admits: bool):
        """Bring the requests up to now: the running ones progress when `runs`; queued ones join them when
        `admits` (the scheduler takes what waits as soon as it may)."""
        now = time.monotonic()
        spent, self.last = now - self.last, now
        if runs and admits:
            self.admit(now)
        while runs and spent > 0 and self.running:
            step = min(spent, min(r.left for r in self.running))
            for request in self.running:
                request.left -= step
            spent -= step
            done = [r for r in self.running if r.left <= 1e-9]
            self.running = [r for r in self.running if r.left > 1e-9]
            self.outcomes["completed"] += len(done)
            for _ in done if self.loop else []:
                self.arrive(admits and runs, now)

    def arrive(self, admits: bool, now: float, refused: bool = False):
        if refused:  # a looping client sends it again once the engine admits
            self.outcomes["refused"] += 1
            self.turned_away += 1
        elif admits:
            self.running.append(Request(self.request_s))
        else:
            request = Request(self.request_s)
            self.note_held(request, now)
            self.held.append(request)

    def note_held(self, request: Request, now: float):
        request.hold(now)
        self.ever_held += 1
        if self.first_held_at is None:
            self.first_held_at = time.time()

    def admit(self, now: float):
        """Queued and held requests go to the scheduler: each one's wait ends here."""
        for request in self.waiting + self.held:
            if request.held_since is not None:
                self.hold_s = max(self.hold_s, now - request.held_since)
                if self.first_held_at is not None and self.first_served_at is None:
                    self.first_served_at = time.time()
                request.held_since = None
            self.running.append(request)
        self.waiting, self.held = [], []
        self.running += [Request(self.request_s) for _ in range(self.turned_away if self.loop else 0)]
        self.turned_away = 0

    def abort_all(self, now: float):
        """An abort: the running requests come back truncated, the queued ones that never ran failed; a looping
        client sends its next request at once (held while the engine does not admit)."""
        aborted = len(self.running) + len(self.waiting)
        self.outcomes["truncated"] += len(self.running)
        self.outcomes["failed"] += len(self.waiting)
        self.running, self.waiting = [], []
        for _ in range(aborted if self.loop else 0):
            self.arrive(False, now)
        return aborted

    def retract(self, now: float):
        """SGLang's retract: the running requests go back to the waiting queue, their KV freed (recomputed)."""
        for request in self.running:
            request.left = request.work_s
            self.note_held(request, now)
        self.waiting += self.running
        self.running = []

    def hold_running(self, now: float):
        """The running requests are frozen where they are (an in-place pause, a released cache): held too."""
        for request in self.running:
            if request.held_since is None:
                self.note_held(request, now)

    def release_frozen(self, now: float):
        for request in self.running:
            if request.held_since is not None:
                self.hold_s = max(self.hold_s, now - request.held_since)
                request.held_since = None

    def counts(self):
        return len(self.running), len(self.waiting)

    def state(self):
        return dict(self.outcomes, running=len(self.running), waiting=len(self.waiting), held=len(self.held),
                    ever_held=self.ever_held, hold_s=round(self.hold_s, 3), first_held_at=self.first_held_at,
                    first_served_at=self.first_served_at, aborted=self.outcomes["truncated"] + self.outcomes["failed"])
