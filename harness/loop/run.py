"""The automatic loop: `run_task` runs (or resumes) a task's loop blocks until it exits or its
executor waits for a person; `exit_due` checks the exit criteria between blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.workspace import Workspace
from ...projections.memory import BlockRecord, TaskMemory, read_memory
from ...repos.errors import RepoError
from ..errors import HarnessError
from ..task import LOOP_ACTOR, LoadedTask, Progress, load_task_from_ledger
from . import code
from .command_evaluator import make_evaluator
from .decision import Executor, describe
from .define import define_task
from .evaluator_protocol import Evaluator
from .executors import CommandExecutor, make_executor
from .human_gate import AwaitingApproval, gate_acceptance
from .routing import route
from .steps import (
    Stepper,
    contenders,
    decide_events,
    handoff_text,
    measure_events,
    start_events,
    stop_events,
    verify_event,
    wall_elapsed,
)


@dataclass
class LoopResult:
    task_id: str
    status: str
    exit_state: str | None
    exit_reason: str | None
    blocks: int
    memory: TaskMemory


def _baseline_problem(base: BlockRecord) -> tuple[str, str, list[str]] | None:
    """(exit state, reason, evidence) when a measured baseline blocks the task."""
    runs = base.runs()
    if runs and not any(r.success for r in runs):
        return ("failed-blocked", "every baseline run failed: "
                + "; ".join(sorted({m["error"] or "?" for m in base.measurements}))[:300],
                [m["event_id"] for m in base.measurements])
    stab = [g for g in (base.verification["gates"] if base.verification else [])
            if g.get("kind") == "stability"]
    if stab and stab[0].get("verdict") == "fail":
        return ("failed-unverifiable", f"the baseline is not stable: {stab[0]['reason']}",
                [base.verification["event_id"]])  # type: ignore[index]
    return None


def _measure_baseline(mem: TaskMemory) -> bool:
    """Whether the next block measures the baseline: the first block, or, in a reopened
    task, when no baseline was measured or the one measured before the reopen blocked it."""
    if not mem.execution_record:
        return True
    if mem.reopened_after is None:
        return False
    base = mem.baseline_block()
    return base is None or (mem.before_reopen(base) and _baseline_problem(base) is not None)


def exit_due(lt: LoadedTask, mem: TaskMemory, max_wall_s: float | None = None
             ) -> tuple[str, str, list[str], str | None] | None:
    """(state, reason, evidence, handoff) when the task must exit now, between blocks.
    `max_wall_s` (a caller's cap, e.g. a graph node's) tightens the task's own wall budget."""
    ex = lt.task.exit
    wall = min(ex.max_wall_s, max_wall_s) if max_wall_s else ex.max_wall_s
    if mem.accepted and ex.when == "all_gates_pass":
        a = mem.accepted[-1]
        return ("delivered", f"{describe(a['candidate'])} passed every gate of the contract",
                [a["event_id"], a["verification_event_id"]], None)
    base = mem.baseline_block()
    # A baseline from before a reopen does not block: the loop measures it again.
    if base is not None and base.status == "handed-off" and not mem.before_reopen(base):
        problem = _baseline_problem(base)
        if problem is not None:
            return (*problem, None)
    if len(mem.execution_record) >= ex.max_blocks:
        return ("failed-budget", f"block budget spent: {len(mem.execution_record)} of "
                f"{ex.max_blocks} blocks", [b.block_id for b in mem.execution_record],
                handoff_text(mem))
    elapsed = wall_elapsed(mem)
    if elapsed >= wall:
        return ("failed-budget", f"wall-time budget spent: {elapsed:.0f}s of {wall:.0f}s",
                [], handoff_text(mem))
    if mem.no_progress_streak >= ex.no_progress_blocks:
        last = mem.execution_record[-mem.no_progress_streak:]
        return ("failed-no-progress", f"{mem.no_progress_streak} blocks in a row without "
                "measurable progress", [b.block_id for b in last], handoff_text(mem))
    over = model_budget_spent(lt, mem)
    if over is not None:
        return ("failed-budget", over, [], handoff_text(mem))
    return None


def model_budget_spent(lt: LoadedTask, mem: TaskMemory) -> str | None:
    """Why the task's model budget (exit.max_tokens, exit.max_cost_usd) is spent, or None."""
    ex, tokens = lt.task.exit, mem.model_tokens_in + mem.model_tokens_out
    if ex.max_tokens is not None and tokens >= ex.max_tokens:
        return f"token budget spent: {tokens} of {ex.max_tokens} tokens in {mem.model_calls} " \
            "model calls"
    if ex.max_cost_usd is not None and mem.model_cost_usd >= ex.max_cost_usd:
        return f"cost budget spent: ${mem.model_cost_usd:.4f} of ${ex.max_cost_usd:.4f} in " \
            f"{mem.model_calls} model calls"
    return None


def run_task(ws: Workspace, task_id: str, *, evaluator: Evaluator | None = None,
             executor: Executor | None = None, progress: Progress | None = None,
             max_wall_s: float | None = None) -> LoopResult:
    """Run (or resume) a task's loop until it exits or waits for a person: its executor's
    (manual) or an acceptance's approval (`contract.human: required`, human_gate.py)."""
    try:
        return _run(ws, task_id, evaluator=evaluator, executor=executor, progress=progress,
                    max_wall_s=max_wall_s)
    except AwaitingApproval as w:
        (progress or (lambda _s: None))(f"waiting: {w}")
        mem, _ = read_memory(ws.ledger, task_id)
        return LoopResult(task_id, "waiting", None, str(w), len(mem.execution_record), mem)


def _run(ws: Workspace, task_id: str, *, evaluator: Evaluator | None,
         executor: Executor | None, progress: Progress | None,
         max_wall_s: float | None) -> LoopResult:
    say = progress or (lambda _s: None)
    lt = load_task_from_ledger(ws, task_id)
    st = Stepper(ws, lt, say)
    executor = executor or make_executor(lt.task, ws=ws, base_dir=lt.base_dir)
    if evaluator is None and executor.kind != "manual":
        # Before anything is recorded: a task without an evaluator records nothing.
        evaluator = make_evaluator(ws, lt.task, lt.profile, base_dir=lt.base_dir)
    model_tiers = {k: v for k, v in ws.config.settings.model_tiers.model_dump().items() if v}
    models = ws.config.settings.models
    while True:
        mem, version = read_memory(ws.ledger, task_id)
        if executor.kind == "manual" and mem.status != "exited":
            d = executor.decide(mem, lt.task, lt.point, lt.profile)
            say(f"waiting: {d.reason}")
            return LoopResult(task_id, "waiting", None, d.reason, len(mem.execution_record), mem)
        if mem.status == "exited":
            code.release(ws, lt)  # the task's worktrees go (branches and refs stay)
            say(f"exited {mem.exit_state}: {mem.exit_reason}")
            return LoopResult(task_id, mem.status, mem.exit_state, mem.exit_reason,
                              len(mem.execution_record), mem)
        blk = mem.current_block
        if blk is None:
            due = exit_due(lt, mem, max_wall_s)
            if due is not None:
                state, reason, evidence, handoff = due
                if state in ("failed-budget", "failed-no-progress") \
                        and lt.task.exit.when == "best_in_scope" and contenders(mem):
                    # Out of budget, but a passing candidate is in hand: deliver the best.
                    evs, also = gate_acceptance(ws, lt, stop_events(st, mem, reason, None))
                    st.save(f"exit:v{version}", evs, version, also=also, memory=mem)
                    continue
                st.save(f"exit:v{version}",
                        [E.TaskExited(state=state, reason=reason, evidence=evidence,
                                      handoff=handoff, **st.common())], version, memory=mem)
                continue
            index = len(mem.execution_record) + 1
            bid = f"b{index}"
            routing = route(lt.task, mem.no_progress_streak, model_tiers, models)
            again = _measure_baseline(mem)
            if again:
                decision_cand: dict[str, Any] = {}
                sub_goal = "measure the baseline: the runtime profile's own configuration"
                actor, tool_ev, decided = LOOP_ACTOR, None, []
            else:
                if isinstance(executor, CommandExecutor) and code.code_members(lt):
                    executor.env = code.worktree_env(ws, lt)  # where it may edit the code
                d = executor.decide(mem, lt.task, lt.point, lt.profile)
                if d.action == "wait":
                    say(f"waiting: {d.reason}")
                    return LoopResult(task_id, "waiting", None, d.reason,
                                      len(mem.execution_record), mem)
                if d.action == "stop":
                    also = []
                    if d.exit_state is None:
                        evs, also = gate_acceptance(ws, lt, stop_events(st, mem, d.reason,
                                                                         d.handoff))
                    else:  # an executor that cannot go on (its endpoint down, its budget)
                        evs = [E.TaskExited(state=d.exit_state, reason=d.reason,
                                            handoff=d.handoff or handoff_text(mem),
                                            **st.common())]
                    if d.tool_event is not None:
                        evs.insert(0, d.tool_event.model_copy(update=st.common()))
                    # What deciding recorded (model calls, failed steps): task-level.
                    upd = {"task_id": task_id, "block_id": None}
                    evs[:0] = [e.model_copy(update=upd) for e in d.events]
                    st.save(f"stop:v{version}", evs, version, also=also, memory=mem)
                    continue
                decision_cand, sub_goal = d.candidate, d.sub_goal
                actor, tool_ev, decided = d.actor or LOOP_ACTOR, d.tool_event, d.events
            problem = None
            try:  # a code candidate's commits, as full ids (a ref moves; a commit does not)
                decision_cand = code.resolve(ws, lt, decision_cand)
            except HarnessError as e:
                problem = str(e)
            st.save(f"{bid}:start", start_events(st, mem, bid, index, sub_goal, routing,
                                                  decision_cand, actor, tool_ev,
                                                  measure_again=again, problem=problem,
                                                  decided=decided),
                    version, memory=mem)
            continue
        if not blk.measurements:
            assert evaluator is not None
            say(f"begin {blk.block_id}:measure {describe(blk.candidate)}")
            try:
                evs = measure_events(st, mem, blk, evaluator)
            except (HarnessError, RepoError) as e:
                st.save(f"{blk.block_id}:blocked", [
                    E.LoopBlockHandedOff(outcome="failed", state_reached="evaluator failed",
                                         findings=[str(e)], **st.common(blk.block_id)),
                    E.TaskExited(state="failed-blocked", reason=f"evaluator failed: {e}",
                                 evidence=[blk.block_id], **st.common())],
                    version, memory=mem)
                continue
            sid = code.snapshot(ws, lt, f"task {task_id} {blk.block_id} measured")
            st.save(f"{blk.block_id}:measure", code.with_snapshot(evs, sid), version,
                    memory=mem)
        elif blk.verification is None:
            evs = verify_event(st, blk, mem).events
            sid = code.snapshot(ws, lt, f"task {task_id} {blk.block_id} verified")
            st.save(f"{blk.block_id}:verify", code.with_snapshot(evs, sid), version,
                    memory=mem)
        else:
            evs, also = gate_acceptance(ws, lt, decide_events(st, blk, mem, executor))
            evs = code.keep_refs(ws, lt, blk.block_id, blk.candidate, evs)
            st.save(f"{blk.block_id}:handoff", evs, version, also=also, memory=mem)


def run_task_file(ws: Workspace, path: str | Path, *, task_id: str | None = None,
                  max_wall_s: float | None = None, progress: Progress | None = None
                  ) -> LoopResult:
    """Define (idempotently) and run a task from its YAML file: the entry for graph nodes."""
    info = define_task(ws, path, task_id=task_id)
    return run_task(ws, info["task_id"], progress=progress, max_wall_s=max_wall_s)
