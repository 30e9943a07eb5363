"""`launcher: slurm` on the host side: the sbatch call, Slurm's view of a job, the launcher and job arrays.

batch.py (the sbatch argv and batch script) and states.py (squeue/sacct parsers) are pure shared rules: the
controller and supervision/ import them. launch.py and array.py submit, follow and cancel Slurm jobs and run
one in its allocation; they may import the shared rules, host/ and supervision/, and only verbs/ imports
them. No imports here: every host call pays for what it loads.
"""
