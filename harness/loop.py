"""The Task Loop: Task Definition → Main Loop of Loop Blocks → "task goal met?" → exit.

A block: start (sub-goal, routing, candidate) → measure (the evaluator's repeated runs, each a
tool call and a measurement) → verify (the contract's gates vs the baseline) → decide and hand
off (accept or reject with the gate numbers; the handoff note). Block 1 is the baseline: the
runtime profile's own configuration. Between blocks the exit criteria are checked.

Contracts:
- One atomic `ledger.save` per step, with the deterministic command id
  `<task>:<block>:<step>` and the stream version it was computed from: a step is recorded
  whole or not at all, a retried step adds nothing, and a second writer gets a conflict.
- Everything the loop needs is derived from the ledger (Task Memory) at every step, so a
  process killed at any point resumes with `run_task` from the ledger alone, without
  repeating a finished step or losing a recorded measurement.
- Anti-spin: budget caps (blocks, wall time); a candidate whose effective configuration was
  already tried is not run again; K blocks in a row without measurable progress end the loop.
- Exit is typed (`TaskExited.state`) and carries evidence; a human exit must meet its state's
  criteria (delivered needs an accepted deliverable, follow-up-handoff a handoff note, …).
- The manual path (`start_block`, `run_command`, `record_measurement`, `verify_block`,
  `handoff_block`, `accept`, `reject`, `exit_task`) enforces the same state machine: no tool
  call or measurement outside an open block; acceptance needs a passing verification of the
  task's contract on the task's deployment point.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

from ..ledger import events as E
from ..ledger.clock import digest, utcnow
from ..ledger.errors import ConflictError, NotFoundError
from ..ledger.ids import LEDGER_CONTEXT, check_id, shown, unknown_id_hint
from ..ledger.specs import (
    DeploymentPoint,
    RuntimeProfile,
    SpecError,
    TaskDefinition,
    apply_candidate,
    canonical,
    diff_values,
    effective_digest,
    load_point,
    load_profile,
    load_task,
    spec_hash,
)
from ..ledger.store import Append, OnError, Undecodable, task_stream
from ..ledger.workspace import WORKSPACE_STREAM
from ..projections.memory import BlockRecord, TaskMemory, build_memory
from .errors import HarnessError
from .evaluator import EvalContext, Evaluator, RunResult, make_evaluator
from .executors import Executor, SweepExecutor, describe, make_executor, out_of_scope
from .gates import Verdict, judge
from .routing import route
from .tools import run_tool

LOOP_ACTOR = E.Actor.tool("forge-loop")
Progress = Callable[[str], None]


def human_actor() -> E.Actor:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = os.environ.get("USER", "human")
    return E.Actor.human(name)


# --- loading a task from the ledger -----------------------------------------------------


@dataclass(frozen=True)
class LoadedTask:
    task_id: str
    task: TaskDefinition
    point: DeploymentPoint
    profile: RuntimeProfile | None
    definition_hash: str
    point_hash: str
    profile_hash: str | None
    contract_hash: str
    base_dir: Path | None

    @property
    def digests(self) -> dict[str, str]:
        d = {"definition": self.definition_hash, "point": self.point_hash,
             "contract": self.contract_hash}
        if self.profile_hash:
            d["profile"] = self.profile_hash
        return d


ProfileIndex = dict[tuple[str, int], E.RuntimeProfileRevised]


def _workspace_specs(ws: Any) -> tuple[dict[str, dict], ProfileIndex]:
    points: dict[str, dict] = {}
    profiles: ProfileIndex = {}
    for r in ws.ledger.stream(WORKSPACE_STREAM):
        ev = r.event
        if isinstance(ev, E.DeploymentPointPinned):
            points[ev.point_hash] = dict(ev.point)
        elif isinstance(ev, E.RuntimeProfileRevised):
            profiles[(ev.service, ev.rev)] = ev
    return points, profiles


def _stream_state(ws: Any, task_id: str, on_error: OnError = None
                  ) -> tuple[TaskMemory, int, list[E.Event]]:
    """Memory, version and events of a task. An undecodable event raises (naming its
    position: a loop must not act on a partial history), or, for readers that pass
    `on_error`, is handed to it and left out."""
    bad: list[Undecodable] = []
    records = ws.ledger.stream(task_stream(task_id),
                               on_error=None if on_error is None else bad.append)
    if not records and not bad:
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                            "(define it with forge task new FILE.yaml)")
    for u in bad:
        on_error(u)  # type: ignore[misc]
    evs = [r.event for r in records]
    version = max([r.version for r in records[-1:]] + [u.version for u in bad[-1:]])
    return build_memory(evs), version, evs


def load_task_from_ledger(ws: Any, task_id: str) -> LoadedTask:
    records = ws.ledger.stream(task_stream(task_id), until_version=1)
    if not records or not isinstance(records[0].event, E.TaskDefined):
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                            "(define it with forge task new FILE.yaml)")
    ev = records[0].event
    definition = {k: v for k, v in ev.definition.items() if k != "source"}
    task = TaskDefinition.model_validate(definition, context=LEDGER_CONTEXT)
    points, profiles = _workspace_specs(ws)
    if ev.point_hash not in points:
        raise HarnessError(f"task {task_id}: deployment point {ev.point_hash} is not pinned")
    point = DeploymentPoint.model_validate(points[ev.point_hash])
    prof_ev = profiles.get((point.runtime_profile.service, point.runtime_profile.rev))
    profile = RuntimeProfile.model_validate(prof_ev.profile) if prof_ev else None
    source = ev.definition.get("source")
    return LoadedTask(task_id, task, point, profile, ev.definition_hash, ev.point_hash or "",
                      ev.profile_hash, ev.input_digests.get("contract") or
                      digest(task.contract.model_dump(mode="json")),
                      Path(source).parent if source else None)


# --- recording specs --------------------------------------------------------------------


def _profile_event(ws: Any, profile: RuntimeProfile, source: str | None,
                   actor: E.Actor) -> tuple[E.RuntimeProfileRevised | None, str]:
    """The RuntimeProfileRevised to record (None when this exact revision is recorded)."""
    h = spec_hash(profile)
    _, profiles = _workspace_specs(ws)
    prior = profiles.get((profile.service, profile.rev))
    if prior is not None:
        if prior.profile_hash != h:
            changed = ", ".join(d["path"] for d in diff_values(prior.profile, canonical(profile)))
            top = max(r for s, r in profiles if s == profile.service)
            raise HarnessError(f"{source or 'profile'}: {profile.service} rev {profile.rev} is "
                               f"already recorded with other content (changed: {changed}); "
                               f"give it rev {top + 1}")
        return None, h
    older = [r for s, r in profiles if s == profile.service and r < profile.rev]
    prev = profiles[(profile.service, max(older))] if older else None
    changes = {}
    if prev is not None:
        changes = {"from_rev": prev.rev,
                   "diff": diff_values(prev.profile, canonical(profile))}
    return E.RuntimeProfileRevised(service=profile.service, rev=profile.rev, profile_hash=h,
                                   profile=canonical(profile),
                                   previous_hash=prev.profile_hash if prev else None,
                                   changes=changes, actor=actor), h


def record_profile(ws: Any, path: str | Path, actor: E.Actor | None = None) -> dict[str, Any]:
    """Record a runtime profile revision (idempotent; rev N+1 records its diff from rev N)."""
    profile = load_profile(path)
    ev, h = _profile_event(ws, profile, str(path), actor or human_actor())
    if ev is not None:
        ws.ledger.append(WORKSPACE_STREAM, [ev], command_id=f"profile:{profile.service}:"
                         f"{profile.rev}:{h}")
    return {"service": profile.service, "rev": profile.rev, "profile_hash": h,
            "recorded": ev is not None,
            # as recorded: a changed `config.env.MY_API_KEY` prints as [REDACTED…] -> [REDACTED…]
            "changes": ws.ledger.redactor.value(ev.changes) if ev else {}}


def define_task(ws: Any, path: str | Path, actor: E.Actor | None = None, *,
                task_id: str | None = None) -> dict[str, Any]:
    """`forge task new`: validate the task, its point and profile; record the profile revision
    and the point pin if new, and TaskDefined — in one save. Idempotent for the same content."""
    actor = actor or human_actor()
    path = Path(path).resolve()
    task = load_task(path)
    # The one id rule, whichever way the id comes: given, the file's `id:` (checked when the
    # file loaded) or the file name.
    if task_id is not None:
        task_id = check_id(task_id, "task id")
    else:
        where = str(path) if str(path).isprintable() else repr(str(path))
        task_id = task.id or check_id(
            path.stem, f"{where}: task id taken from the file name (the task has no id:)")
    point_path = (path.parent / task.point).resolve()
    point = load_point(point_path)
    ref = point.runtime_profile
    if task.profile:
        profile_path: Path | None = (path.parent / task.profile).resolve()
    elif ref.file:
        profile_path = (point_path.parent / ref.file).resolve()
    else:
        profile_path = None
    points, profiles = _workspace_specs(ws)
    if profile_path is not None:
        profile = load_profile(profile_path)
        if (profile.service, profile.rev) != (ref.service, ref.rev):
            raise SpecError([f"{profile_path}:1: service/rev: {profile.service} rev {profile.rev}"
                             f" does not match the point's runtime_profile {ref.service} rev "
                             f"{ref.rev} ({point_path})"])
    elif (ref.service, ref.rev) in profiles:
        profile = RuntimeProfile.model_validate(profiles[(ref.service, ref.rev)].profile)
    else:
        raise HarnessError(f"{point_path}: runtime_profile {ref.service} rev {ref.rev} is not "
                           "recorded: give runtime_profile.file or forge profile record FILE")
    prof_ev, profile_hash = _profile_event(ws, profile, str(profile_path), actor)
    point_hash = spec_hash(point)
    contract_hash = digest(task.contract.model_dump(mode="json"))
    content = {k: v for k, v in canonical(task).items() if k not in ("point", "profile")}
    definition_hash = digest({**content, "point": point_hash, "profile": profile_hash})
    existing = ws.ledger.stream(task_stream(task_id), until_version=1)
    if existing:
        ev0 = existing[0].event
        if isinstance(ev0, E.TaskDefined) and ev0.definition_hash == definition_hash:
            return {"task_id": task_id, "created": False, "definition_hash": definition_hash,
                    "point_hash": point_hash, "profile_hash": profile_hash}
        raise HarnessError(f"{path}: task {task_id!r} is already defined with other content; "
                           "give the changed task a new id")
    appends = []
    ws_events: list[E.Event] = []
    if prof_ev is not None:
        ws_events.append(prof_ev)
    if point_hash not in points:
        ws_events.append(E.DeploymentPointPinned(name=point.name or point_path.stem,
                                                 point_hash=point_hash, point=canonical(point),
                                                 source=str(point_path), actor=actor))
    if ws_events:
        appends.append(Append(WORKSPACE_STREAM, ws_events))
    definition = {**canonical(task), "source": str(path)}
    defined = E.TaskDefined(
        title=task.title or task.goal[:80], task_type=task.type, goal=task.goal,
        definition=definition, definition_hash=definition_hash, point_hash=point_hash,
        profile_hash=profile_hash, task_id=task_id, actor=actor,
        input_digests={"point": point_hash, "profile": profile_hash, "contract": contract_hash})
    appends.append(Append(task_stream(task_id), [defined], expected_version=0))
    ws.ledger.save(*appends, command_id=f"task-new:{task_id}:{definition_hash}")
    return {"task_id": task_id, "created": True, "definition_hash": definition_hash,
            "point_hash": point_hash, "profile_hash": profile_hash}


# --- the loop ---------------------------------------------------------------------------


@dataclass
class LoopResult:
    task_id: str
    status: str
    exit_state: str | None
    exit_reason: str | None
    blocks: int
    memory: TaskMemory


class _Stepper:
    """Saves one step atomically with its deterministic command id; tells progress."""

    def __init__(self, ws: Any, lt: LoadedTask, progress: Progress):
        self.ws, self.lt, self.progress = ws, lt, progress

    def common(self, block_id: str | None = None, actor: E.Actor = LOOP_ACTOR) -> dict[str, Any]:
        return {"task_id": self.lt.task_id, "block_id": block_id, "actor": actor,
                "input_digests": self.lt.digests}

    def save(self, step: str, events: list[E.Event], version: int) -> None:
        cid = f"{self.lt.task_id}:{step}"
        try:
            res = self.ws.ledger.save(Append(task_stream(self.lt.task_id), events,
                                             expected_version=version), command_id=cid)
        except ConflictError:
            raise HarnessError(f"task {self.lt.task_id} changed while step {step} ran (another "
                               "loop or a manual command); run forge task resume") from None
        if res.duplicate:
            # A resumed loop never recomputes a recorded step (it reads the ledger first), so
            # this is a colliding command id: stop rather than spin.
            raise HarnessError(f"task {self.lt.task_id}: step {step} was already recorded "
                               f"(command {cid}); the task's history is not what this loop "
                               "expects")
        self.progress(f"saved {step} ({', '.join(e.TYPE for e in events)})")


def _wall_elapsed(mem: TaskMemory) -> float:
    if not mem.first_block_at:
        return 0.0
    return (utcnow() - datetime.fromisoformat(mem.first_block_at)).total_seconds()


def exit_due(lt: LoadedTask, mem: TaskMemory, max_wall_s: float | None = None
             ) -> tuple[str, str, list[str], str | None] | None:
    """(state, reason, evidence, handoff) when the task must exit now, between blocks.
    `max_wall_s` (a caller's cap, e.g. a graph node's) tightens the task's own wall budget."""
    ex = lt.task.exit
    wall = min(ex.max_wall_s, max_wall_s) if max_wall_s else ex.max_wall_s
    if mem.accepted and ex.when == "all_gates_pass":
        a = mem.accepted[-1]
        return ("delivered", f"{describe(a['candidate'])} passed every gate of the contract",
                [a["event_id"], a["verification_event_id"]], None)
    base = mem.baseline_block()
    if base is not None and base.status == "handed-off":
        runs = base.runs()
        if runs and not any(r["success"] for r in runs):
            return ("failed-blocked", "every baseline run failed: "
                    + "; ".join(sorted({m["error"] or "?" for m in base.measurements}))[:300],
                    [m["event_id"] for m in base.measurements], None)
        stab = [g for g in (base.verification or {}).get("gates", [])
                if g.get("kind") == "stability"]
        if stab and stab[0].get("verdict") == "fail":
            return ("failed-unverifiable", f"the baseline is not stable: {stab[0]['reason']}",
                    [base.verification["event_id"]], None)  # type: ignore[index]
    if len(mem.execution_record) >= ex.max_blocks:
        return ("failed-budget", f"block budget spent: {len(mem.execution_record)} of "
                f"{ex.max_blocks} blocks", [b.block_id for b in mem.execution_record],
                _handoff_text(mem))
    elapsed = _wall_elapsed(mem)
    if elapsed >= wall:
        return ("failed-budget", f"wall-time budget spent: {elapsed:.0f}s of {wall:.0f}s",
                [], _handoff_text(mem))
    if mem.no_progress_streak >= ex.no_progress_blocks:
        last = mem.execution_record[-mem.no_progress_streak:]
        return ("failed-no-progress", f"{mem.no_progress_streak} blocks in a row without "
                "measurable progress", [b.block_id for b in last], _handoff_text(mem))
    return None


def _handoff_text(mem: TaskMemory) -> str:
    best = mem.best_so_far or {}
    parts = [f"best so far: {describe(best.get('candidate') or {})} "
             f"({best.get('metric')} median {best.get('median')})"]
    if mem.rejected:
        parts.append("rejected: " + "; ".join(
            f"{describe(r['candidate'])} ({r['reason'][:120]})" for r in mem.rejected[-5:]))
    return ". ".join(parts)


def _baseline_ctx(mem: TaskMemory, ws: Any) -> dict[str, Any] | None:
    base = mem.baseline_block()
    if base is None:
        return None
    return {"block_id": base.block_id,
            "runs": [{"metrics": m["metrics"], "success": m["success"],
                      "meta": m.get("meta", {}), "artifact_digest": m.get("artifact_digest")}
                     for m in base.measurements]}


def _measure_events(st: _Stepper, blk: BlockRecord, results: list[RunResult]) -> list[E.Event]:
    evs: list[E.Event] = []
    if not results:
        results = [RunResult({}, success=False, error="the evaluator returned no runs")]
    for i, r in enumerate(results):
        meta = {k: v for k, v in r.meta.items() if k != "outputs"}
        # An evaluator's NaN / infinite numbers are not measurements: left out of the event,
        # the reasons kept in its meta (never a crash, never a `null` in the ledger).
        meta, dropped = E.without_non_finite(meta, "meta")
        metrics: dict[str, float] = {}
        for k, v in r.metrics.items():
            f, why = E.metric_value(v)
            if f is None:
                dropped[f"metrics.{k}"] = str(why)
            else:
                metrics[k] = f
        if dropped:
            prior = meta.get("omitted_metrics")
            meta["omitted_metrics"] = {**(prior if isinstance(prior, dict) else {}), **dropped}
        # The tool call carries where and how it ran; the measurement keeps the rest.
        tool_meta = {k: meta.pop(k, None) for k in ("cwd", "env_digest", "repo_digest")}
        if "argv" in meta:
            evs.append(E.ToolInvoked(
                tool="evaluator", argv=[str(a) for a in meta["argv"]], cwd=tool_meta["cwd"],
                env_digest=tool_meta["env_digest"], repo_digest=tool_meta["repo_digest"],
                exit_code=meta.get("exit_code"), duration_s=meta.get("duration_s"),
                stdout_digest=meta.get("stdout_digest"), stderr_digest=meta.get("stderr_digest"),
                error=None if r.success else r.error, **st.common(blk.block_id)))
        evs.append(E.MeasurementRecorded(
            run_id=f"{blk.block_id}-r{i + 1}", source=str(meta.get("source", "evaluator")),
            metrics=metrics, candidate=blk.candidate,
            repeat=i, success=r.success, error=r.error, artifact_digest=r.artifact_digest,
            meta=meta, **st.common(blk.block_id)))
    return evs


def _verify_event(st: _Stepper, blk: BlockRecord, mem: TaskMemory,
                  actor: E.Actor = LOOP_ACTOR) -> tuple[E.VerificationRecorded, Verdict]:
    base = mem.baseline_block()
    runs = blk.runs()
    verdict = judge(st.lt.task.contract, runs, base.runs() if base else None,
                    skip_relative=blk.is_baseline)
    ev = E.VerificationRecorded(
        contract_hash=st.lt.contract_hash, point_hash=st.lt.point_hash, candidate=blk.candidate,
        passed=verdict.passed, verdict=verdict.verdict,  # type: ignore[arg-type]
        gates=[g.to_dict() for g in verdict.gates],
        evidence=[m["event_id"] for m in blk.measurements] +
                 ([m["event_id"] for m in base.measurements] if base and base is not blk else []),
        **st.common(blk.block_id, actor))
    return ev, verdict


def _decide_events(st: _Stepper, blk: BlockRecord, mem: TaskMemory,
                   executor: Executor) -> list[E.Event]:
    v = blk.verification or {}
    verdict = v.get("verdict", "inconclusive")
    gates = v.get("gates", [])
    reasons = [f"{g['name']} {g['verdict']}: {g['reason']}" for g in gates]
    evs: list[E.Event] = []
    c = st.common(blk.block_id)
    primary = mem.primary_metric
    med = blk.median(primary) if primary else None
    state = f"{describe(blk.candidate)}: verdict {verdict}" + (
        f", {primary} median {med:.4g}" if med is not None else "")
    if blk.is_baseline:
        outcome = "progress" if any(r["success"] for r in blk.runs()) else "failed"
        state = "baseline measured: " + state
    elif verdict == "pass" and st.lt.task.exit.when == "all_gates_pass":
        evs.append(E.DeliverableAccepted(
            candidate=blk.candidate, summary=f"{describe(blk.candidate)} passes every gate",
            verification_event_id=v.get("event_id"), evidence=[v.get("event_id", "")], **c))
        outcome = "delivered"
    else:
        if verdict != "pass":
            bad = [r for r, g in zip(reasons, gates, strict=True) if g["verdict"] != "pass"]
            evs.append(E.DirectionRejected(candidate=blk.candidate,
                                           reason=f"{verdict}: " + "; ".join(bad),
                                           evidence=[v.get("event_id", "")], **c))
        best = mem.best_so_far or {}
        outcome = "progress" if verdict == "pass" or best.get("block_id") == blk.block_id \
            else "no-progress"
    next_goal = None
    if outcome != "delivered" and isinstance(executor, SweepExecutor):
        d = executor.decide(mem, st.lt.task, st.lt.point, st.lt.profile)
        next_goal = d.sub_goal if d.action == "try" else f"stop: {d.reason}"
    evs.append(E.LoopBlockHandedOff(outcome=outcome, state_reached=state,  # type: ignore[arg-type]
                                    findings=reasons, next_sub_goal=next_goal, **c))
    return evs


def _contenders(mem: TaskMemory) -> list[BlockRecord]:
    """Candidates that passed every gate and await the end of a best_in_scope search."""
    return [b for b in mem.execution_record if not b.is_baseline and b.verification
            and b.verification["verdict"] == "pass" and b.decision is None]


def _stop_events(st: _Stepper, mem: TaskMemory, reason: str, handoff: str | None
                 ) -> list[E.Event]:
    """The executor has nothing left: deliver the best passing contender, or hand off."""
    if st.lt.task.exit.when == "best_in_scope":
        passing = _contenders(mem)
        if passing and mem.primary_metric:
            higher = mem.primary_direction == "at_least"
            best = sorted(passing, key=lambda b: b.median(mem.primary_metric) or 0.0,
                          reverse=higher)[0]
            vid = best.verification["event_id"]  # type: ignore[index]
            acc = E.DeliverableAccepted(candidate=best.candidate,
                                        summary=f"{describe(best.candidate)}: best passing "
                                        f"candidate in scope", verification_event_id=vid,
                                        evidence=[vid], **st.common(best.block_id))
            ex = E.TaskExited(state="delivered", reason=f"{describe(best.candidate)} is the best "
                              f"candidate passing every gate ({reason})",
                              evidence=[str(acc.event_id), vid], **st.common())
            return [acc, ex]
    text = handoff or f"{reason}; no candidate passed every gate. {_handoff_text(mem)}"
    return [E.TaskExited(state="follow-up-handoff", reason=reason, handoff=text,
                         evidence=[b.block_id for b in mem.execution_record], **st.common())]


def run_task(ws: Any, task_id: str, *, evaluator: Evaluator | None = None,
             executor: Executor | None = None, progress: Progress | None = None,
             max_wall_s: float | None = None) -> LoopResult:
    """Run (or resume) a task's loop until it exits or its executor waits for a person."""
    say = progress or (lambda _s: None)
    lt = load_task_from_ledger(ws, task_id)
    st = _Stepper(ws, lt, say)
    executor = executor or make_executor(lt.task, ws=ws, base_dir=lt.base_dir)
    if evaluator is None and executor.kind != "manual":
        # Before anything is recorded: a task without an evaluator records nothing.
        evaluator = make_evaluator(ws, lt.task, lt.profile, base_dir=lt.base_dir)
    model_tiers = {k: v for k, v in ws.config.raw.get("model_tiers", {}).items() if v}
    while True:
        mem, version, _ = _stream_state(ws, task_id)
        if executor.kind == "manual" and mem.status != "exited":
            d = executor.decide(mem, lt.task, lt.point, lt.profile)
            say(f"waiting: {d.reason}")
            return LoopResult(task_id, "waiting", None, d.reason, len(mem.execution_record), mem)
        if mem.status == "exited":
            say(f"exited {mem.exit_state}: {mem.exit_reason}")
            return LoopResult(task_id, mem.status, mem.exit_state, mem.exit_reason,
                              len(mem.execution_record), mem)
        blk = mem.current_block
        if blk is None:
            due = exit_due(lt, mem, max_wall_s)
            if due is not None:
                state, reason, evidence, handoff = due
                if state in ("failed-budget", "failed-no-progress") \
                        and lt.task.exit.when == "best_in_scope" and _contenders(mem):
                    # Out of budget, but a passing candidate is in hand: deliver the best.
                    st.save(f"exit:v{version}",
                            _stop_events(st, mem, reason, None), version)
                    continue
                st.save(f"exit:v{version}",
                        [E.TaskExited(state=state, reason=reason, evidence=evidence,  # type: ignore[arg-type]
                                      handoff=handoff, **st.common())], version)
                continue
            index = len(mem.execution_record) + 1
            bid = f"b{index}"
            routing = route(lt.task, mem.no_progress_streak, model_tiers)
            if mem.baseline_block() is None and not mem.execution_record:
                decision_cand: dict[str, Any] = {}
                sub_goal = "measure the baseline: the runtime profile's own configuration"
                actor, tool_ev = LOOP_ACTOR, None
            else:
                d = executor.decide(mem, lt.task, lt.point, lt.profile)
                if d.action == "wait":
                    say(f"waiting: {d.reason}")
                    return LoopResult(task_id, "waiting", None, d.reason,
                                      len(mem.execution_record), mem)
                if d.action == "stop":
                    evs = _stop_events(st, mem, d.reason, d.handoff)
                    if d.tool_event is not None:
                        evs.insert(0, d.tool_event.model_copy(update=st.common()))
                    st.save(f"stop:v{version}", evs, version)
                    continue
                decision_cand, sub_goal = d.candidate, d.sub_goal
                actor, tool_ev = d.actor or LOOP_ACTOR, d.tool_event
            st.save(f"{bid}:start", _start_events(st, mem, bid, index, sub_goal, routing,
                                                  decision_cand, actor, tool_ev), version)
            continue
        if not blk.measurements:
            assert evaluator is not None
            say(f"begin {blk.block_id}:measure {describe(blk.candidate)}")
            point, profile = apply_candidate(lt.point, lt.profile, blk.candidate)
            ctx = EvalContext(ws, task_id, blk.block_id, point, profile,  # type: ignore[arg-type]
                              None if blk.is_baseline else _baseline_ctx(mem, ws), say)
            try:
                results = evaluator.evaluate(blk.candidate, repeats=lt.task.contract.repeats,
                                             ctx=ctx)
            except HarnessError as e:
                st.save(f"{blk.block_id}:blocked", [
                    E.LoopBlockHandedOff(outcome="failed", state_reached="evaluator failed",
                                         findings=[str(e)], **st.common(blk.block_id)),
                    E.TaskExited(state="failed-blocked", reason=f"evaluator failed: {e}",
                                 evidence=[blk.block_id], **st.common())], version)
                continue
            st.save(f"{blk.block_id}:measure", _measure_events(st, blk, results), version)
        elif blk.verification is None:
            ev, _ = _verify_event(st, blk, mem)
            st.save(f"{blk.block_id}:verify", [ev], version)
        else:
            st.save(f"{blk.block_id}:handoff", _decide_events(st, blk, mem, executor), version)


def run_task_file(ws: Any, path: str | Path, *, task_id: str | None = None,
                  max_wall_s: float | None = None, progress: Progress | None = None
                  ) -> LoopResult:
    """Define (idempotently) and run a task from its YAML file: the entry for graph nodes."""
    info = define_task(ws, path, task_id=task_id)
    return run_task(ws, info["task_id"], progress=progress, max_wall_s=max_wall_s)


def _start_events(st: _Stepper, mem: TaskMemory, bid: str, index: int, sub_goal: str,
                  routing: dict[str, Any], cand: dict[str, Any], actor: E.Actor,
                  tool_ev: E.ToolInvoked | None) -> list[E.Event]:
    lt = st.lt
    c = st.common(bid)
    problem = out_of_scope(lt.task, lt.point, lt.profile, cand) if cand else None
    cfg = None if problem else effective_digest(lt.point, lt.profile, cand)
    digests = {**lt.digests, **({"config": cfg} if cfg else {})}
    evs: list[E.Event] = [E.LoopBlockStarted(
        index=index, sub_goal=sub_goal, routing=routing, candidate=cand, task_id=lt.task_id,
        block_id=bid, actor=actor, input_digests=digests)]
    if tool_ev is not None:
        evs.append(tool_ev.model_copy(update={"task_id": lt.task_id, "block_id": bid}))
    if problem:
        evs += [E.DirectionRejected(candidate=cand, reason=f"out of scope: {problem}", **c),
                E.LoopBlockHandedOff(outcome="no-progress", state_reached="not run",
                                     findings=[f"out of scope: {problem}"], **c)]
    elif cfg in mem.tried:
        prior = next(b.block_id for b in mem.execution_record if b.config_digest == cfg)
        evs.append(E.LoopBlockHandedOff(
            outcome="no-progress", state_reached="not run",
            findings=[f"{describe(cand)} was already tried in block {prior}; not run again"], **c))
    return evs


# --- the manual path --------------------------------------------------------------------


def _open(ws: Any, task_id: str) -> tuple[LoadedTask, TaskMemory, int]:
    lt = load_task_from_ledger(ws, task_id)
    mem, version, _ = _stream_state(ws, task_id)
    if mem.status == "exited":
        raise HarnessError(f"task {task_id} has exited ({mem.exit_state}); nothing more is "
                           "recorded in it")
    return lt, mem, version


def _need_block(task_id: str, mem: TaskMemory, what: str) -> BlockRecord:
    if mem.current_block is None:
        raise HarnessError(f"task {task_id}: no open loop block; {what} happens inside a block "
                           f"(forge block start {task_id} --sub-goal ...)")
    return mem.current_block


def start_block(ws: Any, task_id: str, sub_goal: str, candidate: dict[str, Any] | None = None,
                actor: E.Actor | None = None) -> dict[str, Any]:
    lt, mem, version = _open(ws, task_id)
    if mem.current_block is not None:
        raise HarnessError(f"task {task_id}: block {mem.current_block.block_id} is still open; "
                           "hand it off first (forge block handoff)")
    cand = dict(candidate or {})
    problem = out_of_scope(lt.task, lt.point, lt.profile, cand) if cand else None
    if problem:
        raise HarnessError(f"task {task_id}: candidate out of scope: {problem}")
    if effective_digest(lt.point, lt.profile, cand) in mem.tried:
        raise HarnessError(f"task {task_id}: {describe(cand)} was already tried; "
                           "a candidate already tried is not run again")
    index = len(mem.execution_record) + 1
    bid = f"b{index}"
    st = _Stepper(ws, lt, lambda _s: None)
    routing = route(lt.task, mem.no_progress_streak, None)
    evs = _start_events(st, mem, bid, index, sub_goal, routing, cand, actor or human_actor(),
                        None)
    st.save(f"{bid}:start", evs, version)
    return {"task_id": task_id, "block_id": bid, "index": index, "candidate": cand}


def run_command(ws: Any, task_id: str, argv: list[str], cwd: str | None = None,
                tee: bool = True) -> dict[str, Any]:
    """`forge run -- CMD`: run CMD as a recorded tool call of the task's open block."""
    if not argv:
        raise HarnessError("forge run: give the command after --")
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a tool call")
    run = run_tool(ws, argv, cwd=cwd, tee=tee,
                   event_fields={"task_id": task_id, "block_id": blk.block_id,
                                 "actor": human_actor(), "input_digests": lt.digests})
    ws.ledger.save(Append(task_stream(task_id), [run.event]),
                   command_id=f"{task_id}:{blk.block_id}:run:{uuid4().hex}")
    return {"task_id": task_id, "block_id": blk.block_id, "exit_code": run.returncode,
            "error": run.event.error, "stdout_digest": run.event.stdout_digest,
            "stderr_digest": run.event.stderr_digest, "event_id": str(run.event.event_id)}


def record_measurement(ws: Any, task_id: str, metrics: dict[str, float], *,
                       source: str = "manual", success: bool = True, error: str | None = None,
                       artifact: str | Path | None = None) -> dict[str, Any]:
    # Before anything is read or stored: a NaN or infinite metric is refused by name.
    values = {k: E.finite_float(v, f"metric {k}") for k, v in metrics.items()}
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a measurement")
    n = len(blk.measurements)
    digest_ = ws.artifacts.put_file(artifact) if artifact else None
    ev = E.MeasurementRecorded(run_id=f"{blk.block_id}-m{n + 1}", source=source,
                               metrics=values,
                               candidate=blk.candidate, repeat=n, success=success, error=error,
                               artifact_digest=digest_, task_id=task_id, block_id=blk.block_id,
                               actor=human_actor(), input_digests=lt.digests)
    ws.ledger.save(Append(task_stream(task_id), [ev], expected_version=version))
    return {"task_id": task_id, "block_id": blk.block_id, "run_id": ev.run_id,
            "event_id": str(ev.event_id)}


def verify_block(ws: Any, task_id: str) -> dict[str, Any]:
    """Judge the open block's measurements against the contract (and the baseline)."""
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a verification")
    if not blk.measurements:
        raise HarnessError(f"task {task_id}: block {blk.block_id} has no measurements to verify")
    st = _Stepper(ws, lt, lambda _s: None)
    ev, verdict = _verify_event(st, blk, mem, human_actor())
    ws.ledger.save(Append(task_stream(task_id), [ev], expected_version=version))
    return {"task_id": task_id, "block_id": blk.block_id, "verdict": verdict.verdict,
            "reason": verdict.reason(), "gates": [g.to_dict() for g in verdict.gates],
            "event_id": str(ev.event_id)}


def handoff_block(ws: Any, task_id: str, *, state_reached: str, findings: list[str] = (),  # type: ignore[assignment]
                  next_sub_goal: str | None = None, outcome: str = "progress") -> dict[str, Any]:
    lt, mem, version = _open(ws, task_id)
    blk = _need_block(task_id, mem, "a handoff")
    ev = E.LoopBlockHandedOff(outcome=outcome, state_reached=state_reached,  # type: ignore[arg-type]
                              findings=list(findings), next_sub_goal=next_sub_goal,
                              task_id=task_id, block_id=blk.block_id, actor=human_actor(),
                              input_digests=lt.digests)
    ws.ledger.save(Append(task_stream(task_id), [ev], expected_version=version),
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


def accept(ws: Any, task_id: str, *, block: str | None = None, summary: str = "",
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
    ws.ledger.save(Append(task_stream(task_id), [ev], expected_version=version))
    return {"task_id": task_id, "block_id": b.block_id, "event_id": str(ev.event_id)}


def reject(ws: Any, task_id: str, reason: str, *, block: str | None = None) -> dict[str, Any]:
    if not reason.strip():
        raise HarnessError("a rejection needs --reason")
    lt, mem, version = _open(ws, task_id)
    b = _target_block(task_id, mem, block)
    ev = E.DirectionRejected(candidate=b.candidate, reason=reason,
                             evidence=[v for v in [(b.verification or {}).get("event_id")] if v],
                             task_id=task_id, block_id=b.block_id, actor=human_actor(),
                             input_digests=lt.digests)
    ws.ledger.save(Append(task_stream(task_id), [ev], expected_version=version))
    return {"task_id": task_id, "block_id": b.block_id, "event_id": str(ev.event_id)}


def exit_task(ws: Any, task_id: str, state: str, reason: str, *, handoff: str | None = None,
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
        if len(mem.execution_record) < ex.max_blocks and _wall_elapsed(mem) < ex.max_wall_s:
            raise HarnessError(f"task {task_id}: budget not spent ({len(mem.execution_record)}"
                               f"/{ex.max_blocks} blocks); use another state")
    elif state == "failed-no-progress":
        if mem.no_progress_streak < lt.task.exit.no_progress_blocks:
            raise HarnessError(f"task {task_id}: only {mem.no_progress_streak} no-progress "
                               "blocks in a row; use another state")
    elif state not in ("failed-unverifiable", "failed-blocked", "aborted-by-human"):
        raise HarnessError(f"unknown exit state {state!r}")
    evidence += [b.block_id for b in mem.execution_record]
    ev = E.TaskExited(state=state, reason=reason, handoff=handoff,  # type: ignore[arg-type]
                      evidence=evidence, task_id=task_id, actor=actor or human_actor(),
                      input_digests=lt.digests)
    ws.ledger.save(Append(task_stream(task_id), [ev], expected_version=version))
    return {"task_id": task_id, "state": state, "event_id": str(ev.event_id)}


# --- listing ----------------------------------------------------------------------------


def list_tasks(ws: Any, on_error: OnError = None) -> list[dict[str, Any]]:
    """Every task with its status. Undecodable events raise, or, given `on_error`, are
    handed to it and left out (a task whose definition is damaged is still listed)."""
    ids = []
    # The task ids are the streams' names: no need to decode the definitions to list them.
    for _pos, stream, version, _topic, _state in ws.ledger.rows(types=[E.TaskDefined.TYPE]):
        if stream.startswith("task:") and version == 1:
            ids.append(stream[len("task:"):])
    out = []
    for tid in ids:
        damaged: list[Undecodable] = []
        mem, _, _ = _stream_state(ws, tid, None if on_error is None else damaged.append)
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


def task_summary(ws: Any, task_id: str, on_error: OnError = None) -> dict[str, Any]:
    mem, version, _ = _stream_state(ws, task_id, on_error)
    return {"task_id": task_id, "status": mem.status, "exit_state": mem.exit_state,
            "exit_reason": mem.exit_reason, "definition": mem.definition,
            "definition_hash": mem.definition_hash, "point_hash": mem.point_hash,
            "profile_hash": mem.profile_hash, "contract_hash": mem.contract_hash,
            "version": version,
            "blocks": [{"block_id": b.block_id, "sub_goal": b.sub_goal,
                        "candidate": b.candidate, "routing": b.routing, "status": b.status,
                        "measurements": len(b.measurements), "tool_calls": len(b.tool_calls),
                        "verdict": (b.verification or {}).get("verdict"),
                        "decision": b.decision, "outcome": (b.handoff or {}).get("outcome")}
                       for b in mem.execution_record],
            "best_so_far": mem.best_so_far}
