"""Restore on the host: every way a service a job stopped (or whose engine it released) comes back.

    owed.py        what a job owes and what its restorers believe: the host ledger over status.json
    bring_back.py  start the unit, or resume the released engine (else restart it), and wait until healthy
    settle.py      a job's end: leftovers, the GPU's release, each owed service brought back; the guard timer
    restorers.py   one entry per restorer, and the restore lock they share
    guard.py       the guard's process: forked by the supervisor, `_guard`, the hard deadline

A module imports only those above it here, the stdlib, the shared rules, host/ and the supervision rooms of a
job's records; job.py, run.py and verbs/ (owed.py alone, for a status) import it. No imports here.
"""
