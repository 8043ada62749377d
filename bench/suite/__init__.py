"""The maintained benchmarks: run each from the repository root as `python -m bench.suite.<name>`."""
