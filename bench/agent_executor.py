"""Agent-executor overhead per decision beside the model's own latency (goal ≤ 5 %).

    .venv/bin/python bench/agent_executor.py [--decisions 20] [--delay 0.2] [--reads 1]

A real workspace and task (baseline measured, so Task Memory is not empty); the model tier
`[models.small]` is `ScriptedChat` answering every request after a fixed `--delay` seconds
(the "model latency"): `--reads` calls of `task_memory`, then `propose`. Each decision is
`AgentExecutor.decide` as the loop calls it: routing, skills (by task type), the prompt, the
`openai` client's calls, tool calls, the prompt/response/tool artifacts, the events. Its
wall time is compared with the sum of the model calls' latencies as the client measured
them (`ModelCalled.latency_s`); the difference is the executor's overhead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from infer_forge.harness.loop.agent_executor import AgentExecutor
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.evaluator_protocol import RunResult
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.task import load_task_from_ledger
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger.workspace import init_workspace, open_workspace
from infer_forge.projections.memory import read_memory

REPO = Path(__file__).resolve().parent.parent


class Instant:
    """The baseline's measurement, in process (the bench times decisions, not evaluation)."""

    def evaluate(self, candidate, *, repeats, ctx):
        return [RunResult({"output_throughput": 100.0, "median_ttft_ms": 50.0,
                           "token_match": 1.0, "failed": 0.0}) for _ in range(repeats)]


def make_task(root: Path) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "points/p.yaml").write_text((REPO / "examples/points/tiny-cpu.yaml").read_text())
    (root / "profiles/tiny-cpu.yaml").write_text(
        (REPO / "examples/profiles/tiny-cpu.yaml").read_text())
    path = root / "tasks/bench.yaml"
    path.write_text("""\
id: bench
type: deployment-tuning
goal: Raise output throughput without breaking the TTFT SLO
point: ../points/p.yaml
scope:
  engine.continuous_batching: [false, true]
  engine.attn_implementation: [sdpa, eager]
contract:
  gates:
    - {name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}
    - {name: ttft-slo, metric: median_ttft_ms, at_most: 500}
    - {name: stability, repeats: 3, max_cv: 0.5}
exit: {max_blocks: 1}
executor: {kind: agent}
""")
    return path


def reply(delay: float, name: str, args: dict) -> dict:
    return {"delay_s": delay, "tool_calls": [{"name": name, "arguments": args}]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=20)
    ap.add_argument("--delay", type=float, default=0.2, help="the model's latency (s)")
    ap.add_argument("--reads", type=int, default=1, help="task_memory calls per decision")
    a = ap.parse_args()
    cand = {"engine.continuous_batching": True, "engine.attn_implementation": "eager"}
    one = [reply(a.delay, "task_memory", {}) for _ in range(a.reads)] + \
        [reply(a.delay, "propose", {"candidate": cand, "sub_goal": "batching with eager"})]
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp, \
            ScriptedChat(one * (a.decisions + 2)) as chat:
        home = Path(tmp) / "home"
        ws, _ = init_workspace(home)
        ws.close()
        with open(home / "forge.toml", "a") as f:
            f.write(f'\n[wiki]\nembeddings = false\n\n[models.small]\nurl = "{chat.url}"\n'
                    'model = "scripted"\nfamily = "bench"\n')
        with open_workspace(home) as ws:
            define_task(ws, make_task(Path(tmp) / "specs"))
            run_task(ws, "bench", evaluator=Instant())  # b1 (baseline), then the block cap
            lt = load_task_from_ledger(ws, "bench")
            mem, _ = read_memory(ws.ledger, "bench")
            ex = AgentExecutor(ws, lt.task)
            rows = []
            for i in range(a.decisions + 2):
                d = ex.decide(mem, lt.task, lt.point, lt.profile)
                assert d.action == "try" and d.candidate == cand, d
                if i >= 2:  # warm-up: the openai import, the first connections
                    rows.append((ex.last.wall_s, ex.last.model_s, ex.last.calls))
    wall = [r[0] for r in rows]
    model = [r[1] for r in rows]
    over = [r[0] - r[1] for r in rows]
    calls = rows[0][2]
    pct = 100 * statistics.median(over) / statistics.median(model)
    print(f"{a.decisions} decisions, {calls} model calls each ({a.reads} task_memory + "
          f"propose), model latency {a.delay * 1000:.0f} ms per call; python "
          f"{sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| figure | median | p90 |")
    print("|---|---|---|")
    for name, xs in (("decision wall (ms)", wall), ("model latency, client-measured (ms)",
                                                   model), ("overhead (ms)", over)):
        q = statistics.quantiles(xs, n=10)[-1] if len(xs) > 1 else xs[0]
        print(f"| {name} | {statistics.median(xs) * 1000:.1f} | {q * 1000:.1f} |")
    print(f"| overhead per model call (ms) | {statistics.median(over) / calls * 1000:.1f} | |")
    print(f"| **overhead / model latency** | **{pct:.2f} %** | goal ≤ 5 % |")


if __name__ == "__main__":
    main()
