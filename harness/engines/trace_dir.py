"""Where SGLang writes a capture's traces so that forge can read them: `<FORGE_HOME>/
perf-traces/<capture>/`. A server forge runs in a pinned image gets the trace root mounted
read-write at the same path (sglang.py, whole.py), so `/start_profile`'s `output_dir`
names the same directory inside the container and on the host. Here, below harness/perf,
because the engines mount it and `forge perf capture` writes into it."""

from __future__ import annotations

from pathlib import Path

TRACE_DIR = "perf-traces"


def trace_root(home: Path) -> Path:
    """The directory every capture's own trace directory lives in (made if missing)."""
    root = Path(home) / TRACE_DIR
    root.mkdir(parents=True, exist_ok=True)
    return root
