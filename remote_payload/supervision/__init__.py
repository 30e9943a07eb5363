"""One job on one host, from its start to its settle: the rooms of the supervisor.

The spec checked again, the job's files and records, the host ledger and what the restorers trust, may the
payload start, the payload's process (staged; every job's variants, a plain job's one), settle and the guard,
the transient unit, the start handshake, the job's choreography that ties them together (job.py); the
supervisor's process (run.py), the guard's (guard.py) and restore (restore.py). May import the standard
library, the shared rules (contract, admission, progress, sweep, slurm/batch.py) and host/; slurm/, verbs/ and
commands.py import it. No imports here: every host call pays for what it loads.
"""
