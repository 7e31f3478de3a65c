"""Standalone benchmarks: `python3 -m benchmarks.<name>` prints figures."""
