"""The demo on a busy machine: does the main job deliver, and the same candidate, under load?

Runs `forge demo` (the real CLI, the real embedded engine) N times with a CPU load generator
occupying `--load-cores` cores (default 1.5 of this machine's 2: busy-loop child processes
with a duty cycle, started and killed by their PID) and N times with none, alternating so that
other work on the machine weighs on both alike; each run in a fresh FORGE_HOME under a
temporary directory removed at the end. Prints each run (delivered or the demo's one-line
reason and its table of blocks, the accepted candidate, wall time, the load average at its
start), the delivered
counts, whether every accepted candidate is the same one, and the median wall time under load
beside the quiet one.

Exit 0 when the issue-31 acceptance holds: every quiet run delivered, at least 90% of the
loaded ones did, and every delivered run accepted the same candidate; 1 otherwise.

    .venv/bin/python bench/demo_under_load.py [--runs 10] [--load-cores 1.5] [--no-wiki]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TASK = "demo-tune-tiny-cpu"
FORGE = [str(Path(sys.executable).parent / "forge")]  # the installed CLI, as a user runs it
PERIOD_S = 0.1  # one duty cycle of the load generator: busy for duty * PERIOD_S, then idle

LOADER = """
import sys, time
duty, period = float(sys.argv[1]), float(sys.argv[2])
while True:
    t = time.monotonic()
    while time.monotonic() - t < duty * period:
        pass
    time.sleep((1 - duty) * period)
"""


@contextmanager
def cpu_load(cores: float) -> Iterator[list[int]]:
    """`ceil(cores)` busy-loop children, each busy `cores / ceil(cores)` of the time; killed
    (their own process groups, by PID) on the way out, whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []
    if cores > 0:
        n = math.ceil(cores)
        duty = cores / n
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", LOADER, str(duty),
                                           str(PERIOD_S)], start_new_session=True))
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def forge(home: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, "--home", str(home), *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "FORGE_HOME": str(home)})


def one_run(home: Path, wiki: bool) -> dict[str, object]:
    """One demo in a fresh home: delivered or not, its one-line reason, the accepted
    candidate, wall time, and the 1-minute load average when it started."""
    load = os.getloadavg()[0]
    t = time.monotonic()
    r = forge(home, "demo", *([] if wiki else ["--no-wiki"]))
    wall = time.monotonic() - t
    mem = forge(home, "task", "memory", TASK, "--json")
    memory = json.loads(mem.stdout) if mem.returncode == 0 else {}
    accepted = memory.get("accepted") or []
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    out = r.stdout.splitlines()
    start = next((i for i, ln in enumerate(out) if ln.startswith("block ")), len(out))
    table = [ln for ln in out[start:] if ln.strip() and not ln.startswith("-")]
    table = table[:next((i for i, ln in enumerate(table) if ln.startswith("exit:")),
                        len(table))]
    return {"rc": r.returncode, "delivered": memory.get("exit_state") == "delivered",
            "exit_state": memory.get("exit_state"),
            "why": errors[-1] if errors else "",
            "candidate": accepted[0]["candidate"] if accepted else None,
            "wall_s": wall, "load_at_start": load, "table": table}


def describe(candidate: object) -> str:
    if not isinstance(candidate, dict):
        return "-"
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in sorted(candidate.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="Demo runs per condition.")
    ap.add_argument("--load-cores", type=float, default=1.5,
                    help="Cores the load generator keeps busy during the loaded runs.")
    ap.add_argument("--no-wiki", action="store_true", help="Skip the index + wiki build.")
    args = ap.parse_args()
    if args.runs < 1 or args.load_cores <= 0:
        ap.error("--runs must be at least 1 and --load-cores above 0")

    root = Path(tempfile.mkdtemp(prefix="forge-demo-load-"))
    results: dict[str, list[dict[str, object]]] = {"quiet": [], "load": []}
    try:
        for i in range(args.runs):
            for cond in ("quiet", "load"):  # alternate: the machine's other work hits both
                with cpu_load(args.load_cores if cond == "load" else 0):
                    res = one_run(root / f"{cond}-{i}", wiki=not args.no_wiki)
                results[cond].append(res)
                print(f"{cond:<5} run {i + 1:>2}: "
                      f"{'delivered' if res['delivered'] else res['exit_state']:<20} "
                      f"rc={res['rc']}  {res['wall_s']:6.1f}s  load@start "
                      f"{res['load_at_start']:.2f}  accepted: {describe(res['candidate'])}",
                      flush=True)
                if not res["delivered"]:  # why, and the blocks that led there
                    print(f"          {res['why']}", flush=True)
                    for ln in res["table"]:  # type: ignore[attr-defined]
                        print(f"          {ln}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print()
    candidates = {json.dumps(r["candidate"], sort_keys=True)
                  for rs in results.values() for r in rs if r["delivered"]}
    for cond, rs in results.items():
        walls = [float(r["wall_s"]) for r in rs]  # type: ignore[arg-type]
        print(f"{cond:<5} delivered {sum(bool(r['delivered']) for r in rs)}/{len(rs)}  "
              f"median wall {statistics.median(walls):.1f}s  "
              f"(min {min(walls):.1f}, max {max(walls):.1f})")
    print(f"accepted candidates: {len(candidates)} distinct "
          f"({'; '.join(describe(json.loads(c)) for c in sorted(candidates)) or 'none'})")
    quiet_ok = all(r["delivered"] for r in results["quiet"])
    load_ok = sum(bool(r["delivered"]) for r in results["load"]) >= math.ceil(0.9 * args.runs)
    ok = quiet_ok and load_ok and len(candidates) == 1
    print(f"acceptance (quiet all, load >= 90%, one candidate): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
