"""Micro-benchmarks (run as ``PYTHONPATH=tests python -m bench.<name>``)."""
