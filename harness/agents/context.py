"""What an agent reads: the agent executor's prompts, and the task, its prior tasks and its
Task Memory as the model sees them (compact JSON views; the whole memory is one `task_memory`
call away).
"""

from __future__ import annotations

from typing import Any

from ...ledger.specs import Range, TaskDefinition
from ...ledger.text import one_line
from ...projections.memory import TaskMemory

SYSTEM_PROMPT = """\
You are forge's agent executor for one task of a performance-engineering loop. Each loop \
block tries one candidate (a change inside the task's scope); forge measures it with the \
task's evaluator and judges it against the contract's gates. You choose the next block.

Decide by calling one decision tool:
- propose {"candidate": {...}, "sub_goal": "..."}: the next candidate (keys and values \
from the scope below; a configuration already tried is refused) and what the block tries;
- stop {"reason": "...", "handoff": "..."}: nothing worth trying is left; the handoff tells \
a successor what you learned.
You may read first with the other tools. Tool arguments are JSON objects. Answer with tool \
calls, not prose."""

REVIEW_PROMPT = """\
You review the next block another model proposes for a performance-engineering task: is the \
candidate worth measuring given what the task memory shows (tried, rejected, best so far)? \
Call verdict {"verdict": "approve" | "object", "reasons": ["..."]} once; object only with \
reasons that point at evidence (block ids, gates, measurements)."""

PLAN_PROMPT = """\
You plan one block of a performance-engineering loop (each block tries one candidate inside \
the task's scope; forge measures it and judges it against the contract's gates). Write the \
plan for the next block: which candidate to try (inside the scope, not one \
already tried) and why, and what the executor should check first. A few lines, no tool \
calls: another model executes the plan with the tools."""



def task_view(task: TaskDefinition) -> dict[str, Any]:
    """The task as the model reads it: what it may change and how it is judged."""
    return {"id": task.id, "type": task.type, "goal": task.goal,
            "scope": {k: (v.model_dump(mode="json") if isinstance(v, Range) else v)
                      for k, v in task.scope.items()},
            "code_members": task.code.members if task.code else [],
            "contract": task.contract.model_dump(mode="json"),
            "exit": task.exit.model_dump(mode="json"), "notes": task.context.notes,
            **({"repos": task.context.repos} if task.context.repos else {}),
            **({"prior_tasks": task.context.prior_tasks} if task.context.prior_tasks else {}),
            **({"start_from": task.context.start_from.model_dump(mode="json")}
               if task.context.start_from else {})}


def prior_view(briefs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prior tasks (`projections.memory.prior_brief`) as the model reads them: exit,
    handoffs and best result, reasons on one line."""
    out = []
    for b in briefs:
        last = b.get("last_handoff") or {}
        out.append({k: v for k, v in {
            "task_id": b["task_id"], "goal": b.get("goal"), "status": b.get("status"),
            "exit_state": b.get("exit_state"),
            "exit_reason": one_line(b["exit_reason"]) if b.get("exit_reason") else None,
            "exit_handoff": one_line(b["exit_handoff"]) if b.get("exit_handoff") else None,
            "last_handoff": {"state_reached": one_line(last.get("state_reached", "")),
                             "findings": [one_line(f) for f in last.get("findings", [])][:10],
                             "next_sub_goal": last.get("next_sub_goal")} if last else None,
            "primary_metric": b.get("primary_metric"), "baseline": b.get("baseline"),
            "best_so_far": b.get("best_so_far")}.items() if v is not None})
    return out


def memory_view(mem: TaskMemory) -> dict[str, Any]:
    """Task Memory in brief (the whole is one `task_memory` call away)."""
    metric = mem.primary_metric
    blocks = []
    for b in mem.execution_record:
        med = b.median(metric) if metric else None
        blocks.append({"block_id": b.block_id, "candidate": b.candidate,
                       "sub_goal": b.sub_goal, "status": b.status,
                       "verdict": b.verdict, "decision": b.decision,
                       "outcome": b.handoff["outcome"] if b.handoff else None,
                       **({f"{metric} median": med} if metric and med is not None else {})})
    return {"status": mem.status, "primary_metric": metric, "blocks": blocks,
            "baseline": mem.baseline, "best_so_far": mem.best_so_far,
            "last_handoff": mem.last_handoff, "next_block": mem.next_block,
            "rejected": [{"candidate": r.get("candidate"), "reason": one_line(
                str(r.get("reason", "")), 400)} for r in mem.rejected[-10:]],
            "accepted": [{"candidate": a.get("candidate")} for a in mem.accepted],
            "no_progress_streak": mem.no_progress_streak,
            "model_usage": {"calls": mem.model_calls,
                            "tokens": mem.model_tokens_in + mem.model_tokens_out,
                            "cost_usd": mem.model_cost_usd}}
