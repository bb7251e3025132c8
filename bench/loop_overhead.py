"""Task-loop bookkeeping overhead: a loop with an instant in-process evaluator vs. writing the
same number of saves straight to the ledger (same process, same machine).

    .venv/bin/python bench/loop_overhead.py [--blocks 40]

The loop re-derives Task Memory from the ledger before every step (that is what makes
kill -9/resume safe); this measures what that costs per block.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.evaluator_protocol import RunResult
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import events as E
from infer_forge.ledger.store import Append
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace

REPO = Path(__file__).resolve().parent.parent


class Instant:
    def evaluate(self, candidate, *, repeats, ctx):
        x = 100.0 + len(str(candidate)) % 7
        return [RunResult({"output_throughput": x, "median_ttft_ms": 50.0, "token_match": 1.0,
                           "failed": 0.0}) for _ in range(repeats)]


def task_yaml(root: Path, blocks: int) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "points/p.yaml").write_text((REPO / "examples/points/tiny-cpu.yaml").read_text())
    (root / "profiles/tiny-cpu.yaml").write_text(
        (REPO / "examples/profiles/tiny-cpu.yaml").read_text())
    blocks_list = ", ".join(str(8 * (i + 1)) for i in range(blocks))
    path = root / "tasks/bench.yaml"
    path.write_text(f"""\
id: bench
type: deployment-tuning
goal: bench
point: ../points/p.yaml
scope:
  engine.cb_num_blocks: [{blocks_list}]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 10}}
    - {{name: stability, repeats: 3, max_cv: 0.5}}
exit: {{max_blocks: {blocks + 5}, no_progress_blocks: {blocks + 5}}}
""")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws, _ = init_workspace(root / "loop")
        define_task(ws, task_yaml(root / "specs", args.blocks))
        t0 = time.perf_counter()
        r = run_task(ws, "bench", evaluator=Instant())
        loop_s = time.perf_counter() - t0
        saves = sum(1 for c in ws.ledger.log(include_bookkeeping=True)
                    if c.type == "CommandHandled") - 1
        n_events = ws.ledger.version(task_stream("bench")) - 1
        ws.close()
        # Baseline: the same number of saves with similar events, no loop logic.
        raw, _ = init_workspace(root / "raw")
        per = max(1, n_events // saves)
        t0 = time.perf_counter()
        for i in range(saves):
            evs = [E.MeasurementRecorded(run_id=f"r{i}-{k}", source="bench",
                                         metrics={"output_throughput": 1.0}, task_id="raw",
                                         block_id=f"b{i}") for k in range(per)]
            raw.ledger.save(Append(task_stream("raw"), evs), command_id=f"raw:{i}")
        raw_s = time.perf_counter() - t0
        raw.close()
    print(f"loop: {r.blocks} blocks, {saves} saves, {n_events} events in {loop_s:.3f}s "
          f"({1000 * loop_s / r.blocks:.1f} ms/block); exit {r.exit_state}")
    print(f"raw ledger: {saves} saves in {raw_s:.3f}s ({1000 * raw_s / saves:.1f} ms/save)")
    print(f"ratio loop/raw: {loop_s / raw_s:.2f}x")


if __name__ == "__main__":
    main()
