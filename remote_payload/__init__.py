"""The host side of runner: stdlib only, Python >= 3.8, never importing `runner`.

supervisor.py is the entry script (it binds this directory as this package and calls commands.main); host/,
supervision/ and slurm/ are its rooms; contract.py, admission.py, progress.py and sweep.py the rules that the
controller imports too (docs/design.md has the tree and what each part may import). All of it but payloads/ is
uploaded as one content-addressed bundle; payloads/ (the benchmarks and the demo) are uploaded apart, per job,
each with its own import closure. No imports here."""
