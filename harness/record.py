"""The one writer of task streams, and of measurements wherever they go.

Every append to a task stream (`task:<id>`) comes through here: the loop's steps, the manual
path (`forge block …`, `forge run`, `forge measure`, `forge task …`), `forge bench --record`,
`forge bench import`, correctness checks and graph node work. Before anything is written:

- The task's state is the Task Memory the caller already read, with the version it read it
  at (`memory=`, one fold per step), or else is read now (`projections.memory.read_memory`,
  a fold of the whole stream); the events are checked against the folded task in order
  with the task's rules (`ledger.task.Task.check`; `check_events` turns its TaskRuleError
  into a HarnessError with the same line):
  - a task is defined first (`TaskDefined` opens an empty stream, and only it);
  - nothing is recorded in an exited task, except `TaskReopened`, which needs one;
  - a block starts only when none is open; tool calls, measurements, verifications and
    invalidations with a block go into the open block; a handoff closes the open block;
    a decision (accept, reject) names a block the task has;
  - a measurement, invalidation, engine event or tool call without a block is task-level:
    allowed in a defined task that has not exited (`forge bench import FILE --task T`, the
    executor's call that stopped the task);
  - every event names this task.
- The events are appended with that version expected: a writer that moved the stream in
  between makes the save fail with ConflictError (optimistic concurrency), never interleave.
  A caller's memory is trusted only at its version (the stream's version is read, one row,
  not folded): a caller that expects that version gets ConflictError when the stream moved;
  one that does not (a long `forge run`) has the stream read and folded again, as without.
- Saves carry the caller's deterministic command id (a retried save adds nothing).

`task_append` returns the checked `Append` for a save that also writes another stream (graph
node work: the task's verification with the graph's NodeVerified, in one transaction).
Measurements outside any task go to the `measurements` stream (`record_measurements`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ledger import events as E
from ..ledger.errors import ConflictError, NotFoundError
from ..ledger.store import Append, SaveResult
from ..ledger.streams import MEASUREMENTS_STREAM, task_stream
from ..ledger.task import TaskRuleError
from ..ledger.workspace import Workspace
from ..projections.memory import TaskMemory, build_memory, read_memory
from .errors import HarnessError


def check_events(task_id: str, mem: TaskMemory, events: Sequence[E.Event]) -> None:
    """Raise HarnessError (one line naming the task, block and event) when `events`, in order,
    do not follow the task's state `mem` (the task's rules: `ledger.task.Task.check`)."""
    try:
        mem.task.check(task_id, events)
    except TaskRuleError as e:
        raise HarnessError(str(e)) from None


def task_append(ws: Workspace, task_id: str, events: Sequence[E.Event], *,
                expected_version: int | None = None, memory: TaskMemory | None = None,
                version: int | None = None) -> Append:
    """The checked Append of `events` to the task's stream, expecting the version read now
    (or, given `expected_version`, that one: a stream that moved since raises
    ConflictError, as a concurrent writer would).

    `memory`: the task's memory the caller read at `version` (default `expected_version`),
    checked against instead of folding the stream again while the stream is still at that
    version."""
    stream = task_stream(task_id)
    if memory is not None:
        held = expected_version if version is None else version
        if held is None:
            raise TypeError("task_append: a memory needs the version it was read at")
        now = ws.ledger.version(stream)  # one row, no fold
        if expected_version is not None and now != expected_version:
            raise ConflictError(stream, expected_version, now)
        if now == held:
            check_events(task_id, memory, events)
            return Append(stream, list(events), now)
    try:
        mem, current = read_memory(ws.ledger, task_id)
    except NotFoundError:  # an empty stream: only a TaskDefined may open it
        mem, current = build_memory(()), 0
    if expected_version is not None and current != expected_version:
        # Computed on a state that has moved: a conflict, whatever the events are.
        raise ConflictError(stream, expected_version, current)
    check_events(task_id, mem, events)
    return Append(stream, list(events),
                  current if expected_version is None else expected_version)


def append_to_task(ws: Workspace, task_id: str, events: Sequence[E.Event], *,
                   command_id: str | None = None, expected_version: int | None = None,
                   memory: TaskMemory | None = None, version: int | None = None,
                   also: Sequence[Append] = ()) -> SaveResult:
    """Check and append `events` to the task's stream (with `also`, in the same save);
    `memory` and `version` as for `task_append`."""
    return ws.ledger.save(task_append(ws, task_id, events, expected_version=expected_version,
                                      memory=memory, version=version),
                          *also, command_id=command_id)


def check_measurement_target(ws: Workspace, task_id: str | None, block_id: str | None) -> None:
    """Refuse now, before a long run or import, a measurement that `record_measurements`
    would refuse after it (an unknown or exited task, a block not open)."""
    if task_id is not None:
        task_append(ws, task_id, [E.MeasurementRecorded(run_id="-", source="-", metrics={},
                                                        task_id=task_id, block_id=block_id)])


def record_measurements(ws: Workspace, events: Sequence[E.MeasurementRecorded], *,
                        task_id: str | None, command_id: str | None = None) -> SaveResult:
    """Measurements of a task (checked as above: its open block, or task-level) or, without
    a task, on the `measurements` stream."""
    if task_id is not None:
        return append_to_task(ws, task_id, events, command_id=command_id)
    return ws.ledger.append(MEASUREMENTS_STREAM, list(events), command_id=command_id)
