"""The chaos soak: ``python -m benchmarks.soak --help``; see ``run.py`` for what one run does."""
