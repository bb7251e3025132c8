"""The test suite's wall time: the way it runs now (two pytest-xdist workers, the CLI tests'
`forge` in the test's process) against the way it ran before (one process, every `forge` a
subprocess: FORGE_TEST_CLI=process), on the same test files, one after the other.

    .venv/bin/python bench/suite.py [--files tests/cli tests/ledger ...] [--workers 2]

Prints both wall times and the ratio. The whole suite's figures (`make test`) are in
bench/RESULTS.md; this runs a part of it so the comparison takes minutes, not half an hour.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ["tests/cli", "tests/ledger/test_ledger_integrity.py",
           "tests/harness/guard/test_approvals.py", "tests/harness/nodes",
           "tests/projections/test_queries.py"]


def run(files: list[str], *, workers: int, in_process: bool) -> tuple[float, str]:
    env = {**os.environ, "FORGE_TEST_CLI": "" if in_process else "process"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    if workers > 1:
        argv += ["-n", str(workers), "--dist", "loadfile"]
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    last = (r.stdout.strip().splitlines() or ["?"])[-1]
    if r.returncode != 0:
        sys.exit(f"suite: pytest failed ({'now' if in_process else 'before'}): {last}")
    return wall, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="+", default=DEFAULT)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    before, b_line = run(a.files, workers=1, in_process=False)
    print(f"before (1 process, forge as a subprocess): {before:7.1f} s  [{b_line}]", flush=True)
    now, n_line = run(a.files, workers=a.workers, in_process=True)
    print(f"now ({a.workers} workers, forge in process):       {now:7.1f} s  [{n_line}]")
    print(f"ratio now/before: {now / before:.2f} (x{before / now:.2f} faster)")


if __name__ == "__main__":
    main()
