"""The host's verbs: one room per verb, imported by commands.py one per call, and the LOST reaping every reading
verb does first. No imports here: every host call pays for what it loads."""
