"""`forge demo` — the main job, on the embedded CPU engine.

Pull the generated `tiny-llama`, pin the demo deployment point, define a deployment-tuning
task over the `hf` engine's knobs with throughput / TTFT-SLO / token-match / stability gates,
run the loop (baseline, candidates, verification, accept or reject, exit), and print what
was decided and how to explore it. The ledger, not this function, holds the state: re-running
on the same workspace resumes an unfinished task, re-reports a delivered one, and continues
one that exited without delivering (it reopens the task, as `forge task reopen` would, and
runs the loop again). A demo that does not deliver says why in one line, with the numbers,
and the command that continues it (`not_delivered`); the CLI exits non-zero with it.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..ledger.titles import candidate_title
from ..ledger.workspace import Workspace
from ..projections.memory import read_memory
from .errors import HarnessError
from .forge_command import activate_hint, forge_command
from .loop.define import define_task
from .loop.engine_evaluator import EngineEvaluator
from .loop.manual import REOPENABLE, reopen_task
from .loop.run import run_task
from .models.weights import pull
from .task import load_task_from_ledger

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO_TASK = EXAMPLES / "tasks" / "demo-tiny-cpu.yaml"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _describe(candidate: dict[str, Any]) -> str:
    # One spelling of a candidate everywhere a person reads it (ledger/titles.py).
    return "baseline (profile as is)" if not candidate else candidate_title(candidate)


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


def not_delivered(home: Path, task_id: str, exit_state: str | None,
                  exit_reason: str | None, program: str = "forge") -> str | None:
    """The one line a demo that did not deliver ends with: why (the exit's own reason, which
    carries the numbers) and the command that continues it (`program`: how the user's shell
    runs forge); None when it delivered."""
    if exit_state == "delivered":
        return None
    forge = f"{program} --home {shlex.quote(str(home))}"
    if exit_state in REOPENABLE:
        how = (f"run `{forge} demo` again to reopen the task and continue (or `{forge} task "
               f"reopen {task_id} --reason R && {forge} task run {task_id}`)")
    elif exit_state is None:  # waiting (a person's approval): nothing exited
        how = f"`{forge} task memory {task_id}` shows what it waits for"
    else:  # failed-budget: the budget is part of the task's definition
        how = ("its budget is part of its definition: run the demo in a fresh home "
               f"(`{program} --home NEW_DIR demo`, NEW_DIR a folder of your choice)")
    return f"the demo did not deliver ({exit_state or 'waiting'}): {exit_reason}; {how}"


def _continue_if_exited(ws: Workspace, task_id: str, echo: Callable[[str], None]) -> None:
    """A demo task that exited without delivering, but may run again, is reopened: running
    `forge demo` again is how a person asks for another try (the issue-31 contract)."""
    mem, _ = read_memory(ws.ledger, task_id)
    if mem.status == "exited" and mem.exit_state in REOPENABLE:
        reopen_task(ws, task_id, f"forge demo run again after {mem.exit_state}: "
                                 f"{mem.exit_reason}")
        echo(f"      it exited {mem.exit_state} ({mem.exit_reason}); reopened, continuing")


def run_demo(ws: Workspace, echo: Callable[[str], None] = print,
             task_file: Path = DEMO_TASK) -> dict[str, Any]:
    """Run the main job in workspace `ws`; returns timings, the candidate table and
    `problem`: the `not_delivered` line, or None."""
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
    if not info["created"]:
        _continue_if_exited(ws, task_id, echo)
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
    forge = f"{forge_command()} --home {shlex.quote(str(home))}"
    activate = activate_hint()
    echo("")
    echo("explore:" + (f" (`{activate}` puts forge on PATH; the README's tour writes bare "
                       "`forge`)" if activate else ""))
    for cmd in (f"{forge} task memory {task_id}", f"{forge} replay {task_id}",
                f"{forge} log --task {task_id}", f"{forge} check"):
        echo(f"  {cmd}")
    return {"task_id": task_id, "exit_state": result.exit_state, "rows": rows,
            "timings": timings, "forge": forge,
            "problem": not_delivered(home, task_id, result.exit_state, result.exit_reason,
                                     forge_command())}
