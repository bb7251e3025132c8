"""`forge demo` — the main job, on the embedded CPU engine.

Pull the generated `tiny-llama`, pin the demo deployment point, define a deployment-tuning
task over the `hf` engine's knobs with throughput / TTFT-SLO / token-match / stability gates,
run the loop (baseline, candidates, verification, accept or reject, exit), and print what
was decided and how to explore it. Re-running on the same workspace resumes or re-reports:
the ledger, not this function, holds the state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..ledger.workspace import Workspace
from .errors import HarnessError
from .loop.define import define_task
from .loop.engine_evaluator import EngineEvaluator
from .loop.run import run_task
from .models.weights import pull
from .task import load_task_from_ledger

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_TASK = EXAMPLES / "tasks" / "demo-tiny-cpu.yaml"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _describe(candidate: dict[str, Any]) -> str:
    if not candidate:
        return "baseline (profile as is)"
    return ", ".join(f"{k.removeprefix('engine.')}={v}" for k, v in sorted(candidate.items()))


def candidate_table(memory: Any) -> list[dict[str, Any]]:
    """One row per loop block: candidate, medians of the gated metrics, verdict, decision."""
    rows = []
    for b in memory.execution_record:
        ver = b.verification or {}
        rows.append({
            "block": b.block_id,
            "candidate": _describe(b.candidate),
            "output_throughput": b.median("output_throughput"),
            "median_ttft_ms": b.median("median_ttft_ms"),
            "token_match": b.median("token_match"),
            "verdict": ver.get("verdict", "-"),
            "decision": b.decision or ("baseline" if b.is_baseline else "-"),
            "reason": b.decision_reason or "",
        })
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = f"{'block':<6} {'candidate':<44} {'tok/s':>8} {'TTFT p50':>9} {'match':>6} " \
           f"{'verdict':<12} decision"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['block']:<6} {r['candidate'][:44]:<44} {_fmt(r['output_throughput'], '8.1f')} "
            f"{_fmt(r['median_ttft_ms'], '9.1f')} {_fmt(r['token_match'], '6.3f')} "
            f"{r['verdict']:<12} {r['decision']}")
        if r["reason"] and r["decision"] == "rejected":
            lines.append(f"{'':<7}why: {r['reason'][:150]}")
    return "\n".join(lines)


def run_demo(ws: Workspace, echo: Callable[[str], None] = print,
             task_file: Path = DEMO_TASK) -> dict[str, Any]:
    """Run the main job in workspace `ws`; returns timings and the candidate table."""
    if not task_file.is_file():
        raise HarnessError(f"{task_file}: the demo task file is missing (a source checkout "
                           "holds it under examples/tasks/)")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    echo(f"[1/4] workspace {ws.home}")
    echo("[2/4] pulling tiny-llama (generated offline from a fixed seed; no download)")
    t = time.monotonic()
    model = pull(ws, "tiny-llama")
    timings["pull_s"] = time.monotonic() - t
    echo(f"      {model.path}  {model.digest}")
    echo(f"[3/4] pinning the deployment point and defining the task ({task_file.name})")
    info = define_task(ws, task_file)
    task_id = info["task_id"]
    echo(f"      task {task_id}  point {info['point_hash'][:19]}  "
         f"{'defined' if info['created'] else 'already defined: resuming'}")
    echo("[4/4] running the loop: baseline, candidates, gates, accept or reject")
    t = time.monotonic()
    lt = load_task_from_ledger(ws, task_id)
    evaluator = EngineEvaluator(ws, lt.task)
    result = run_task(ws, task_id, evaluator=evaluator,
                      progress=lambda s: echo(f"      {time.monotonic() - t0:6.1f}s  {s}"))
    timings["loop_s"] = time.monotonic() - t
    timings["total_s"] = time.monotonic() - t0
    rows = candidate_table(result.memory)
    echo("")
    echo(format_table(rows))
    echo("")
    echo(f"exit: {result.exit_state} — {result.exit_reason}")
    echo(f"wall time {timings['total_s']:.0f}s (pull {timings['pull_s']:.1f}s, "
         f"loop {timings['loop_s']:.0f}s)")
    home = ws.home
    echo("")
    echo("explore:")
    for cmd in (f"forge --home {home} task memory {task_id}",
                f"forge --home {home} replay {task_id}",
                f"forge --home {home} log --task {task_id}",
                f"forge --home {home} check"):
        echo(f"  {cmd}")
    return {"task_id": task_id, "exit_state": result.exit_state, "rows": rows,
            "timings": timings}
