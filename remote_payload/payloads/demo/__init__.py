"""The demo payload: a small CPU job (demo_payload.py) that behaves like a benchmark as the runner sees it."""
