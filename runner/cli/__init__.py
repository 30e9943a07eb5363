"""The `runner` command line (cli: the entry point `runner.cli.cli:main`, the only module that prints errors and
exits), its output on stderr and stdout (cli_echo), the commands on a fleet run (fleet_cli), and `runner
watch`'s live view (watch).

The top folder: may import every other one.
"""
