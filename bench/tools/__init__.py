"""Checks and diagnostics of the generated modules: `python -m bench.tools.<name>` from the repository root."""
