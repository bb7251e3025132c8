"""The task aggregate: a task's typed state, the one pure fold of its stream, its rules.

Every reader of a task folds its stream here, once: `forge replay` (`ledger.replay`, from
stored payloads; its printed view and fingerprint in `ledger.state`), `forge check`, the
concurrency page, Task Memory (`projections.memory`: views computed from the folded `Task`,
after the fold) and the writer of task streams (`harness/record.py` checks new events
against the `Task` with `Task.check`). How an event changes a task is written once, below.

A `Task` holds its identity and definition, its status and exit history, its blocks and
what was accepted or rejected, and the task-level facts that only the order of events
tells (the last handoff, the trailing no-progress streak, what each verification saw, when
the task was paused, its model usage). A `Block` is one loop block: identity, status,
handoff and decision, and the records of its events (start time, tool calls, measurements
marked when invalidated, latest verification) in the shapes Task Memory shows.

One function per event type, `fold(task, fields)`, reads the event's fields from a mapping:
either a stored payload that `codec.load_current` accepted (replay's fast path: JSON forms,
fields left at their default may be absent) or a decoded event's own fields (`apply`). Both
give the same state: ids and times are kept as their text, nested payload models as their
JSON forms, a missing field reads as its class default.

(Just over 500 lines: the state, its one fold and its rules are read together, as the one
place that says how a task changes.)
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, NotRequired

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from . import events as E
from .errors import LedgerError
from .ids import shown, unknown_id_hint

Fields = Mapping[str, Any]  # an event's fields: a checked stored payload or `event.__dict__`


class TaskRuleError(LedgerError):
    """Events that do not follow a task's state (`Task.check`): one line naming the task,
    block and event."""


# --- the records a block keeps of its events (Task Memory's shapes) -------------------------


class ToolCallRecord(TypedDict):
    tool: str
    argv: list[str]
    exit_code: int | None
    event_id: str


class MeasurementRecord(TypedDict):
    event_id: str
    run_id: str
    repeat: int | None
    metrics: dict[str, float]
    success: bool
    error: str | None
    source: str
    meta: dict[str, Any]
    artifact_digest: str | None
    invalidated: NotRequired[str]  # the reason, once a MeasurementInvalidated names it


class VerificationRecord(TypedDict):
    event_id: str
    verdict: str
    passed: bool
    contract_hash: str
    point_hash: str | None
    gates: list[dict[str, Any]]  # GateResult.to_dict() forms
    steps: list[dict[str, Any]]  # StepResult forms
    candidate: dict[str, Any]
    differs: list[dict[str, Any]]  # Difference forms


class HandoffRecord(TypedDict):
    block_id: str | None
    outcome: str
    state_reached: str
    findings: list[str]
    next_sub_goal: str | None


class Block(BaseModel):
    """One loop block. Fields marked `exclude` are left out of Task Memory's output (replay's
    view shows them): every verification's verdict in order, the latest verification's path
    (step names and outcomes), and the counts of tool calls and measurements (kept also by a
    task folded without records)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    block_id: str
    index: int
    sub_goal: str
    routing: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    config_digest: str | None = None  # the effective configuration
    started_at: str | None = None
    status: str = "running"  # running | handed-off
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    measurements: list[MeasurementRecord] = Field(default_factory=list)
    verification: VerificationRecord | None = None  # the latest
    decision: str | None = None  # accepted | rejected
    decision_reason: str | None = None
    handoff: HandoffRecord | None = None
    verdicts: list[str] = Field(default_factory=list, exclude=True)
    steps: list[dict[str, str]] = Field(default_factory=list, exclude=True)
    tool_call_count: int = Field(0, exclude=True)
    measurement_count: int = Field(0, exclude=True)

    @property
    def verdict(self) -> str | None:
        """The latest verification's verdict (None: not verified)."""
        return None if self.verification is None else self.verification["verdict"]

    @property
    def is_baseline(self) -> bool:
        return not self.candidate

    def runs(self) -> list[Run]:
        """The valid runs (what the gates judge)."""
        return runs_of(m for m in self.measurements if not m.get("invalidated"))

    def median(self, metric: str) -> float | None:
        return median_of(self.runs(), metric)


@dataclass(frozen=True, slots=True)
class Run:
    """One run as the gates judge it: its metrics, whether it succeeded and, where its
    measurement's meta has them, the contract's accuracy gates' results by gate name (task,
    accuracy, items [[doc_id, 0|1], ...], or an error)."""

    metrics: Mapping[str, float]
    success: bool = True
    accuracy: Mapping[str, Any] | None = None
    # Why the host's state contaminated the run (meta.contaminated; harness/nodes/host_state.py)
    contaminated: tuple[str, ...] = ()


def runs_of(measurements: Iterable[MeasurementRecord]) -> list[Run]:
    """The runs of these measurements (see `Block.runs`)."""
    return [Run(m["metrics"], m["success"], (m.get("meta") or {}).get("accuracy") or None,
                tuple((m.get("meta") or {}).get("contaminated") or ()))
            for m in measurements]


def median_of(runs: Sequence[Run], metric: str) -> float | None:
    """The median of `metric` over the successful runs that have it."""
    xs = [r.metrics[metric] for r in runs if r.success and metric in r.metrics]
    return statistics.median(xs) if xs else None


class Seen(NamedTuple):
    """What one verification saw, kept by the fold because later events change it: its
    block, its record, and how many of the block's measurements and of the task's
    invalidation marks there were at that time (Task Memory's best-so-far judges each
    verification on the runs valid then; an invalidation after it does not change it)."""

    block: Block
    verification: VerificationRecord
    measurements: int
    marks: int


class Task(BaseModel):
    """A task as its events left it. `exits` is its exit history, oldest first: each exit's
    state and reason, and the reason it was reopened (None while the exit stands)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", arbitrary_types_allowed=True)

    task_id: str | None = None
    title: str = ""
    task_type: str = ""
    goal: str = ""
    definition: dict[str, Any] = Field(default_factory=dict)
    definition_hash: str | None = None
    point_hash: str | None = None
    profile_hash: str | None = None
    contract_hash: str | None = None
    status: str = "undefined"  # undefined | defined | running | exited
    exit_state: str | None = None
    exit_reason: str | None = None
    exits: list[dict[str, Any]] = Field(default_factory=list)
    exit_handoff: str | None = None  # the standing exit's handoff (a successor reads it)
    blocks: list[Block] = Field(default_factory=list)
    measurements: int = 0
    invalidated: list[str] = Field(default_factory=list)  # measurement event ids, in order
    # Each: block_id, candidate, summary, event_id, verification_event_id.
    accepted: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[dict[str, Any]] = Field(default_factory=list)  # block_id, candidate, reason
    last_position: int = 0
    version: int = 0
    # Facts only the order of events tells (Task Memory's views are computed from them).
    last_handoff: HandoffRecord | None = None
    no_progress_streak: int = 0  # trailing no-progress handoffs since the last reopen
    last_turn: str | None = None  # started | handed-off | exited | reopened: the latest
    reopened_after: int | None = None  # blocks at the last reopen
    exited_at: str | None = None  # the exit a reopen has not ended yet
    # (exited, reopened) times; a time a hand-written payload left out is None.
    pauses: list[tuple[str, str | None]] = Field(default_factory=list)
    # Each invalidation of a measurement, in order: its record and the reason it was given.
    marks: list[tuple[MeasurementRecord, str]] = Field(default_factory=list)
    seen: list[Seen] = Field(default_factory=list)  # every verification of a block, in order
    model_calls: int = 0
    model_tokens_in: int = 0
    model_tokens_out: int = 0
    model_cost_usd: float = 0.0
    # False: the fold keeps no records of tool calls, measurements and verifications (nor
    # what each verification saw), only counts and verdicts: what replay, `forge check` and
    # the concurrency page read. Building the records is a fifth of a replay's time.
    records: bool = True

    def block(self, block_id: str | None) -> Block | None:
        """The latest block with this id."""
        for b in reversed(self.blocks):
            if b.block_id == block_id:
                return b
        return None

    @property
    def open_block(self) -> Block | None:
        """The last block while it runs."""
        last = self.blocks[-1] if self.blocks else None
        return last if last is not None and last.status == "running" else None

    def check(self, task_id: str, events: Sequence[E.Event]) -> None:
        """Raise TaskRuleError (one line naming the task, block and event) when `events`, in
        order, do not follow this state:

        - a task is defined first (`TaskDefined` opens an empty stream, and only it);
        - nothing is recorded in an exited task, except `TaskReopened`, which needs one;
        - a block starts only when none is open; tool calls, measurements, verifications and
          invalidations with a block go into the open block; a handoff closes the open
          block; a decision (accept, reject) names a block the task has;
        - a measurement, invalidation, engine event or tool call without a block is
          task-level: allowed in a defined task that has not exited;
        - every event names this task."""
        defined = self.status != "undefined"
        exited = self.status == "exited"
        opened = self.open_block
        open_block = opened.block_id if opened is not None else None
        blocks = {b.block_id for b in self.blocks}
        for ev in events:
            what = f"task {task_id}: {ev.TYPE}"
            if ev.task_id != task_id:
                raise TaskRuleError(f"{what} names task {shown(str(ev.task_id))}: an event on "
                                    "a task's stream names that task")
            if isinstance(ev, E.TaskDefined):
                if defined:
                    raise TaskRuleError(f"{what}: the task is already defined")
                defined = True
                continue
            if not defined:
                raise TaskRuleError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                                    "(define it with forge task new FILE.yaml)")
            if isinstance(ev, E.TaskReopened):
                if not exited:
                    raise TaskRuleError(f"{what}: the task has not exited")
                exited = False
                continue
            if exited:
                state = self.exit_state if self.status == "exited" else "earlier in this save"
                raise TaskRuleError(f"task {task_id} has exited ({state}); nothing more is "
                                    f"recorded in it ({ev.TYPE} refused; forge task reopen)")
            bid = ev.block_id
            if isinstance(ev, E.LoopBlockStarted):
                if open_block is not None:
                    raise TaskRuleError(f"{what}: block {open_block} is still open; hand it "
                                        "off first (forge block handoff)")
                open_block = bid
                blocks.add(str(bid))
            elif isinstance(ev, E.TaskExited):
                exited = True
            elif isinstance(ev, E.DeliverableAccepted | E.DirectionRejected):
                if bid is not None and bid not in blocks:
                    raise TaskRuleError(f"{what}: the task has no block {bid}")
            elif isinstance(ev, (E.LoopBlockHandedOff, E.VerificationRecorded, *_IN_BLOCK)):
                if bid is None and isinstance(ev, _TASK_LEVEL):
                    continue  # task-level: no block needed
                if bid is None or bid != open_block:
                    raise TaskRuleError(_not_open(what, bid, open_block, blocks))
                if isinstance(ev, E.LoopBlockHandedOff):
                    open_block = None


# Events that belong to the open block when they name one, and to the task when they do not.
_IN_BLOCK = (E.ToolInvoked, E.MeasurementRecorded, E.MeasurementInvalidated,
             E.EngineLaunched, E.EngineStopped, E.LaunchPlanned)
# A tool call without a block: the executor's own call that decided to stop the task (saved
# with its TaskExited, when no block is open).
_TASK_LEVEL = (E.MeasurementRecorded, E.MeasurementInvalidated, E.EngineLaunched,
               E.EngineStopped, E.ToolInvoked, E.LaunchPlanned)


def _not_open(what: str, bid: str | None, open_block: str | None, blocks: set[str]) -> str:
    """Why an event of a block cannot go where it names (one line)."""
    now = f"the open block is {open_block}" if open_block else \
        "no block is open (forge block start)"
    if bid is None:
        return f"{what} belongs in a block; {now}"
    if bid in blocks:
        return f"{what}: block {bid} is handed off; {now}"
    return f"{what}: the task has no block {bid}; {now}"


# --- the fold ---------------------------------------------------------------------------------


def _text(v: Any) -> Any:
    # An id or a time: a checked payload holds its text (str(UUID(x)) == x, and `encode`
    # writes a time as isoformat() does); an event, the object.
    return v if v is None or type(v) is str else v.isoformat() if isinstance(v, datetime) \
        else str(v)


def _form(x: Any) -> dict[str, Any]:
    # A nested payload model as stored (a stored payload holds mappings, an event models).
    return dict(x) if isinstance(x, Mapping) else x.model_dump()


def _defined(s: Task, p: Fields) -> None:
    s.task_id = p.get("task_id")
    s.title, s.task_type, s.goal = p["title"], p["task_type"], p["goal"]
    s.definition_hash, s.point_hash = p["definition_hash"], p.get("point_hash")
    s.definition, s.profile_hash = dict(p["definition"]), p.get("profile_hash")
    s.contract_hash = p.get("input_digests", {}).get("contract")
    s.status = "defined"


def _block_started(s: Task, p: Fields) -> None:
    s.blocks.append(
        Block(
            block_id=p.get("block_id") or f"b{p['index']}",
            index=p["index"],
            sub_goal=p["sub_goal"],
            routing=dict(p.get("routing", {})),
            candidate=dict(p.get("candidate", {})),
            config_digest=p.get("input_digests", {}).get("config"),
            started_at=_text(p.get("occurred_at")),
        )
    )
    s.status = "running"
    s.last_turn = "started"


def _measured(s: Task, p: Fields) -> None:
    s.__dict__["measurements"] += 1  # a plain int field: pydantic's __setattr__ is slow
    if b := s.block(p.get("block_id")):
        b.__dict__["measurement_count"] += 1
        if not s.records:
            return
        # The record shares the event's metrics and meta (nothing mutates either).
        b.measurements.append({
            "event_id": _text(p.get("event_id")), "run_id": p["run_id"],
            "repeat": p.get("repeat"), "metrics": p["metrics"], "success": p.get("success", True),
            "error": p.get("error"), "source": p["source"], "meta": p.get("meta") or {},
            "artifact_digest": p.get("artifact_digest")})


def _tool(s: Task, p: Fields) -> None:
    if b := s.block(p.get("block_id")):
        b.__dict__["tool_call_count"] += 1
        if s.records:
            b.tool_calls.append({"tool": p["tool"], "argv": list(p["argv"]),
                                "exit_code": p.get("exit_code"),
                                "event_id": _text(p.get("event_id"))})


def _model_called(s: Task, p: Fields) -> None:
    d = s.__dict__
    d["model_calls"] += 1
    d["model_tokens_in"] += p.get("tokens_in", 0)
    d["model_tokens_out"] += p.get("tokens_out", 0)
    d["model_cost_usd"] = round(d["model_cost_usd"] + p.get("cost_usd", 0.0), 8)


def _invalidated(s: Task, p: Fields) -> None:
    target = _text(p["measurement_event_id"])
    s.invalidated.append(target)
    for b in s.blocks:
        for m in b.measurements:
            if m["event_id"] == target:
                m["invalidated"] = p["reason"]
                s.marks.append((m, p["reason"]))


def _verified(s: Task, p: Fields) -> None:
    if b := s.block(p.get("block_id")):
        b.verdicts.append(p["verdict"])
        steps = p.get("steps", ())
        # Each step's name and outcome (a stored payload holds mappings, an event models).
        b.steps = [{"name": x["name"], "outcome": x["outcome"]} if isinstance(x, Mapping)
                   else {"name": x.name, "outcome": x.outcome} for x in steps]
        if not s.records:
            return
        # A gate as `GateResult.to_dict()` shows it: its stored form without empty fields.
        gates = [{k: v for k, v in g.items() if v is not None} if isinstance(g, Mapping)
                 else g.to_dict() for g in p.get("gates", ())]
        v: VerificationRecord = {
            "event_id": _text(p.get("event_id")), "verdict": p["verdict"],
            "passed": p["passed"], "contract_hash": p["contract_hash"],
            "point_hash": p.get("point_hash"), "gates": gates,
            "steps": [_form(x) for x in steps],
            "candidate": dict(p.get("candidate", {})),
            "differs": [_form(d) for d in p.get("differs", ())]}
        b.verification = v
        s.seen.append(Seen(b, v, len(b.measurements), len(s.marks)))


def _handed_off(s: Task, p: Fields) -> None:
    outcome = p.get("outcome", "progress")
    state_reached, findings = p.get("state_reached", ""), list(p.get("findings", ()))
    nxt = p.get("next_sub_goal")
    if b := s.block(p.get("block_id")):
        b.status = "handed-off"
        b.handoff = {"block_id": b.block_id, "outcome": outcome, "state_reached": state_reached,
                     "findings": findings, "next_sub_goal": nxt}
    s.last_handoff = {"block_id": p.get("block_id"), "outcome": outcome,
                      "state_reached": state_reached, "findings": list(findings),
                      "next_sub_goal": nxt}
    s.no_progress_streak = s.no_progress_streak + 1 if outcome == "no-progress" else 0
    s.last_turn = "handed-off"


def _accepted(s: Task, p: Fields) -> None:
    summary = p.get("summary", "")
    s.accepted.append({"block_id": p.get("block_id"), "candidate": dict(p.get("candidate", {})),
                       "summary": summary, "event_id": _text(p.get("event_id")),
                       "verification_event_id": _text(p.get("verification_event_id") or "")})
    if b := s.block(p.get("block_id")):
        b.decision, b.decision_reason = "accepted", summary


def _rejected(s: Task, p: Fields) -> None:
    s.rejected.append({"block_id": p.get("block_id"), "candidate": dict(p.get("candidate", {})),
                       "reason": p["reason"]})
    if b := s.block(p.get("block_id")):
        b.decision, b.decision_reason = "rejected", p["reason"]


def _exited(s: Task, p: Fields) -> None:
    s.status = "exited"
    s.exit_state, s.exit_reason = p["state"], p["reason"]
    s.exit_handoff = _text(p.get("handoff"))
    s.exits.append({"state": p["state"], "reason": p["reason"], "reopened": None})
    s.exited_at = _text(p.get("occurred_at"))
    s.last_turn = "exited"


def _reopened(s: Task, p: Fields) -> None:
    # The exit stays in the history, marked with why it was reopened.
    if s.exits and s.status == "exited":
        s.exits[-1]["reopened"] = p["reason"]
    s.status = "running"
    s.exit_state = s.exit_reason = s.exit_handoff = None
    s.no_progress_streak = 0
    s.reopened_after = len(s.blocks)
    if s.exited_at is not None:
        s.pauses.append((s.exited_at, _text(p.get("occurred_at"))))
        s.exited_at = None
    s.last_turn = "reopened"


FOLDS: dict[str, Callable[[Task, Fields], None]] = {
    E.TaskDefined.TYPE: _defined,
    E.LoopBlockStarted.TYPE: _block_started,
    E.MeasurementRecorded.TYPE: _measured,
    E.ToolInvoked.TYPE: _tool,
    E.ModelCalled.TYPE: _model_called,
    E.MeasurementInvalidated.TYPE: _invalidated,
    E.VerificationRecorded.TYPE: _verified,
    E.LoopBlockHandedOff.TYPE: _handed_off,
    E.DeliverableAccepted.TYPE: _accepted,
    E.DirectionRejected.TYPE: _rejected,
    E.TaskExited.TYPE: _exited,
    E.TaskReopened.TYPE: _reopened,
}


def apply_payload(task: Task, topic: str, payload: Fields) -> Task:
    """Fold the fields of one event of type `topic` into `task`, in place (callers own the
    task object): a stored payload `codec.load_current` accepted, or `event.__dict__`.
    Events that do not change a task's state still advance its version."""
    task.__dict__["version"] += 1
    fold = FOLDS.get(topic)
    if fold is not None:
        fold(task, payload)
    return task


def apply(task: Task, event: E.Event) -> Task:
    """Fold one decoded event: the same fold, reading the event's own fields."""
    return apply_payload(task, event.TYPE, event.__dict__)


def fold(events: Iterable[E.Event], task: Task | None = None) -> Task:
    """The task after `events` (folded into `task`, or a new one, with records)."""
    task = task or Task()
    # The records are acyclic; left on, the cyclic collector is triggered by their
    # allocations and re-walks the whole heap, the events included (half the time of Task
    # Memory for a 100k-event task; `ledger.replay` does the same).
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for ev in events:
            apply(task, ev)
    finally:
        if gc_was_on:
            gc.enable()
    return task
