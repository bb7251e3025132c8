"""Profiling a running engine under load (`forge perf`): capture (capture.py) and the pure
summaries of the traces it collects (summary.py)."""
