"""Following a sandboxed call's processes from the host.

A call runs in its own pid namespace (harness/guard/sandbox.py): the pids it shows (`$$`, a
pid file) are the namespace's, not the host's. A test that must watch a call's processes
finds them on the host by what they run: `processes_naming(text)`, the live processes whose
command line holds `text` (a path unique to the test), by host pid with their start times.
"""

from __future__ import annotations

import os
from pathlib import Path

from infer_forge.harness.proc import alive, start_time


def processes_naming(text: str) -> dict[int, str]:
    """Live processes (not this one, not zombies) whose command line holds `text`: pid ->
    start time (so that `still_alive` does not mistake a reused pid for one of them)."""
    out: dict[int, str] = {}
    needle = text.encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes()
        except OSError:
            continue
        pid = int(d.name)
        if needle in cmdline and alive(pid):
            out[pid] = start_time(pid)
    return out


def still_alive(procs: dict[int, str]) -> list[int]:
    """The ones of `procs` (from `processes_naming`) still running."""
    return sorted(pid for pid, start in procs.items() if alive(pid, start))
