"""The Marlin int4 MoE throughput benchmark: bench_marlin_moe.py and the marlin_*.py it imports (as top-level
modules: on the host the script's directory is sys.path[0]). Tests import them as this package."""
