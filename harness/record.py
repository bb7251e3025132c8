"""The one writer of task streams, and of measurements wherever they go.

Every append to a task stream (`task:<id>`) comes through here: the loop's steps, the manual
path (`forge block …`, `forge run`, `forge measure`, `forge task …`), `forge bench --record`,
`forge bench import`, correctness checks and graph node work. Before anything is written:

- The task's state is the Task Memory the caller already read, with the version it read it
  at (`memory=`, one fold per step), or else is read now (`projections.memory.read_memory`,
  a fold of the whole stream); the events are checked against it in order (`check_events`):
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
from ..ledger.ids import shown, unknown_id_hint
from ..ledger.store import Append, SaveResult
from ..ledger.streams import MEASUREMENTS_STREAM, task_stream
from ..ledger.workspace import Workspace
from ..projections.memory import TaskMemory, build_memory, read_memory
from .errors import HarnessError

# Events that belong to the open block when they name one, and to the task when they do not.
_IN_BLOCK = (E.ToolInvoked, E.MeasurementRecorded, E.MeasurementInvalidated,
             E.EngineLaunched, E.EngineStopped, E.LaunchPlanned)
# A tool call without a block: the executor's own call that decided to stop the task (saved
# with its TaskExited, when no block is open).
_TASK_LEVEL = (E.MeasurementRecorded, E.MeasurementInvalidated, E.EngineLaunched,
               E.EngineStopped, E.ToolInvoked, E.LaunchPlanned)


def check_events(task_id: str, mem: TaskMemory, events: Sequence[E.Event]) -> None:
    """Raise HarnessError (one line naming the task, block and event) when `events`, in order,
    do not follow the task's state `mem` (module contract)."""
    defined = mem.status != "undefined"
    exited = mem.status == "exited"
    open_block = mem.current_block.block_id if mem.current_block is not None else None
    blocks = {b.block_id for b in mem.execution_record}
    for ev in events:
        what = f"task {task_id}: {ev.TYPE}"
        if ev.task_id != task_id:
            raise HarnessError(f"{what} names task {shown(str(ev.task_id))}: an event on a "
                               "task's stream names that task")
        if isinstance(ev, E.TaskDefined):
            if defined:
                raise HarnessError(f"{what}: the task is already defined")
            defined = True
            continue
        if not defined:
            raise HarnessError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                               "(define it with forge task new FILE.yaml)")
        if isinstance(ev, E.TaskReopened):
            if not exited:
                raise HarnessError(f"{what}: the task has not exited")
            exited = False
            continue
        if exited:
            state = mem.exit_state if mem.status == "exited" else "earlier in this save"
            raise HarnessError(f"task {task_id} has exited ({state}); nothing more is "
                               f"recorded in it ({ev.TYPE} refused; forge task reopen)")
        bid = ev.block_id
        if isinstance(ev, E.LoopBlockStarted):
            if open_block is not None:
                raise HarnessError(f"{what}: block {open_block} is still open; hand it off "
                                   "first (forge block handoff)")
            open_block = bid
            blocks.add(str(bid))
        elif isinstance(ev, E.TaskExited):
            exited = True
        elif isinstance(ev, E.DeliverableAccepted | E.DirectionRejected):
            if bid is not None and bid not in blocks:
                raise HarnessError(f"{what}: the task has no block {bid}")
        elif isinstance(ev, (E.LoopBlockHandedOff, E.VerificationRecorded, *_IN_BLOCK)):
            if bid is None and isinstance(ev, _TASK_LEVEL):
                continue  # task-level: no block needed
            if bid is None or bid != open_block:
                raise HarnessError(_not_open(what, bid, open_block, blocks))
            if isinstance(ev, E.LoopBlockHandedOff):
                open_block = None


def _not_open(what: str, bid: str | None, open_block: str | None, blocks: set[str]) -> str:
    """Why an event of a block cannot go where it names (one line)."""
    now = f"the open block is {open_block}" if open_block else \
        "no block is open (forge block start)"
    if bid is None:
        return f"{what} belongs in a block; {now}"
    if bid in blocks:
        return f"{what}: block {bid} is handed off; {now}"
    return f"{what}: the task has no block {bid}; {now}"


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
