"""How much an agent reads when it asks for Task Memory: the compact answer of `task_memory`
(the default) against the detailed one (`detail: true`), after a task of 20 blocks.

    .venv/bin/python bench/task_memory_size.py [--blocks 20]

The task is real: a fresh workspace, the task defined from YAML, the real loop (`run_task`:
a grid sweep over one scope key) measuring each block with the real command evaluator (a
small Python script: 3 repeats a block, its stdout and stderr kept as artifacts, the host's
state recorded), the gates judged, every block handed off and decided. The answers are the
real tool's (`task_memory` through the agent tool registry, as the MCP server and the agent
executor call it), measured as the JSON text the agent receives; the whole memory's size is
its JSON (the tool refuses `detail: true` past what one result holds, 60,000 characters).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from infer_forge.harness.agents import tool_registry as T
from infer_forge.harness.agents.task_tools import TOOLS
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.memory import read_memory

REPO = Path(__file__).resolve().parent.parent

# Throughput rises a little with the value and TTFT with it: past 120 the TTFT gate fails,
# and no candidate beats the baseline by 5 %: every candidate is rejected, for one reason or
# another, and the task ends on its block budget.
EVALUATOR = """\
import json, os
c = json.loads(os.environ["FORGE_CANDIDATE"])
v = c.get("engine.cb_num_blocks", 0)
r = int(os.environ["FORGE_REPEAT"])
print(f"candidate {c} repeat {r}")
print(json.dumps({"output_throughput": 100 + (v % 40) * 0.1 + r * 0.01,
                  "median_ttft_ms": 40 + v * 0.5, "token_match": 1.0, "failed": 0}))
"""


def task_yaml(root: Path, blocks: int) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for rel in ("points/tiny-cpu.yaml", "profiles/tiny-cpu.yaml"):
        (root / rel).write_text((REPO / "examples" / rel).read_text())
    (root / "tasks/eval.py").write_text(EVALUATOR)
    values = ", ".join(str(8 * (i + 1)) for i in range(blocks))
    path = root / "tasks/size.yaml"
    path.write_text(f"""\
id: size
type: deployment-tuning
goal: Raise output throughput at concurrency 8 without breaking the TTFT SLO
point: ../points/tiny-cpu.yaml
scope:
  engine.cb_num_blocks: [{values}]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
    - {{name: ttft-slo, metric: median_ttft_ms, at_most: 100}}
    - {{name: correctness, metric: token_match, at_least: 0.99}}
    - {{name: stability, repeats: 3, max_cv: 0.10, max_failed_requests: 0}}
exit: {{max_blocks: {blocks}, no_progress_blocks: {blocks + 5}, max_wall_s: 3600}}
evaluator: {{kind: command, argv: [{json.dumps(sys.executable)}, eval.py]}}
""")
    return path


def detailed_size(ctx: T.ToolContext) -> tuple[int, str]:
    """The whole memory's JSON size (what `detail: true` answers while it fits in a tool
    result) and what the tool answers for it."""
    mem, _ = read_memory(ctx.ws.ledger, "size")
    size = len(json.dumps(mem.model_dump(mode="json"), sort_keys=True, default=str).encode())
    res = T.call(ctx, "task_memory", {"task_id": "size", "detail": True})
    return size, (f"{len(res.text().encode())} bytes" if res.ok else f"refused: {res.error}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--show", action="store_true", help="print the compact answer")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws, _ = init_workspace(root / "home")
        define_task(ws, task_yaml(root / "specs", args.blocks))
        t0 = time.perf_counter()
        r = run_task(ws, "size")
        loop_s = time.perf_counter() - t0
        ctx = T.ToolContext(ws, E.Actor(kind="agent", name="bench/1"),
                            tools=T.registry(TOOLS))
        res = T.call(ctx, "task_memory", {"task_id": "size"})
        assert res.ok, res.error
        compact = res.text()
        detail, detail_answer = detailed_size(ctx)
        block = T.call(ctx, "task_memory", {"task_id": "size", "block_id": "b2"}).text()
        ws.close()
    n = len(compact.encode())
    print(f"task: {r.blocks} blocks, exit {r.exit_state} ({loop_s:.1f} s)")
    print(f"task_memory (compact, default): {n} bytes")
    print(f"the whole memory (detail: true): {detail} bytes of JSON; the tool: {detail_answer}")
    print(f"one block's record (block_id: b2): {len(block.encode())} bytes")
    print(f"ratio whole/compact: {detail / n:.1f}x")
    if args.show:
        print(json.dumps(json.loads(compact), indent=1))


if __name__ == "__main__":
    main()
