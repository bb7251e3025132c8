"""Task state as a pure fold over a task stream's events (no I/O).

`replay(events)` gives the state after those events; `fingerprint(state)` is a stable hash of
it, so rebuilding twice (or on another machine) can be compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import events as E
from .clock import digest


class BlockState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    block_id: str
    index: int
    sub_goal: str
    routing: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    status: str = "running"  # running | handed-off
    tool_calls: int = 0
    measurements: int = 0
    verifications: list[str] = Field(default_factory=list)  # verdicts in order
    handoff: dict[str, Any] | None = None


class TaskState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str | None = None
    title: str = ""
    task_type: str = ""
    goal: str = ""
    definition_hash: str | None = None
    point_hash: str | None = None
    status: str = "undefined"  # undefined | defined | running | exited
    exit_state: str | None = None
    exit_reason: str | None = None
    blocks: list[BlockState] = Field(default_factory=list)
    measurements: int = 0
    invalidated: list[str] = Field(default_factory=list)
    accepted: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[dict[str, Any]] = Field(default_factory=list)
    last_position: int = 0
    version: int = 0

    def block(self, block_id: str | None) -> BlockState | None:
        for b in reversed(self.blocks):
            if b.block_id == block_id:
                return b
        return None


def _inc(model: BaseModel, name: str) -> None:
    # Hot counters, once or twice per event: pydantic's __setattr__ costs a third of a replay.
    # These are plain int fields without assignment validation, so write them directly.
    model.__dict__[name] += 1


def apply(state: TaskState, event: E.Event) -> TaskState:
    """Apply one event in place and return the state (callers own the state object)."""
    _inc(state, "version")
    match event:
        case E.TaskDefined():
            state.task_id = event.task_id
            state.title, state.task_type, state.goal = event.title, event.task_type, event.goal
            state.definition_hash, state.point_hash = event.definition_hash, event.point_hash
            state.status = "defined"
        case E.LoopBlockStarted():
            state.blocks.append(
                BlockState(
                    block_id=event.block_id or f"b{event.index}",
                    index=event.index,
                    sub_goal=event.sub_goal,
                    routing=dict(event.routing),
                    candidate=dict(event.candidate),
                )
            )
            state.status = "running"
        case E.MeasurementRecorded():
            _inc(state, "measurements")
            if b := state.block(event.block_id):
                _inc(b, "measurements")
        case E.ToolInvoked():
            if b := state.block(event.block_id):
                _inc(b, "tool_calls")
        case E.MeasurementInvalidated():
            state.invalidated.append(str(event.measurement_event_id))
        case E.VerificationRecorded():
            if b := state.block(event.block_id):
                b.verifications.append(event.verdict)
        case E.LoopBlockHandedOff():
            if b := state.block(event.block_id):
                b.status = "handed-off"
                b.handoff = {
                    "outcome": event.outcome,
                    "state_reached": event.state_reached,
                    "findings": list(event.findings),
                    "next_sub_goal": event.next_sub_goal,
                }
        case E.DeliverableAccepted():
            state.accepted.append({"block_id": event.block_id, "candidate": dict(event.candidate),
                                   "summary": event.summary})
        case E.DirectionRejected():
            state.rejected.append({"block_id": event.block_id, "candidate": dict(event.candidate),
                                   "reason": event.reason})
        case E.TaskExited():
            state.status = "exited"
            state.exit_state, state.exit_reason = event.state, event.reason
        case E.TaskReopened():
            state.status = "running"
            state.exit_state = state.exit_reason = None
        case _:
            pass  # events that do not change task state still advance its version
    return state


def replay(events: Iterable[E.Event], state: TaskState | None = None) -> TaskState:
    state = state or TaskState()
    for ev in events:
        apply(state, ev)
    return state


def fingerprint(state: BaseModel) -> str:
    return digest(state.model_dump(mode="json"))


# --- the same fold over checked payload dicts (replay's fast path) ----------------------------
# Each function mirrors its case in `apply` and reads the same fields with the same defaults
# as the event class. The payload must have passed `codec.load_current` (every field of
# exactly its declared type), which is what makes the result identical to `apply`'s.


def _defined(s: TaskState, p: dict[str, Any]) -> None:
    s.task_id = p.get("task_id")
    s.title, s.task_type, s.goal = p["title"], p["task_type"], p["goal"]
    s.definition_hash, s.point_hash = p["definition_hash"], p.get("point_hash")
    s.status = "defined"


def _block_started(s: TaskState, p: dict[str, Any]) -> None:
    s.blocks.append(
        BlockState(
            block_id=p.get("block_id") or f"b{p['index']}",
            index=p["index"],
            sub_goal=p["sub_goal"],
            routing=dict(p.get("routing", {})),
            candidate=dict(p.get("candidate", {})),
        )
    )
    s.status = "running"


def _measured(s: TaskState, p: dict[str, Any]) -> None:
    s.__dict__["measurements"] += 1  # as _inc, inlined: most events of a task are these
    if b := s.block(p.get("block_id")):
        b.__dict__["measurements"] += 1


def _tool(s: TaskState, p: dict[str, Any]) -> None:
    if b := s.block(p.get("block_id")):
        _inc(b, "tool_calls")


def _invalidated(s: TaskState, p: dict[str, Any]) -> None:
    s.invalidated.append(p["measurement_event_id"])  # checked canonical: str(UUID(x)) == x


def _verified(s: TaskState, p: dict[str, Any]) -> None:
    if b := s.block(p.get("block_id")):
        b.verifications.append(p["verdict"])


def _handed_off(s: TaskState, p: dict[str, Any]) -> None:
    if b := s.block(p.get("block_id")):
        b.status = "handed-off"
        b.handoff = {
            "outcome": p.get("outcome", "progress"),
            "state_reached": p.get("state_reached", ""),
            "findings": list(p.get("findings", [])),
            "next_sub_goal": p.get("next_sub_goal"),
        }


def _accepted(s: TaskState, p: dict[str, Any]) -> None:
    s.accepted.append({"block_id": p.get("block_id"), "candidate": dict(p.get("candidate", {})),
                       "summary": p.get("summary", "")})


def _rejected(s: TaskState, p: dict[str, Any]) -> None:
    s.rejected.append({"block_id": p.get("block_id"), "candidate": dict(p.get("candidate", {})),
                       "reason": p["reason"]})


def _exited(s: TaskState, p: dict[str, Any]) -> None:
    s.status = "exited"
    s.exit_state, s.exit_reason = p["state"], p["reason"]


def _reopened(s: TaskState, p: dict[str, Any]) -> None:
    s.status = "running"
    s.exit_state = s.exit_reason = None


PAYLOAD_FOLDS = {
    E.TaskDefined.TYPE: _defined,
    E.LoopBlockStarted.TYPE: _block_started,
    E.MeasurementRecorded.TYPE: _measured,
    E.ToolInvoked.TYPE: _tool,
    E.MeasurementInvalidated.TYPE: _invalidated,
    E.VerificationRecorded.TYPE: _verified,
    E.LoopBlockHandedOff.TYPE: _handed_off,
    E.DeliverableAccepted.TYPE: _accepted,
    E.DirectionRejected.TYPE: _rejected,
    E.TaskExited.TYPE: _exited,
    E.TaskReopened.TYPE: _reopened,
}


def apply_payload(state: TaskState, topic: str, payload: dict[str, Any]) -> TaskState:
    """`apply` for a stored payload of event type `topic` that `codec.load_current` accepted
    (a known, current-version, exactly typed payload); gives the same state as
    `apply(state, decode(...))`. Other known types only advance the version, as in `apply`."""
    state.__dict__["version"] += 1
    fold = PAYLOAD_FOLDS.get(topic)
    if fold is not None:
        fold(state, payload)
    return state
