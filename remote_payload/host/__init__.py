"""Host primitives: what the supervisor asks the machine (commands, systemd, nvidia-smi, /proc, an engine's HTTP
API, the answer line), never what a job means. May import the stdlib and contract.py only. No imports here: every
host call pays for what it loads.
"""
