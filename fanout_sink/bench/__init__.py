"""Micro-benchmarks (run as ``python -m fanout_sink.bench.<name>``)."""
