"""Task Memory: what a loop (or a person, or an agent) needs to decide the next block.

Derived from a task stream's events only — never a mutable file. It is the task's state from
the one fold of a task stream (`ledger.state`: status, exits, blocks with their handoffs and
decisions, accepted and rejected) plus what Task Memory adds on top, event by event:

- each block's records: its start time, tool calls, measurements (marked when invalidated)
  and latest verification, which the fold only counts;
- the task's model usage (calls, tokens in/out, cost: what its model budgets count);
- derived views: the current (open) loop block, the last handoff, the next loop block (index
  and the sub-goal the last handoff proposed), the baseline and best-so-far on the contract's
  primary metric (`Contract.primary`), accepted deliverables with their evidence, the
  effective-config digests already tried, and the trailing no-progress streak.

`build_memory(events)` is a pure fold; `read_memory(ledger, task_id)` reads the stream and
folds it (the loop, `forge task memory`); `list_tasks` and `task_summary` are the read
queries of `forge task list` and `forge task show`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..ledger import events as E
from ..ledger.errors import NotFoundError
from ..ledger.ids import LEDGER_CONTEXT, shown, unknown_id_hint
from ..ledger.specs import Contract
from ..ledger.state import TaskState, apply
from ..ledger.store import Ledger, OnError, Undecodable
from ..ledger.streams import task_of, task_stream


class BlockRecord(BaseModel):
    """One block of the execution record: the fold's block (identity, status, handoff,
    decision) with the records Task Memory keeps of its events."""

    model_config = ConfigDict(extra="forbid")

    block_id: str
    index: int
    sub_goal: str
    routing: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    config_digest: str | None = None
    started_at: str | None = None
    status: str = "running"  # running | handed-off
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    measurements: list[dict[str, Any]] = Field(default_factory=list)
    verification: dict[str, Any] | None = None
    decision: str | None = None  # accepted | rejected
    decision_reason: str | None = None
    handoff: dict[str, Any] | None = None

    @property
    def is_baseline(self) -> bool:
        return not self.candidate

    def runs(self) -> list[dict[str, Any]]:
        """The valid runs' metrics and success; `accuracy` too where the run's meta has
        the contract's accuracy gates' results (what the gates judge)."""
        out = []
        for m in self.measurements:
            if m.get("invalidated"):
                continue
            r = {"metrics": m["metrics"], "success": m["success"]}
            if acc := (m.get("meta") or {}).get("accuracy"):
                r["accuracy"] = acc
            out.append(r)
        return out

    def median(self, metric: str) -> float | None:
        xs = [r["metrics"][metric] for r in self.runs() if r["success"] and metric in r["metrics"]]
        return statistics.median(xs) if xs else None


class TaskMemory(BaseModel):
    """Fields marked `exclude` serve the loop (reopened tasks) and are not part of the
    `forge task memory` output."""

    model_config = ConfigDict(extra="forbid")

    task_id: str | None = None
    status: str = "undefined"  # undefined | defined | running | exited
    exit_state: str | None = None
    exit_reason: str | None = None
    definition: dict[str, Any] = Field(default_factory=dict)
    definition_hash: str | None = None
    point_hash: str | None = None
    profile_hash: str | None = None
    contract_hash: str | None = None
    primary_metric: str | None = None
    primary_direction: str | None = None  # at_least (higher is better) | at_most
    current_block: BlockRecord | None = None
    last_handoff: dict[str, Any] | None = None
    next_block: dict[str, Any] | None = None
    execution_record: list[BlockRecord] = Field(default_factory=list)
    baseline: dict[str, Any] | None = None
    best_so_far: dict[str, Any] | None = None
    accepted: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[dict[str, Any]] = Field(default_factory=list)
    tried: list[str] = Field(default_factory=list)
    no_progress_streak: int = 0
    first_block_at: str | None = None
    # The task's model calls (ModelCalled, any block or none): what its budgets count.
    model_calls: int = 0
    model_tokens_in: int = 0
    model_tokens_out: int = 0
    model_cost_usd: float = 0.0
    exits: list[dict[str, Any]] = Field(default_factory=list, exclude=True)  # the fold's
    reopened_after: int | None = Field(None, exclude=True)  # blocks at the last reopen
    paused_s: float = Field(0.0, exclude=True)  # time spent exited before a reopen

    def block(self, block_id: str | None) -> BlockRecord | None:
        for b in reversed(self.execution_record):
            if b.block_id == block_id:
                return b
        return None

    def baseline_block(self) -> BlockRecord | None:
        """The latest measured baseline block (a reopened task may measure it again)."""
        for b in reversed(self.execution_record):
            if b.is_baseline and b.measurements:
                return b
        return None

    def before_reopen(self, b: BlockRecord) -> bool:
        """Whether block `b` ran before the task was last reopened."""
        return self.reopened_after is not None and any(
            x is b for x in self.execution_record[:self.reopened_after])


class _Builder:
    """The fold's state and, aligned with its blocks, what Task Memory keeps on top."""

    def __init__(self) -> None:
        self.state = TaskState()
        self.blocks: list[BlockRecord] = []
        self.mem = TaskMemory()  # the derived views, filled as events come
        self.exited_at: datetime | None = None

    def block(self, block_id: str | None) -> BlockRecord | None:
        i = self.state.block_index(block_id)
        return None if i is None else self.blocks[i]

    def memory(self) -> TaskMemory:
        st, mem = self.state, self.mem
        for rec, b in zip(self.blocks, st.blocks, strict=True):
            rec.status, rec.decision, rec.decision_reason = b.status, b.decision, b.decision_reason
            rec.handoff = None if b.handoff is None else {"block_id": b.block_id, **b.handoff}
        last = self.blocks[-1] if self.blocks else None
        mem.task_id, mem.status = st.task_id, st.status
        mem.exit_state, mem.exit_reason, mem.exits = st.exit_state, st.exit_reason, st.exits
        mem.definition, mem.definition_hash = st.definition, st.definition_hash
        mem.point_hash, mem.profile_hash = st.point_hash, st.profile_hash
        mem.contract_hash = st.contract_hash
        mem.execution_record = self.blocks
        mem.current_block = last if last is not None and last.status == "running" else None
        mem.rejected = st.rejected
        mem.tried = list(dict.fromkeys(b.config_digest for b in self.blocks if b.config_digest))
        mem.first_block_at = self.blocks[0].started_at if self.blocks else None
        return mem


def _defined(r: _Builder, ev: E.TaskDefined) -> None:
    try:
        gate = Contract.model_validate(r.state.definition.get("contract"),
                                       context=LEDGER_CONTEXT).primary
    except ValidationError:  # not a task loop's definition (a graph node's, say)
        gate = None
    r.mem.primary_metric = gate.metric if gate else None
    r.mem.primary_direction = None if gate is None else \
        "at_least" if gate.at_least is not None else "at_most"


def _started(r: _Builder, ev: E.LoopBlockStarted) -> None:
    b = r.state.blocks[-1]
    r.blocks.append(BlockRecord(block_id=b.block_id, index=b.index, sub_goal=b.sub_goal,
                                routing=b.routing, candidate=b.candidate,
                                config_digest=b.config_digest,
                                started_at=ev.occurred_at.isoformat()))
    r.mem.next_block = None


def _tool(r: _Builder, ev: E.ToolInvoked) -> None:
    if b := r.block(ev.block_id):
        b.tool_calls.append({"tool": ev.tool, "argv": list(ev.argv), "exit_code": ev.exit_code,
                             "event_id": str(ev.event_id)})


def _model_called(r: _Builder, ev: E.ModelCalled) -> None:
    mem = r.mem
    mem.model_calls += 1
    mem.model_tokens_in += ev.tokens_in
    mem.model_tokens_out += ev.tokens_out
    mem.model_cost_usd = round(mem.model_cost_usd + ev.cost_usd, 8)


def _measured(r: _Builder, ev: E.MeasurementRecorded) -> None:
    if b := r.block(ev.block_id):
        b.measurements.append({"event_id": str(ev.event_id), "run_id": ev.run_id,
                               "repeat": ev.repeat, "metrics": dict(ev.metrics),
                               "success": ev.success, "error": ev.error, "source": ev.source,
                               "meta": dict(ev.meta), "artifact_digest": ev.artifact_digest})


def _invalidated(r: _Builder, ev: E.MeasurementInvalidated) -> None:
    target = str(ev.measurement_event_id)
    for b in r.blocks:
        for m in b.measurements:
            if m["event_id"] == target:
                m["invalidated"] = ev.reason


def _verified(r: _Builder, ev: E.VerificationRecorded) -> None:
    if b := r.block(ev.block_id):
        b.verification = {"event_id": str(ev.event_id), "verdict": ev.verdict,
                          "passed": ev.passed, "contract_hash": ev.contract_hash,
                          "point_hash": ev.point_hash,
                          "gates": [g.to_dict() for g in ev.gates],
                          "steps": [x.model_dump() for x in ev.steps],
                          "candidate": dict(ev.candidate),
                          "differs": [d.model_dump() for d in ev.differs]}
        _update_best(r.mem, b)


def _accepted(r: _Builder, ev: E.DeliverableAccepted) -> None:
    r.mem.accepted.append({**r.state.accepted[-1], "event_id": str(ev.event_id),
                           "verification_event_id": str(ev.verification_event_id or "")})


def _handed_off(r: _Builder, ev: E.LoopBlockHandedOff) -> None:
    mem = r.mem
    mem.last_handoff = {"block_id": ev.block_id, "outcome": ev.outcome,
                        "state_reached": ev.state_reached, "findings": list(ev.findings),
                        "next_sub_goal": ev.next_sub_goal}
    mem.no_progress_streak = mem.no_progress_streak + 1 if ev.outcome == "no-progress" else 0
    mem.next_block = {"index": len(r.blocks) + 1, "sub_goal": ev.next_sub_goal}


def _exited(r: _Builder, ev: E.TaskExited) -> None:
    r.mem.next_block = None
    r.exited_at = ev.occurred_at


def _reopened(r: _Builder, ev: E.TaskReopened) -> None:
    mem = r.mem
    mem.no_progress_streak = 0
    mem.next_block = {"index": len(r.blocks) + 1, "sub_goal": None}
    mem.reopened_after = len(r.blocks)
    if r.exited_at is not None:
        mem.paused_s += max(0.0, (ev.occurred_at - r.exited_at).total_seconds())
        r.exited_at = None


_STEPS: dict[str, Callable[[_Builder, Any], None]] = {
    E.TaskDefined.TYPE: _defined,
    E.LoopBlockStarted.TYPE: _started,
    E.ToolInvoked.TYPE: _tool,
    E.ModelCalled.TYPE: _model_called,
    E.MeasurementRecorded.TYPE: _measured,
    E.MeasurementInvalidated.TYPE: _invalidated,
    E.VerificationRecorded.TYPE: _verified,
    E.DeliverableAccepted.TYPE: _accepted,
    E.LoopBlockHandedOff.TYPE: _handed_off,
    E.TaskExited.TYPE: _exited,
    E.TaskReopened.TYPE: _reopened,
}


def _update_best(mem: TaskMemory, b: BlockRecord) -> None:
    if b.is_baseline:
        med = b.median(mem.primary_metric) if mem.primary_metric else None
        mem.baseline = {"block_id": b.block_id, "metric": mem.primary_metric, "median": med,
                        "verdict": (b.verification or {}).get("verdict")}
        if mem.best_so_far is None or (mem.best_so_far["median"] is None and med is not None):
            # (a baseline measured again after a reopen replaces one that had no median)
            mem.best_so_far = {"block_id": b.block_id, "candidate": {}, "metric":
                               mem.primary_metric, "median": med, "verdict": "baseline"}
        return
    if not mem.primary_metric or b.verification is None:
        return
    # A candidate that broke a gate other than the primary one is not "better", however fast.
    other_failed = any(g.get("verdict") == "fail" and g.get("metric") != mem.primary_metric
                       for g in b.verification["gates"])
    med = b.median(mem.primary_metric)
    if other_failed or med is None:
        return
    best = (mem.best_so_far or {}).get("median")
    higher = mem.primary_direction == "at_least"
    if best is None or (med > best if higher else med < best):
        mem.best_so_far = {"block_id": b.block_id, "candidate": dict(b.candidate),
                           "metric": mem.primary_metric, "median": med,
                           "verdict": b.verification["verdict"]}


def build_memory(events: Iterable[E.Event]) -> TaskMemory:
    """Fold the events with the task fold (`ledger.state.apply`), then Task Memory's step."""
    r = _Builder()
    for ev in events:
        apply(r.state, ev)
        step = _STEPS.get(ev.TYPE)
        if step is not None:
            step(r, ev)
    return r.memory()


def read_memory(ledger: Ledger, task_id: str, on_error: OnError = None
                ) -> tuple[TaskMemory, int]:
    """The task's memory and its stream's version (what a save appends after). An
    undecodable event raises, naming its position (a loop must not act on part of a
    history), or, given `on_error` (readers), is handed to it and left out."""
    bad: list[Undecodable] = []
    records = ledger.stream(task_stream(task_id),
                            on_error=None if on_error is None else bad.append)
    if not records and not bad:
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                            "(define it with forge task new FILE.yaml)")
    for u in bad:
        on_error(u)  # type: ignore[misc]
    version = max([r.version for r in records[-1:]] + [u.version for u in bad[-1:]])
    return build_memory(r.event for r in records), version


def task_memory(ledger: Ledger, task_id: str, on_error: OnError = None) -> TaskMemory:
    """`forge task memory`: the task's memory from its stream (see `read_memory`)."""
    return read_memory(ledger, task_id, on_error)[0]


# --- read queries over task streams: `forge task list`, `forge task show` ------------------


def list_tasks(ledger: Ledger, on_error: OnError = None) -> list[dict[str, Any]]:
    """Every task with its status. Undecodable events raise, or, given `on_error`, are
    handed to it and left out (a task whose definition is damaged is still listed)."""
    ids = []
    # The task ids are the streams' names: no need to decode the definitions to list them.
    for _pos, stream, version, _topic, _state in ledger.rows(types=[E.TaskDefined.TYPE]):
        tid = task_of(stream)
        if tid is not None and version == 1:
            ids.append(tid)
    out = []
    for tid in ids:
        damaged: list[Undecodable] = []
        mem, _ = read_memory(ledger, tid, None if on_error is None else damaged.append)
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


def task_summary(ledger: Ledger, task_id: str, on_error: OnError = None) -> dict[str, Any]:
    mem, version = read_memory(ledger, task_id, on_error)
    return {"task_id": task_id, "status": mem.status, "exit_state": mem.exit_state,
            "exit_reason": mem.exit_reason, "definition": mem.definition,
            "definition_hash": mem.definition_hash, "point_hash": mem.point_hash,
            "profile_hash": mem.profile_hash, "contract_hash": mem.contract_hash,
            "version": version,
            "blocks": [{"block_id": b.block_id, "sub_goal": b.sub_goal,
                        "candidate": b.candidate, "routing": b.routing, "status": b.status,
                        "measurements": len(b.measurements), "tool_calls": len(b.tool_calls),
                        "verdict": (b.verification or {}).get("verdict"),
                        "differs": (b.verification or {}).get("differs", []),
                        "decision": b.decision, "outcome": (b.handoff or {}).get("outcome")}
                       for b in mem.execution_record],
            "best_so_far": mem.best_so_far}
