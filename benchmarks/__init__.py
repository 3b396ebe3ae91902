"""The nous_session benchmark harness: ``python benchmarks/run.py`` (see benchmarks/README.md)."""
