"""A small CPU payload for the embedded default job: prints phases for ~20 s, then writes result.json.

It behaves like a real benchmark as the runner sees it: JSON event lines on stdout, a slow "compile"
phase with heartbeats, timed rows, and a result file at $RUNNER_RESULT.

Staged (payload.staged, RUNNER_STAGED=1): the setup (--setup-seconds, standing in for imports and a backend
load) runs first, then the line {"event": "staged"}, then one line is read from stdin: `go` hands it the GPU
and the run goes on; EOF (the supervisor is gone) or anything else exits 4 before the run.
"""
import argparse
import json
import os
import statistics
import sys
import time


def event(**fields):
    fields["t"] = round(time.monotonic() - START, 2)
    print(json.dumps(fields), flush=True)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)  # `--second` is no `--seconds`
    parser.add_argument("--seconds", type=float, default=20.0, help="about how long to run")
    parser.add_argument("--sizes", default="1,4,16,64", help="comma-separated problem sizes")
    parser.add_argument("--fail", action="store_true", help="exit 3 after the first phase (for tests)")
    # test hooks, hidden from --help (and from the names payload.args may use in the examples' messages):
    # a GPU-free setup of that many seconds before anything else (staged: before the staged line); exit 3 in it
    parser.add_argument("--setup-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--fail-setup", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.environ.get("RUNNER_RESULT", "result.json"))
    return parser


def parse_args(argv):
    """Also what the controller runs to check payload.args before submitting (runner/spec/payload_args.py)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes must be comma-separated integers, got %r" % args.sizes)
    if args.seconds <= 0 or any(s <= 0 for s in args.sizes) or args.setup_seconds < 0:
        parser.error("--seconds and --sizes must be positive, --setup-seconds not negative")
    return args


def warm_up(seconds):
    """Stands in for a JIT compile: silent work, with a heartbeat every second."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, end - time.monotonic()))
        event(event="heartbeat", phase="compile")


def time_size(n, budget):
    samples = []
    end = time.monotonic() + budget
    while time.monotonic() < end or len(samples) < 3:
        t = time.perf_counter()
        sum(i * i for i in range(2000 * n))
        samples.append((time.perf_counter() - t) * 1e6)
    return {"size": n, "median_us": statistics.median(samples), "samples": len(samples)}


def set_up(args):
    """Stands in for what needs no GPU memory (imports, a backend load): runs while the service still serves
    when the payload is staged."""
    event(event="phase", phase="setup", status="start")
    time.sleep(args.setup_seconds)
    if args.fail_setup:
        print("demo payload: failing in the setup on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    event(event="phase", phase="setup", status="end")


def wait_for_go():
    """The staged hand-over: announce the setup done, then block until the supervisor says the GPU is ours."""
    event(event="staged")
    line = sys.stdin.readline()
    if line.strip() != "go":
        print("demo payload: stdin said %r, not go: exiting without touching the GPU" % line, file=sys.stderr,
              flush=True)
        sys.exit(4)


def main(argv=None):
    args = parse_args(argv)
    set_up(args)
    if os.environ.get("RUNNER_STAGED") == "1":
        wait_for_go()
    event(event="plan", rows=len(args.sizes))
    event(event="phase", phase="compile", status="start")
    warm_up(args.seconds * 0.4)
    event(event="phase", phase="compile", status="end")
    if args.fail:
        print("demo payload: failing on purpose", file=sys.stderr, flush=True)
        return 3
    rows = []
    for n in args.sizes:
        row = time_size(n, args.seconds * 0.6 / len(args.sizes))
        rows.append(row)
        event(event="row", **row)
    with open(args.out + ".tmp", "w") as fh:
        json.dump({"payload": "demo", "python": sys.version.split()[0], "rows": rows}, fh, indent=1)
    os.replace(args.out + ".tmp", args.out)
    event(event="done", result=args.out)
    return 0


START = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
