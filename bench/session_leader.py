"""What the session leader costs a command: `Popen` of `true` to its exit, started through
`proc.session_launch` (the leader that kills the whole session when forge dies) and through
the bare `setpriv --pdeathsig KILL` it replaced (the command's children outlived forge),
interleaved call by call in one process.

    .venv/bin/python bench/session_leader.py [--calls 100]

Prints both medians and p90s and the ratio; a command that takes seconds (a verification
step, a build) pays the difference of the medians once.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time

from infer_forge.harness.proc import session_launch


def bare(argv: list[str]) -> tuple[list[str], dict]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SystemExit("setpriv is not on PATH: nothing to compare the leader with")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv], {"start_new_session": True}


def once(launcher) -> float:
    launch, guard = launcher(["true"])
    t = time.perf_counter()
    p = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **guard)
    p.communicate()
    assert p.returncode == 0, p.returncode
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    modes = {"setpriv only": bare, "session leader": session_launch}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for m in modes:  # warm-up
        once(modes[m])
    for i in range(args.calls):
        order = list(modes) if i % 2 == 0 else list(modes)[::-1]
        for m in order:
            times[m].append(once(modes[m]))
    for m, xs in times.items():
        xs.sort()
        print(f"{m}: median {statistics.median(xs) * 1e3:.1f} ms, "
              f"p90 {xs[int(0.9 * len(xs))] * 1e3:.1f} ms")
    lead, base = (statistics.median(times[m]) for m in ("session leader", "setpriv only"))
    print(f"the leader adds {(lead - base) * 1e3:.1f} ms per command (ratio {lead / base:.1f}x)")


if __name__ == "__main__":
    main()
