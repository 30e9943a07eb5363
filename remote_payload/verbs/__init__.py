"""The host's verbs above the launchers: one room per verb, the Slurm launcher on first use, and the LOST
reaping every reading verb does first. May import the shared rules, host/, supervision/ and slurm/; only
commands.py imports them, one verb's room per call. No imports here: every host call pays for what it
loads."""
