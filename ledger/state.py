"""The task's state: the one pure fold of a task stream (no I/O).

Every reader of a task folds its stream here: `forge replay` (`ledger.replay`, from stored
payloads), `forge check` (every task stream), and Task Memory (`projections.memory`: the
loop's and the CLI's view, which adds per-event records and derived views on top of this
state). How an event changes a task (its status, exits and reopenings, blocks and their
handoffs and decisions, what was accepted or rejected) is written once, below.

One function per event type, `fold(state, fields)`, reads the event's fields from a mapping:
either a stored payload that `codec.load_current` accepted (replay's fast path: JSON forms,
fields left at their default may be absent) or a decoded event's own fields (`apply`). Both
give the same state: ids are kept as their text, mappings are copied, a missing field reads
as its class default. `replay(events)` gives the state after those events; `fingerprint`
is a stable hash of it, so rebuilding twice (or on another machine) can be compared byte for
byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import events as E
from .clock import digest

Fields = Mapping[str, Any]  # an event's fields: a checked stored payload or `event.__dict__`


class BlockState(BaseModel):
    """One loop block. Fields marked `exclude` are kept for Task Memory and left out of
    replay's view and fingerprint (whose format predates them)."""

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
    steps: list[dict[str, str]] = Field(default_factory=list)  # latest verification's path
    handoff: dict[str, Any] | None = None
    config_digest: str | None = Field(None, exclude=True)  # the effective configuration
    decision: str | None = Field(None, exclude=True)  # accepted | rejected
    decision_reason: str | None = Field(None, exclude=True)


class TaskState(BaseModel):
    """A task as its events left it. `exits` is its exit history, oldest first: each exit's
    state and reason, and the reason it was reopened (None while the exit stands)."""

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
    exits: list[dict[str, Any]] = Field(default_factory=list)
    definition: dict[str, Any] = Field(default_factory=dict, exclude=True)
    profile_hash: str | None = Field(None, exclude=True)
    contract_hash: str | None = Field(None, exclude=True)

    def block(self, block_id: str | None) -> BlockState | None:
        """The latest block with this id."""
        for b in reversed(self.blocks):
            if b.block_id == block_id:
                return b
        return None

    def block_index(self, block_id: str | None) -> int | None:
        """The position in `blocks` of `block(block_id)`."""
        for i in range(len(self.blocks) - 1, -1, -1):
            if self.blocks[i].block_id == block_id:
                return i
        return None


def _inc(model: BaseModel, name: str) -> None:
    # Hot counters, once or twice per event: pydantic's __setattr__ costs a third of a replay.
    # These are plain int fields without assignment validation, so write them directly.
    model.__dict__[name] += 1


def _defined(s: TaskState, p: Fields) -> None:
    s.task_id = p.get("task_id")
    s.title, s.task_type, s.goal = p["title"], p["task_type"], p["goal"]
    s.definition_hash, s.point_hash = p["definition_hash"], p.get("point_hash")
    s.definition, s.profile_hash = dict(p["definition"]), p.get("profile_hash")
    s.contract_hash = p.get("input_digests", {}).get("contract")
    s.status = "defined"


def _block_started(s: TaskState, p: Fields) -> None:
    s.blocks.append(
        BlockState(
            block_id=p.get("block_id") or f"b{p['index']}",
            index=p["index"],
            sub_goal=p["sub_goal"],
            routing=dict(p.get("routing", {})),
            candidate=dict(p.get("candidate", {})),
            config_digest=p.get("input_digests", {}).get("config"),
        )
    )
    s.status = "running"


def _measured(s: TaskState, p: Fields) -> None:
    s.__dict__["measurements"] += 1  # as _inc, inlined: most events of a task are these
    if b := s.block(p.get("block_id")):
        b.__dict__["measurements"] += 1


def _tool(s: TaskState, p: Fields) -> None:
    if b := s.block(p.get("block_id")):
        _inc(b, "tool_calls")


def _invalidated(s: TaskState, p: Fields) -> None:
    # A checked payload holds the canonical text (str(UUID(x)) == x); an event, the UUID.
    s.invalidated.append(str(p["measurement_event_id"]))


def _verified(s: TaskState, p: Fields) -> None:
    if b := s.block(p.get("block_id")):
        b.verifications.append(p["verdict"])
        # Each step's name and outcome (a stored payload holds mappings, an event models).
        b.steps = [{"name": x["name"], "outcome": x["outcome"]} if isinstance(x, Mapping)
                   else {"name": x.name, "outcome": x.outcome} for x in p.get("steps", ())]


def _handed_off(s: TaskState, p: Fields) -> None:
    if b := s.block(p.get("block_id")):
        b.status = "handed-off"
        b.handoff = {
            "outcome": p.get("outcome", "progress"),
            "state_reached": p.get("state_reached", ""),
            "findings": list(p.get("findings", [])),
            "next_sub_goal": p.get("next_sub_goal"),
        }


def _accepted(s: TaskState, p: Fields) -> None:
    summary = p.get("summary", "")
    s.accepted.append({"block_id": p.get("block_id"), "candidate": dict(p.get("candidate", {})),
                       "summary": summary})
    if b := s.block(p.get("block_id")):
        b.decision, b.decision_reason = "accepted", summary


def _rejected(s: TaskState, p: Fields) -> None:
    s.rejected.append({"block_id": p.get("block_id"), "candidate": dict(p.get("candidate", {})),
                       "reason": p["reason"]})
    if b := s.block(p.get("block_id")):
        b.decision, b.decision_reason = "rejected", p["reason"]


def _exited(s: TaskState, p: Fields) -> None:
    s.status = "exited"
    s.exit_state, s.exit_reason = p["state"], p["reason"]
    s.exits.append({"state": p["state"], "reason": p["reason"], "reopened": None})


def _reopened(s: TaskState, p: Fields) -> None:
    # The exit stays in the history, marked with why it was reopened.
    if s.exits and s.status == "exited":
        s.exits[-1]["reopened"] = p["reason"]
    s.status = "running"
    s.exit_state = s.exit_reason = None


FOLDS: dict[str, Callable[[TaskState, Fields], None]] = {
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


def apply_payload(state: TaskState, topic: str, payload: Fields) -> TaskState:
    """Fold the fields of one event of type `topic` into `state`, in place (callers own the
    state object): a stored payload `codec.load_current` accepted, or `event.__dict__`.
    Events that do not change a task's state still advance its version."""
    state.__dict__["version"] += 1
    fold = FOLDS.get(topic)
    if fold is not None:
        fold(state, payload)
    return state


def apply(state: TaskState, event: E.Event) -> TaskState:
    """Fold one decoded event: the same fold, reading the event's own fields."""
    return apply_payload(state, event.TYPE, event.__dict__)


def replay(events: Iterable[E.Event], state: TaskState | None = None) -> TaskState:
    state = state or TaskState()
    for ev in events:
        apply(state, ev)
    return state


def fingerprint(state: BaseModel) -> str:
    return digest(state.model_dump(mode="json"))
