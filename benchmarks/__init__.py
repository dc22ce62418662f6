"""Serving benchmarks: ``python -m benchmarks --help``; see docs/benchmarks/README.md."""
