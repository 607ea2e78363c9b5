"""Micro-benchmarks (run as ``python -m fanout_sink.devtools.bench.<name>``)."""
