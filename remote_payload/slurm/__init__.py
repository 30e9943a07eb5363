"""`launcher: slurm` on the host side. batch.py and states.py are pure shared rules (the controller imports them
too); launch.py and array.py submit, follow and cancel Slurm jobs and run one in its allocation. No imports here.
"""
