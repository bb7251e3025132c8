"""`forge reproduce` wall time for the demo's block (issue 15, item 5).

Runs the demo (`run_demo`, the real main job on the embedded engine) in a fresh temporary
workspace, or uses the demo workspace given with `--home`, then reproduces the demo's
accepted block (its DeliverableAccepted id; when the demo accepted nothing, e.g. an unstable
baseline on a loaded machine, its last measured block, and it says so) `--times` times.
Prints each reproduction's wall time (resolve, model check, engine start, warm-up, greedy
outputs, the contract's repeats of the benchmark, judging, recording) with its verdict and
figures, then a JSON summary as the last line.

    .venv/bin/python bench/reproduce.py [--home DIR] [--times N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, help="A workspace where the demo has run.")
    ap.add_argument("--times", type=int, default=1, help="Reproductions to time.")
    args = ap.parse_args()

    from infer_forge.harness.demo import run_demo
    from infer_forge.harness.loop.reproduce import lines, reproduce
    from infer_forge.ledger.workspace import init_workspace, open_workspace
    from infer_forge.projections.memory import task_memory

    made = args.home is None
    home = Path(tempfile.mkdtemp(prefix="forge-repro-bench-")) if made else args.home
    try:
        if made:
            ws, _ = init_workspace(home)
            t = time.monotonic()
            info = run_demo(ws, echo=lambda _s: None)
            print(f"demo: {info['exit_state']} in {time.monotonic() - t:.0f}s")
            task_id = info["task_id"]
        else:
            ws = open_workspace(home)
            task_id = "demo-tune-tiny-cpu"
        mem = task_memory(ws.ledger, task_id)
        if mem.accepted:
            acc = mem.accepted[-1]
            ident, what = acc["event_id"], f"accepted block {acc['block_id']}"
        else:
            blk = [b for b in mem.execution_record if b.measurements][-1]
            ident, what = f"{task_id}:{blk.block_id}", f"block {blk.block_id} (nothing accepted)"
        print(f"reproducing the demo's {what}: {ident}")
        walls, verdicts = [], []
        for i in range(args.times):
            t = time.monotonic()
            ev = reproduce(ws, ident)
            walls.append(time.monotonic() - t)
            verdicts.append(ev.reproduced)
            print(f"[{i + 1}/{args.times}] wall {walls[-1]:.1f}s")
            print("\n".join(lines(ev)))
        ws.close()
        print(json.dumps({"bench": "reproduce", "target": what, "times": args.times,
                          "wall_s": [round(w, 1) for w in walls],
                          "median_wall_s": round(statistics.median(walls), 1),
                          "reproduced": verdicts}))
    finally:
        if made:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
