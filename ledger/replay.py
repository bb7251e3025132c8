"""Replay a task stream up to a global position: the task's state at that point, folded by
the task aggregate (`ledger.task`) and shown as replay's view (`ledger.state`)."""

from __future__ import annotations

import gc
from typing import Any

import orjson

from . import codec
from .errors import LedgerError, NotFoundError
from .ids import shown, unknown_id_hint
from .state import TaskState, view
from .store import Ledger
from .streams import task_stream
from .task import FOLDS, Task, apply


def replay_task(ledger: Ledger, task_id: str, until: int | None = None) -> TaskState:
    """State of `task_id` after every event of its stream at position <= `until`.

    Raises NotFoundError for an unknown task or a position outside the ledger, and the
    codec's errors (naming position, stream and version) for an event of the task that
    cannot be decoded: a state is never shown from part of a history. Other tasks' streams
    are not read, so they replay whatever damage another stream holds."""
    if until is not None:
        if until < 1:
            raise NotFoundError(
                f"position {until} is before the first event (positions start at 1)"
            )
        top = ledger.max_position()
        if until > top:
            # The end named as a position: the number to replay up to instead.
            raise NotFoundError(f"position {until} is past the end of the ledger, which "
                                f"ends at position {top}")
    stream = task_stream(task_id)
    rows = ledger.stream_rows(stream, stop=until)
    if not rows and (until is None or not ledger.stream_rows(stream)):
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)}")
    return view(replay_rows(stream, rows))


def replay_rows(stream: str, rows: list[tuple[int, int, str, bytes]],
                state: Task | None = None) -> Task:
    """Fold raw rows `(position, version, type, state)` of one stream into the task, with
    the one fold of `ledger.task`.

    A row whose payload is a known, current-version, exactly typed payload (checked field by
    field by `codec.load_current`) is folded from its dict; any other row is decoded in full
    (`codec.decode`: upcast, coerced, or rejected with the error naming stream and version)
    and folded from the event's fields. Both give the same state; the first skips building
    objects. `state`: the task to fold into (default: one without records, all replay's view
    reads)."""
    state = state or Task(records=False)  # replay's view reads no records
    # The payloads are acyclic and die by reference counting; left on, the cyclic collector
    # is triggered by their allocations and re-walks the whole heap (~10% of a long replay).
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        _fold_rows(stream, rows, state)
    finally:
        if gc_was_on:
            gc.enable()
    if rows:
        state.last_position = rows[-1][0]
    return state


def _fold_rows(stream: str, rows: list[tuple[int, int, str, bytes]], state: Task) -> None:
    # codec.load_current + apply_payload, inlined: this loop runs once per event of a task.
    checks: dict[str, Any] = {}
    folds = FOLDS
    loads, decode, counters = orjson.loads, codec.decode, state.__dict__
    for pos, version, topic, raw in rows:
        check = checks.get(topic)
        if check is None:
            check = checks[topic] = codec.current_check(topic) or codec.never
        try:
            payload = loads(raw)
        except orjson.JSONDecodeError:
            payload = None
        if type(payload) is dict and check(payload):
            counters["version"] += 1
            fold = folds.get(topic)
            if fold is not None:
                fold(state, payload)
        else:
            try:
                event = decode(stream, version, topic, raw)
            except LedgerError as e:
                # A task's state is not shown from part of its history: the error names the
                # event (other tasks replay as usual; `forge check` lists all damage).
                raise type(e)(f"cannot replay {stream!r}: position {pos}: {e} "
                              "(run `forge check`)") from None
            apply(state, event)
