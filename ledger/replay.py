"""Replay a task stream up to a global position: the task's state at that point."""

from __future__ import annotations

from .errors import NotFoundError
from .state import TaskState, apply
from .store import Ledger, task_stream


def replay_task(ledger: Ledger, task_id: str, until: int | None = None) -> TaskState:
    """State of `task_id` after every event of its stream at position <= `until`."""
    if until is not None:
        if until < 1:
            raise NotFoundError(f"position {until} is before the first event (positions start at 1)")
        top = ledger.max_position()
        if until > top:
            raise NotFoundError(f"position {until} is past the end of the ledger ({top})")
    records = ledger.stream_log(task_stream(task_id), stop=until)
    if not records:
        if until is None or not ledger.stream_log(task_stream(task_id)):
            raise NotFoundError(f"unknown task {task_id!r}")
    state = TaskState()
    for r in records:
        apply(state, r.event)
        state.last_position = r.position
    return state
