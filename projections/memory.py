"""Task Memory: what a loop (or a person, or an agent) needs to decide the next block.

Derived from a task stream's events only — never a mutable file. `build_memory(events)` is a
pure fold; `task_memory(ledger, task_id)` reads the stream and folds it.

Fields: the current (open) loop block, the last handoff, the next loop block (index and the
sub-goal the last handoff proposed), the execution record (every block with its candidate,
routing, tool calls, measurements, verification and decision), best-so-far on the contract's
primary metric, accepted deliverables, rejected directions with reasons, the effective-config
digests already tried, and the trailing no-progress streak.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..ledger import events as E
from ..ledger.errors import NotFoundError
from ..ledger.store import Ledger, OnError, Undecodable, task_stream


class BlockRecord(BaseModel):
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
        return [{"metrics": m["metrics"], "success": m["success"]} for m in self.measurements
                if not m.get("invalidated")]

    def median(self, metric: str) -> float | None:
        xs = [r["metrics"][metric] for r in self.runs() if r["success"] and metric in r["metrics"]]
        return statistics.median(xs) if xs else None


class TaskMemory(BaseModel):
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

    def block(self, block_id: str | None) -> BlockRecord | None:
        for b in reversed(self.execution_record):
            if b.block_id == block_id:
                return b
        return None

    def baseline_block(self) -> BlockRecord | None:
        for b in self.execution_record:
            if b.is_baseline and b.measurements:
                return b
        return None


def _primary(definition: dict[str, Any]) -> tuple[str | None, str | None]:
    gates = definition.get("contract", {}).get("gates", [])
    for want_rel in (True, False):
        for g in gates:
            if g.get("metric") and bool(g.get("vs_baseline")) == want_rel \
                    and (g.get("at_least") is not None or g.get("at_most") is not None):
                return g["metric"], "at_least" if g.get("at_least") is not None else "at_most"
    return None, None


def apply(mem: TaskMemory, ev: E.Event) -> TaskMemory:
    match ev:
        case E.TaskDefined():
            mem.task_id, mem.status = ev.task_id, "defined"
            mem.definition = dict(ev.definition)
            mem.definition_hash, mem.point_hash = ev.definition_hash, ev.point_hash
            mem.profile_hash = ev.profile_hash
            mem.contract_hash = ev.input_digests.get("contract")
            mem.primary_metric, mem.primary_direction = _primary(mem.definition)
        case E.LoopBlockStarted():
            b = BlockRecord(block_id=ev.block_id or f"b{ev.index}", index=ev.index,
                            sub_goal=ev.sub_goal, routing=dict(ev.routing),
                            candidate=dict(ev.candidate),
                            config_digest=ev.input_digests.get("config"),
                            started_at=ev.occurred_at.isoformat())
            mem.execution_record.append(b)
            mem.current_block = b
            mem.status = "running"
            mem.first_block_at = mem.first_block_at or b.started_at
            if b.config_digest and b.config_digest not in mem.tried:
                mem.tried.append(b.config_digest)
            mem.next_block = None
        case E.ToolInvoked():
            if b := mem.block(ev.block_id):
                b.tool_calls.append({"tool": ev.tool, "argv": list(ev.argv),
                                     "exit_code": ev.exit_code, "event_id": str(ev.event_id)})
        case E.MeasurementRecorded():
            if b := mem.block(ev.block_id):
                b.measurements.append({"event_id": str(ev.event_id), "run_id": ev.run_id,
                                       "repeat": ev.repeat, "metrics": dict(ev.metrics),
                                       "success": ev.success, "error": ev.error,
                                       "source": ev.source, "meta": dict(ev.meta),
                                       "artifact_digest": ev.artifact_digest})
        case E.MeasurementInvalidated():
            for b in mem.execution_record:
                for m in b.measurements:
                    if m["event_id"] == str(ev.measurement_event_id):
                        m["invalidated"] = ev.reason
        case E.VerificationRecorded():
            if b := mem.block(ev.block_id):
                b.verification = {"event_id": str(ev.event_id), "verdict": ev.verdict,
                                  "passed": ev.passed, "contract_hash": ev.contract_hash,
                                  "point_hash": ev.point_hash, "gates": list(ev.gates),
                                  "candidate": dict(ev.candidate)}
                _update_best(mem, b)
        case E.DeliverableAccepted():
            b = mem.block(ev.block_id)
            if b:
                b.decision, b.decision_reason = "accepted", ev.summary
            mem.accepted.append({"block_id": ev.block_id, "candidate": dict(ev.candidate),
                                 "summary": ev.summary, "event_id": str(ev.event_id),
                                 "verification_event_id": str(ev.verification_event_id or "")})
        case E.DirectionRejected():
            b = mem.block(ev.block_id)
            if b:
                b.decision, b.decision_reason = "rejected", ev.reason
            mem.rejected.append({"block_id": ev.block_id, "candidate": dict(ev.candidate),
                                 "reason": ev.reason})
        case E.LoopBlockHandedOff():
            b = mem.block(ev.block_id)
            handoff = {"block_id": ev.block_id, "outcome": ev.outcome,
                       "state_reached": ev.state_reached, "findings": list(ev.findings),
                       "next_sub_goal": ev.next_sub_goal}
            if b:
                b.status, b.handoff = "handed-off", handoff
            mem.last_handoff = handoff
            if mem.current_block and mem.current_block.block_id == ev.block_id:
                mem.current_block = None
            mem.no_progress_streak = mem.no_progress_streak + 1 \
                if ev.outcome == "no-progress" else 0
            mem.next_block = {"index": len(mem.execution_record) + 1,
                              "sub_goal": ev.next_sub_goal}
        case E.TaskExited():
            mem.status, mem.exit_state, mem.exit_reason = "exited", ev.state, ev.reason
            mem.next_block = None
        case E.TaskReopened():
            mem.status, mem.exit_state, mem.exit_reason = "running", None, None
            mem.no_progress_streak = 0
            mem.next_block = {"index": len(mem.execution_record) + 1, "sub_goal": None}
    return mem


def _update_best(mem: TaskMemory, b: BlockRecord) -> None:
    if b.is_baseline:
        med = b.median(mem.primary_metric) if mem.primary_metric else None
        mem.baseline = {"block_id": b.block_id, "metric": mem.primary_metric, "median": med,
                        "verdict": (b.verification or {}).get("verdict")}
        if mem.best_so_far is None:
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
    mem = TaskMemory()
    for ev in events:
        apply(mem, ev)
    return mem


def task_memory(ledger: Ledger, task_id: str, on_error: OnError = None) -> TaskMemory:
    """The task's memory from its stream. An undecodable event raises (naming its position),
    or, given `on_error` (readers: `forge task memory`), is handed to it and left out."""
    bad: list[Undecodable] = []
    records = ledger.stream(task_stream(task_id),
                            on_error=None if on_error is None else bad.append)
    if not records and not bad:
        raise NotFoundError(f"unknown task {task_id!r}")
    for u in bad:
        on_error(u)  # type: ignore[misc]
    return build_memory(r.event for r in records)
