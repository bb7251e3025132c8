"""The manual path: a person or an outside agent drives the loop (`forge block start`,
`forge run --`, `forge measure`, `forge block verify|handoff`, `forge task accept|reject|
exit|reopen`) under the same state machine as the automatic loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger import numbers as N
from ...ledger.candidates import canonical_candidate
from ...ledger.sizes import MAX_ARTIFACT_BYTES, handoff_problem
from ...ledger.specs import (
    effective_digest,
)
from ...ledger.workspace import Workspace
from ...projections.memory import BlockRecord, TaskMemory, read_memory
from ..errors import HarnessError
from ..record import append_to_task
from ..task import LoadedTask, human_actor, load_task_from_ledger
from ..tool_calls.calls import output_tail, run_tool
from . import code
from .decision import describe, out_of_scope
from .routing import route
from .steps import Stepper, start_events, verify_event, wall_elapsed


def _open(ws: Workspace, task_id: str) -> tuple[LoadedTask, TaskMemory, int]:
    lt = load_task_from_ledger(ws, task_id)
    mem, version = read_memory(ws.ledger, task_id)
    if mem.status == "exited":
        raise HarnessError(f"task {task_id} has exited ({mem.exit_state}); nothing more is "
                           "recorded in it")
    return lt, mem, version


def _need_block(task_id: str, mem: TaskMemory, what: str) -> BlockRecord:
    if mem.current_block is None:
        raise HarnessError(f"task {task_id}: no open loop block; {what} happens inside a block "
                           f"(forge block start {task_id} --sub-goal ...)")
    return mem.current_block


def start_block(ws: Workspace, task_id: str, sub_goal: str, candidate: dict[str, Any] | None = None,
                actor: E.Actor | None = None) -> dict[str, Any]:
    lt, mem, version = _open(ws, task_id)
    if mem.current_block is not None:
        raise HarnessError(f"task {task_id}: block {mem.current_block.block_id} is still open; "
                           "hand it off first (forge block handoff)")
    cand = code.resolve(ws, lt, dict(candidate or {}))  # code.<member>: its commit id
    cand = canonical_candidate(lt.task.scope, cand)  # `1` for a bool flag is `true`: tried
    problem = out_of_scope(lt.task, lt.point, lt.profile, cand) if cand else None
    if problem:
        raise HarnessError(f"task {task_id}: candidate out of scope: {problem}")
    if effective_digest(lt.point, lt.profile, cand) in mem.tried:
        raise HarnessError(f"task {task_id}: {describe(cand)} was already tried; "
                           "a candidate already tried is not run again")
    index = len(mem.execution_record) + 1
    bid = f"b{index}"
    st = Stepper(ws, lt, lambda _s: None)
    routing = route(lt.task, mem.no_progress_streak, None)
    evs = start_events(st, mem, bid, index, sub_goal, routing, cand, actor or human_actor(),
                        None)
    st.save(f"{bid}:start", evs, version, memory=mem)
    return {"task_id": task_id, "block_id": bid, "index": index, "candidate": cand}


def run_command(ws: Workspace, task_id: str, argv: list[str], cwd: str | None = None,
                tee: bool = True, actor: E.Actor | None = None) -> dict[str, Any]:
    """`forge run -- CMD`: run CMD as a recorded tool call of the task's open block. The
    answer: the call's exit code, error, output artifacts' digests and event id, and what an
    agent reads back of its output (`tool_calls.calls.output_tail`: redacted, each stream's
    tail)."""
    if not argv:
        raise HarnessError("forge run: give the command after --")
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a tool call")
    run = run_tool(ws, argv, cwd=cwd, tee=tee, sandbox=lt.task.sandbox,
                   event_fields={"task_id": task_id, "block_id": blk.block_id,
                                 "actor": actor or human_actor(),
                                 "input_digests": lt.digests})
    # The state the command ran on (when the workspace has a MonoRepo).
    evs = code.with_snapshot([run.event], code.snapshot(ws, lt, f"task {task_id} tool call"))
    # No version expected: the command may have run a long time, and what was recorded
    # meanwhile stands (the writer reads the stream again only if it moved since `version`).
    append_to_task(ws, task_id, evs, memory=mem, version=version,
                   command_id=f"{task_id}:{blk.block_id}:run:{run.event.event_id}")
    return {"task_id": task_id, "block_id": blk.block_id, "exit_code": run.returncode,
            "error": run.event.error, "stdout_digest": run.event.stdout_digest,
            "stderr_digest": run.event.stderr_digest, "event_id": str(run.event.event_id),
            **output_tail(run)}


def record_measurement(ws: Workspace, task_id: str, metrics: dict[str, float], *,
                       source: str = "manual", success: bool = True, error: str | None = None,
                       artifact: str | Path | None = None, actor: E.Actor | None = None
                       ) -> dict[str, Any]:
    # Before anything is read or stored: a NaN or infinite metric is refused by name.
    values = {k: N.finite_float(v, f"metric {k}") for k, v in metrics.items()}
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a measurement")
    n = len(blk.measurements)
    digest_ = ws.artifacts.put_file(artifact, limit=MAX_ARTIFACT_BYTES) if artifact else None
    ev = E.MeasurementRecorded(run_id=f"{blk.block_id}-m{n + 1}", source=source,
                               metrics=values,
                               candidate=blk.candidate, repeat=n, success=success, error=error,
                               artifact_digest=digest_, task_id=task_id, block_id=blk.block_id,
                               actor=actor or human_actor(), input_digests=lt.digests)
    sid = code.snapshot(ws, lt, f"task {task_id} {blk.block_id} measured")
    append_to_task(ws, task_id, code.with_snapshot([ev], sid), expected_version=version,
                   memory=mem, command_id=f"{task_id}:{blk.block_id}:measure:{ev.event_id}")
    return {"task_id": task_id, "block_id": blk.block_id, "run_id": ev.run_id,
            "event_id": str(ev.event_id)}


def verify_block(ws: Workspace, task_id: str, actor: E.Actor | None = None) -> dict[str, Any]:
    """Verify the open block: the task's verification path in order (its command steps run
    as recorded tool calls), the contract's gates judged on the block's measurements
    against the baseline at `gates`."""
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a verification")
    if not blk.measurements:
        raise HarnessError(f"task {task_id}: block {blk.block_id} has no measurements to verify")
    st = Stepper(ws, lt, lambda _s: None)
    ver = verify_event(st, blk, mem, actor or human_actor())
    sid = code.snapshot(ws, lt, f"task {task_id} {blk.block_id} verified")
    append_to_task(ws, task_id, code.with_snapshot(ver.events, sid), expected_version=version,
                   memory=mem, command_id=f"{task_id}:{blk.block_id}:verify:{ver.event.event_id}")
    ev = ver.event
    return {"task_id": task_id, "block_id": blk.block_id, "verdict": ev.verdict,
            "reason": ver.reason(), "gates": [g.to_dict() for g in ev.gates],
            "steps": [x.model_dump() for x in ev.steps], "event_id": str(ev.event_id)}


def handoff_block(ws: Workspace, task_id: str, *, state_reached: str, findings: list[str] = (),  # type: ignore[assignment]
                  next_sub_goal: str | None = None, outcome: str = "progress",
                  actor: E.Actor | None = None) -> dict[str, Any]:
    problem = handoff_problem(state_reached, list(findings), next_sub_goal)
    if problem:  # an agent's or a person's text, recorded whole: bounded (ledger/sizes.py)
        raise HarnessError(f"task {task_id}: handoff refused: {problem}")
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a handoff")
    ev = E.LoopBlockHandedOff(outcome=outcome, state_reached=state_reached,
                              findings=list(findings), next_sub_goal=next_sub_goal,
                              task_id=task_id, block_id=blk.block_id,
                              actor=actor or human_actor(),
                              input_digests=lt.digests)
    append_to_task(ws, task_id, [ev], expected_version=version, memory=mem,
                   command_id=f"{task_id}:{blk.block_id}:handoff")
    return {"task_id": task_id, "block_id": blk.block_id, "outcome": outcome}


def _target_block(task_id: str, mem: TaskMemory, block: str | None) -> BlockRecord:
    if block:
        b = mem.block(block)
        if b is None:
            raise HarnessError(f"task {task_id}: no block {block}")
        return b
    if mem.current_block is not None:
        return mem.current_block
    if not mem.execution_record:
        raise HarnessError(f"task {task_id}: no loop block yet")
    return mem.execution_record[-1]


def accept(ws: Workspace, task_id: str, *, block: str | None = None, summary: str = "",
           actor: E.Actor | None = None) -> dict[str, Any]:
    """Accept a block's candidate: needs its latest verification to pass, for this task's
    contract on this task's deployment point."""
    lt, mem, version = _open(ws, task_id)
    b = _target_block(task_id, mem, block)
    v = b.verification
    if v is None:
        raise HarnessError(f"task {task_id}: block {b.block_id} has no verification; "
                           "acceptance needs a passing one (forge block verify)")
    if not v["passed"]:
        raise HarnessError(f"task {task_id}: block {b.block_id}'s verification is "
                           f"{v['verdict']}; acceptance needs pass")
    if v["contract_hash"] != lt.contract_hash:
        raise HarnessError(f"task {task_id}: block {b.block_id} was verified against contract "
                           f"{v['contract_hash']}, not this task's {lt.contract_hash}")
    if v["point_hash"] != lt.point_hash:
        raise HarnessError(f"task {task_id}: block {b.block_id} was verified on point "
                           f"{v['point_hash']}, not this task's {lt.point_hash}")
    if b.is_baseline:
        raise HarnessError(f"task {task_id}: block {b.block_id} is the baseline; nothing to "
                           "deliver")
    ev = E.DeliverableAccepted(candidate=b.candidate, summary=summary or
                               f"{describe(b.candidate)} passes every gate",
                               verification_event_id=v["event_id"], evidence=[v["event_id"]],
                               task_id=task_id, block_id=b.block_id,
                               actor=actor or human_actor(), input_digests=lt.digests)
    append_to_task(ws, task_id, [ev], expected_version=version, memory=mem,
                   command_id=f"{task_id}:{b.block_id}:accept:{ev.event_id}")
    return {"task_id": task_id, "block_id": b.block_id, "event_id": str(ev.event_id)}


def reject(ws: Workspace, task_id: str, reason: str, *, block: str | None = None) -> dict[str, Any]:
    if not reason.strip():
        raise HarnessError("a rejection needs --reason")
    lt, mem, version = _open(ws, task_id)
    b = _target_block(task_id, mem, block)
    ev = E.DirectionRejected(candidate=b.candidate, reason=reason,
                             evidence=[b.verification["event_id"]] if b.verification else [],
                             task_id=task_id, block_id=b.block_id, actor=human_actor(),
                             input_digests=lt.digests)
    append_to_task(ws, task_id, [ev], expected_version=version, memory=mem,
                   command_id=f"{task_id}:{b.block_id}:reject:{ev.event_id}")
    return {"task_id": task_id, "block_id": b.block_id, "event_id": str(ev.event_id)}


def exit_task(ws: Workspace, task_id: str, state: str, reason: str, *, handoff: str | None = None,
              actor: E.Actor | None = None) -> dict[str, Any]:
    """A human exit. Each state needs its criteria: delivered an accepted deliverable;
    follow-up-handoff a handoff note; failed-budget a spent budget; failed-no-progress the
    no-progress streak; every state a reason."""
    lt, mem, version = _open(ws, task_id)
    if not reason.strip():
        raise HarnessError("an exit needs --reason")
    evidence: list[str] = []
    if state == "delivered":
        if not mem.accepted:
            raise HarnessError(f"task {task_id}: delivered needs an accepted deliverable "
                               "(forge task accept)")
        evidence = [mem.accepted[-1]["event_id"], mem.accepted[-1]["verification_event_id"]]
    elif state == "follow-up-handoff":
        if not (handoff or "").strip():
            raise HarnessError("follow-up-handoff needs --handoff NOTE for whoever picks it up")
    elif state == "failed-budget":
        ex = lt.task.exit
        if len(mem.execution_record) < ex.max_blocks and wall_elapsed(mem) < ex.max_wall_s:
            raise HarnessError(f"task {task_id}: budget not spent ({len(mem.execution_record)}"
                               f"/{ex.max_blocks} blocks); use another state")
    elif state == "failed-no-progress":
        if mem.no_progress_streak < lt.task.exit.no_progress_blocks:
            raise HarnessError(f"task {task_id}: only {mem.no_progress_streak} no-progress "
                               "blocks in a row; use another state")
    elif state not in ("failed-unverifiable", "failed-blocked", "aborted-by-human"):
        raise HarnessError(f"unknown exit state {state!r}")
    evidence += [b.block_id for b in mem.execution_record]
    ev = E.TaskExited(state=state, reason=reason, handoff=handoff,
                      evidence=evidence, task_id=task_id, actor=actor or human_actor(),
                      input_digests=lt.digests)
    append_to_task(ws, task_id, [ev], expected_version=version, memory=mem,
                   command_id=f"{task_id}:exit:{ev.event_id}")
    return {"task_id": task_id, "state": state, "event_id": str(ev.event_id)}



# Exit states a person may reopen: the blocker, the noise, the idea, the person came back.
# Not `delivered` (its deliverable stands: a new task goes further) nor `failed-budget` (the
# budget is part of the task's definition: it would exit again at once).
REOPENABLE = ("failed-blocked", "failed-unverifiable", "failed-no-progress",
              "follow-up-handoff", "aborted-by-human")


def reopen_task(ws: Workspace, task_id: str, reason: str, *, actor: E.Actor | None = None
                ) -> dict[str, Any]:
    """`forge task reopen`: an exited task runs again (`forge task run` or the manual path
    continue it). Appends TaskReopened; the fold keeps the exit in the task's history, and a
    reopened task whose baseline blocked it measures the baseline again."""
    if not reason.strip():
        raise HarnessError("a reopen needs --reason")
    mem, version = read_memory(ws.ledger, task_id)
    if mem.status != "exited":
        raise HarnessError(f"task {task_id} is {mem.status}, not exited; only an exited task "
                           "can be reopened")
    if mem.exit_state not in REOPENABLE:
        why = ("its deliverable stands; define a new task to go further"
               if mem.exit_state == "delivered" else
               "its budget is part of its definition; define a new task with a larger budget")
        raise HarnessError(f"task {task_id} exited {mem.exit_state}: it cannot be reopened "
                           f"({why})")
    digests = {k: v for k, v in (("definition", mem.definition_hash), ("point", mem.point_hash),
                                 ("contract", mem.contract_hash),
                                 ("profile", mem.profile_hash)) if v}
    ev = E.TaskReopened(reason=reason, task_id=task_id, actor=actor or human_actor(),
                        input_digests=digests)
    append_to_task(ws, task_id, [ev], expected_version=version, memory=mem,
                   command_id=f"{task_id}:reopen:{ev.event_id}")
    return {"task_id": task_id, "reopened": mem.exit_state, "reason": reason,
            "event_id": str(ev.event_id)}
