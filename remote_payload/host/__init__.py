"""Host primitives: what the supervisor asks the machine, never what a job means.

primitives.py: the `Fail` answer, bounded commands without a shell, systemd, nvidia-smi and its parsers, process
identity from /proc and process-group kills, the health wait; engine.py: a serving engine's own HTTP API
(release and resume GPU memory); unit_stop.py: how a unit stops (the slow-stop hint, a failed mark left by
the stop and its reset). May import the standard library and the shared rules (remote_payload/contract.py)
only; every room above imports it. No imports here: every host call pays for what it loads.
"""
