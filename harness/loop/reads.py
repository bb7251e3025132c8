"""Read queries over task streams: `forge task list` and `forge task show`.
"""

from __future__ import annotations

from typing import Any

from ...ledger import events as E
from ...ledger.store import OnError, Undecodable
from .task import _stream_state


def list_tasks(ws: Any, on_error: OnError = None) -> list[dict[str, Any]]:
    """Every task with its status. Undecodable events raise, or, given `on_error`, are
    handed to it and left out (a task whose definition is damaged is still listed)."""
    ids = []
    # The task ids are the streams' names: no need to decode the definitions to list them.
    for _pos, stream, version, _topic, _state in ws.ledger.rows(types=[E.TaskDefined.TYPE]):
        if stream.startswith("task:") and version == 1:
            ids.append(stream[len("task:"):])
    out = []
    for tid in ids:
        damaged: list[Undecodable] = []
        mem, _, _ = _stream_state(ws, tid, None if on_error is None else damaged.append)
        for u in damaged:
            on_error(u)  # type: ignore[misc]
        row = {"task_id": tid, "type": mem.definition.get("type"),
               "status": mem.status, "exit_state": mem.exit_state,
               "blocks": len(mem.execution_record), "accepted": len(mem.accepted),
               "rejected": len(mem.rejected), "goal": mem.definition.get("goal")}
        if damaged:
            row["damaged_events"] = [u.position for u in damaged]
        out.append(row)
    return out


def task_summary(ws: Any, task_id: str, on_error: OnError = None) -> dict[str, Any]:
    mem, version, _ = _stream_state(ws, task_id, on_error)
    return {"task_id": task_id, "status": mem.status, "exit_state": mem.exit_state,
            "exit_reason": mem.exit_reason, "definition": mem.definition,
            "definition_hash": mem.definition_hash, "point_hash": mem.point_hash,
            "profile_hash": mem.profile_hash, "contract_hash": mem.contract_hash,
            "version": version,
            "blocks": [{"block_id": b.block_id, "sub_goal": b.sub_goal,
                        "candidate": b.candidate, "routing": b.routing, "status": b.status,
                        "measurements": len(b.measurements), "tool_calls": len(b.tool_calls),
                        "verdict": (b.verification or {}).get("verdict"),
                        "decision": b.decision, "outcome": (b.handoff or {}).get("outcome")}
                       for b in mem.execution_record],
            "best_so_far": mem.best_so_far}
