"""Host primitives: what the supervisor asks the machine, never what a job means.

answer.py: the `Fail` answer and the one JSON answer line; bundle.py: where the bundle lies and the argv that
re-executes the supervisor; processes.py: bounded commands without a shell, process identity from /proc and
process-group kills; parsers.py: the pure parsers of nvidia-smi, systemctl and sudo output; systemd.py: systemctl,
systemd-run and journalctl for one scope; gpu.py: nvidia-smi's GPUs and compute apps, the cards a job may use;
engine.py: the unit's health wait and a serving engine's own HTTP API (release and resume GPU memory); unit_stop.py:
how a unit stops (the slow-stop hint, a failed mark left by the stop and its reset). May import the standard library
and the shared rules (remote_payload/contract.py) only; every room above imports it. No imports here: every host call
pays for what it loads.
"""
