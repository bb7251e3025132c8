"""Task Memory in brief: what an agent needs to choose the next block, in a few KB however
long the task has run (`task_memory`'s default answer; `detail: true` gives the whole
`TaskMemory`).

Contract: `brief(mem, now)` (pure) -> a JSON-able dict of
- `task_id`, `status`, `goal` (one line), `exit` (state and one-line reason, once exited),
  `primary` (the contract's primary metric and which way is better), `blocks` (how many);
- `current_block`: the open block (id, sub-goal, candidate, counts of its tool calls and
  measurements, its verdict once verified), or None;
- `baseline` and `best_so_far` (block, candidate, the primary metric's median as the gates
  judged it, the verdict; the best's ratio to the baseline);
- `accepted` (block and candidate); `rejected`: how many, and the last `REJECTED_SHOWN`
  with one-line reasons of at most `REASON_CHARS` (a gate's parenthesised details left out);
- `next`: the next block's index and the sub-goal the last handoff proposed, how many
  configurations were tried, the last handoff (its block, outcome, state reached and its
  first `FINDINGS_SHOWN` findings, one line each, details left out as in reasons);
- `budget`: blocks, wall time and no-progress blocks left under the task's exit criteria,
  and its model usage with what is left of a token or cost budget.
Never a raw per-run metric, an absolute path or a launch command: those are in the detailed
memory and in the task's artifacts. Free text (goal, sub-goals, reasons, handoffs) is one
line each, cut with "…".
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..ledger.ids import LEDGER_CONTEXT
from ..ledger.specs import ExitCriteria
from ..ledger.text import one_line
from .memory import TaskMemory

REJECTED_SHOWN = 8  # the latest rejections shown (the count says how many there are)
REASON_CHARS = 160  # a rejection's reason, one line
TEXT_CHARS = 200  # a goal, sub-goal or handoff's state, one line
FINDINGS_SHOWN = 3  # the last handoff's first findings, one line each
_DETAILS = re.compile(r" \([^()]*\)")


def _block_ref(d: dict[str, Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {k: d.get(k) for k in ("block_id", "candidate", "median", "verdict") if k in d}


def _exit_criteria(mem: TaskMemory) -> ExitCriteria:
    try:
        return ExitCriteria.model_validate(mem.definition.get("exit") or {},
                                           context=LEDGER_CONTEXT)
    except ValidationError:  # not a task loop's definition (a graph node's): the defaults
        return ExitCriteria()


def _wall_used(mem: TaskMemory, now: datetime) -> float:
    """Seconds since the first block (until its exit, for an exited task), less the time
    spent exited before a reopen."""
    if not mem.first_block_at:
        return 0.0
    if mem.task.exited_at:  # exited (not reopened): its clock stopped there
        now = datetime.fromisoformat(mem.task.exited_at)
    return max(0.0, (now - datetime.fromisoformat(mem.first_block_at)).total_seconds()
               - mem.paused_s)


def _budget(mem: TaskMemory, now: datetime) -> dict[str, Any]:
    ex = _exit_criteria(mem)
    used = _wall_used(mem, now)
    out: dict[str, Any] = {
        "blocks_left": max(0, ex.max_blocks - len(mem.execution_record)),
        "max_blocks": ex.max_blocks,
        "wall_s_left": round(max(0.0, ex.max_wall_s - used)),
        "max_wall_s": ex.max_wall_s,
        "no_progress_left": max(0, ex.no_progress_blocks - mem.no_progress_streak)}
    tokens = mem.model_tokens_in + mem.model_tokens_out
    if mem.model_calls or ex.max_tokens is not None or ex.max_cost_usd is not None:
        out["model"] = {"calls": mem.model_calls, "tokens": tokens,
                        "cost_usd": round(mem.model_cost_usd, 6)}
        if ex.max_tokens is not None:
            out["model"]["tokens_left"] = max(0, ex.max_tokens - tokens)
        if ex.max_cost_usd is not None:
            out["model"]["cost_usd_left"] = round(max(0.0, ex.max_cost_usd
                                                      - mem.model_cost_usd), 6)
    return out


def _best(mem: TaskMemory) -> dict[str, Any] | None:
    best = _block_ref(mem.best_so_far)
    base = (mem.baseline or {}).get("median")
    if best is not None and best.get("median") is not None and base:
        best["vs_baseline"] = round(best["median"] / base, 4)
    return best


def _reason(text: str) -> str:
    """A rejection's reason or a finding on one line, its parenthesised details (confidence
    intervals, sample counts: in the detailed memory) left out."""
    return one_line(_DETAILS.sub("", text), REASON_CHARS)


def brief(mem: TaskMemory, now: datetime) -> dict[str, Any]:
    """Task Memory in brief (module contract); `now` for the wall time left."""
    cur = mem.current_block
    last = mem.last_handoff
    rejected = mem.rejected[-REJECTED_SHOWN:]
    return {
        "task_id": mem.task_id, "status": mem.status,
        "goal": one_line(str(mem.definition.get("goal") or ""), TEXT_CHARS),
        "exit": None if mem.exit_state is None else {
            "state": mem.exit_state, "reason": one_line(mem.exit_reason or "", REASON_CHARS)},
        "primary": {"metric": mem.primary_metric,
                    "better": {"at_least": "higher", "at_most": "lower"}.get(
                        mem.primary_direction or "")},
        "blocks": len(mem.execution_record),
        "current_block": None if cur is None else {
            "block_id": cur.block_id, "sub_goal": one_line(cur.sub_goal, TEXT_CHARS),
            "candidate": cur.candidate, "tool_calls": cur.tool_call_count,
            "measurements": cur.measurement_count, "verdict": cur.verdict},
        "baseline": _block_ref(mem.baseline),
        "best_so_far": _best(mem),
        "accepted": [{"block_id": a.get("block_id"), "candidate": a.get("candidate")}
                     for a in mem.accepted],
        "rejected": {"count": len(mem.rejected), "last": [
            {"block_id": r.get("block_id"), "candidate": r.get("candidate"),
             "reason": _reason(str(r.get("reason") or ""))}
            for r in rejected]},
        "next": {
            "index": (mem.next_block or {}).get("index"),
            "sub_goal": one_line(str((mem.next_block or {}).get("sub_goal") or ""),
                                 TEXT_CHARS) or None,
            "tried_configs": len(mem.tried),
            "last_handoff": None if last is None else {
                "block_id": last.get("block_id"), "outcome": last.get("outcome"),
                "state_reached": one_line(str(last.get("state_reached") or ""),
                                          TEXT_CHARS),
                "findings": [_reason(str(f))
                             for f in (last.get("findings") or [])[:FINDINGS_SHOWN]]}},
        "budget": _budget(mem, now),
    }
