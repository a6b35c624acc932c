"""Benchmarks for the gateway: ``python -m perf.bench`` (see perf/README.md). Never collected by pytest."""
