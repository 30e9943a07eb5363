"""One job on one host, from its start to its settle: the rooms of the supervisor.

The spec checked again, the job's files and records, the host ledger, may the payload start, the payload's
process (staged; every job's variants, a plain job's one), the transient unit, the start handshake, the job's
choreography that ties them together (job.py) and the supervisor's process (run.py); restore/ is every way a
stopped service comes back (what a job owes, settle, the guard, the restorers). May import the standard
library, the shared rules (contract, admission, progress, sweep, slurm/batch.py) and host/; slurm/, verbs/ and
commands.py import it. No imports here: every host call pays for what it loads.
"""
