"""The events of each loop step (start, measure, verify, decide, stop) and the stepper that
saves a step atomically; shared by the automatic loop (run.py) and the manual path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...ledger import events as E
from ...ledger import numbers as N
from ...ledger.candidates import canonical_candidate, shown_differences
from ...ledger.clock import utcnow
from ...ledger.errors import ConflictError
from ...ledger.specs import (
    apply_candidate,
    effective_digest,
)
from ...ledger.store import Append
from ...ledger.streams import APPROVALS_STREAM
from ...ledger.workspace import Workspace
from ...projections.memory import BlockRecord, TaskMemory
from ..errors import HarnessError
from ..nodes.identity import local_host
from ..record import append_to_task
from ..task import LOOP_ACTOR, LoadedTask, Progress
from . import code
from .decision import Executor, describe, out_of_scope
from .evaluator_protocol import EvalContext, Evaluator, RunResult, baseline_of
from .executors import SweepExecutor
from .verify import BlockVerification, verify


class Stepper:
    """Saves one step atomically with its deterministic command id; tells progress."""

    def __init__(self, ws: Workspace, lt: LoadedTask, progress: Progress):
        self.ws, self.lt, self.progress = ws, lt, progress

    def common(self, block_id: str | None = None, actor: E.Actor = LOOP_ACTOR) -> dict[str, Any]:
        return {"task_id": self.lt.task_id, "block_id": block_id, "actor": actor,
                "input_digests": self.lt.digests}

    def save(self, step: str, events: list[E.Event], version: int,
             also: Sequence[Append] = (), *, memory: TaskMemory | None = None) -> None:
        """`also`: other streams' appends in the same save (an acceptance's use of its
        approval). When the approvals stream moved under it, nothing is saved: the loop
        reads the ledger again and recomputes the step. `memory`: the Task Memory the step
        was computed from, read at `version` (the writer checks against it rather than
        folding the stream again: one fold per step)."""
        cid = f"{self.lt.task_id}:{step}"
        try:
            # The one task-stream writer: checks the step against Task Memory, expects
            # `version` (what this step was computed from).
            res = append_to_task(self.ws, self.lt.task_id, events, expected_version=version,
                                 memory=memory, command_id=cid, also=also)
        except ConflictError as e:
            if e.stream == APPROVALS_STREAM and also:
                self.progress(f"approvals moved while saving {step}: again")
                return
            raise HarnessError(f"task {self.lt.task_id} changed while step {step} ran (another "
                               "loop or a manual command); run forge task resume") from None
        if res.duplicate:
            # A resumed loop never recomputes a recorded step (it reads the ledger first), so
            # this is a colliding command id: stop rather than spin.
            raise HarnessError(f"task {self.lt.task_id}: step {step} was already recorded "
                               f"(command {cid}); the task's history is not what this loop "
                               "expects")
        self.progress(f"saved {step} ({', '.join(e.TYPE for e in events)})")


def wall_elapsed(mem: TaskMemory) -> float:
    """Seconds the task has run since its first block (time spent exited before a reopen
    does not count)."""
    if not mem.first_block_at:
        return 0.0
    return (utcnow() - datetime.fromisoformat(mem.first_block_at)).total_seconds() \
        - mem.paused_s


def handoff_text(mem: TaskMemory) -> str:
    best = mem.best_so_far or {}
    parts = [f"best so far: {describe(best.get('candidate') or {})} "
             f"({best.get('metric')} median {best.get('median')})"]
    if mem.rejected:
        parts.append("rejected: " + "; ".join(
            f"{describe(r['candidate'])} ({r['reason'][:120]})" for r in mem.rejected[-5:]))
    return ". ".join(parts)


def measure_events(st: Stepper, mem: TaskMemory, blk: BlockRecord, evaluator: Evaluator, *,
                   actor: E.Actor = LOOP_ACTOR) -> list[E.Event]:
    """The measure step of the open block `blk` (the loop's, and an agent's `evaluate`): the
    candidate applied to the point and profile, its code prepared (a failed build is failed
    runs), the evaluator run `repeats` times; its events (builds, evaluator tool calls,
    measurements) by `actor`, not saved: the caller snapshots and saves them. Raises
    HarnessError / RepoError when the evaluator cannot run at all (a broken setup)."""
    lt, say = st.lt, st.progress
    point, profile = apply_candidate(lt.point, lt.profile, blk.candidate)
    prep = code.prepare(st.ws, lt, blk.block_id, blk.candidate, say)
    ctx = EvalContext(st.ws, lt.task_id, blk.block_id, point, profile,
                      None if blk.is_baseline else baseline_of(mem), say, env=prep.env,
                      builds=prep.builds)
    if prep.failure is not None:  # a failed build is a failed run, as data
        results = [RunResult({}, success=False, error=prep.failure)
                   for _ in range(lt.task.contract.repeats)]
    else:
        results = evaluator.evaluate(blk.candidate, repeats=lt.task.contract.repeats, ctx=ctx)
    builds = [e if e.actor == actor else e.model_copy(update={"actor": actor})
              for e in prep.events]
    return builds + _measure_events(st, blk, results, actor)


def _measure_events(st: Stepper, blk: BlockRecord, results: list[RunResult],
                    actor: E.Actor = LOOP_ACTOR) -> list[E.Event]:
    evs: list[E.Event] = []
    if not results:
        results = [RunResult({}, success=False, error="the evaluator returned no runs")]
    for i, r in enumerate(results):
        meta = {k: v for k, v in r.meta.items() if k != "outputs"}
        # An evaluator's NaN / infinite numbers are not measurements: left out of the event,
        # the reasons kept in its meta (never a crash, never a `null` in the ledger).
        meta, dropped = N.without_non_finite(meta, "meta")
        metrics: dict[str, float] = {}
        for k, v in r.metrics.items():
            f, why = N.metric_value(v)
            if f is None:
                dropped[f"metrics.{k}"] = str(why)
            else:
                metrics[k] = f
        if dropped:
            prior = meta.get("omitted_metrics")
            meta["omitted_metrics"] = {**(prior if isinstance(prior, dict) else {}), **dropped}
        # The tool call carries where and how it ran; the measurement keeps the rest.
        tool_meta = {k: meta.pop(k, None) for k in ("cwd", "env_digest", "repo_digest",
                                                     "sandbox")}
        if "argv" in meta:
            evs.append(E.ToolInvoked(
                tool="evaluator", argv=[str(a) for a in meta["argv"]], cwd=tool_meta["cwd"],
                env_digest=tool_meta["env_digest"], repo_digest=tool_meta["repo_digest"],
                exit_code=meta.get("exit_code"), duration_s=meta.get("duration_s"),
                stdout_digest=meta.get("stdout_digest"), stderr_digest=meta.get("stderr_digest"),
                error=None if r.success else r.error, sandbox=tool_meta["sandbox"] or {},
                **st.common(blk.block_id, actor)))
        evs.append(E.MeasurementRecorded(
            run_id=f"{blk.block_id}-r{i + 1}", source=str(meta.get("source", "evaluator")),
            metrics=metrics, candidate=blk.candidate,
            repeat=i, success=r.success, error=r.error, artifact_digest=r.artifact_digest,
            meta=meta, **st.common(blk.block_id, actor)))
    return evs


def verify_event(st: Stepper, blk: BlockRecord, mem: TaskMemory,
                  actor: E.Actor = LOOP_ACTOR) -> BlockVerification:
    """The block's verification: the task's verification path run in order (verify.py);
    its tool calls and the VerificationRecorded, saved together by the caller."""
    return verify(st.ws, st.lt, blk, mem, st.common(blk.block_id, actor), st.progress)


def decide_events(st: Stepper, blk: BlockRecord, mem: TaskMemory,
                   executor: Executor) -> list[E.Event]:
    v: dict[str, Any] = dict(blk.verification or {})
    verdict = v.get("verdict", "inconclusive")
    gates = v.get("gates", [])
    reasons = [f"{g['name']} {g['verdict']}: {g['reason']}" for g in gates]
    # A step of the verification path other than the gates that did not pass, with why.
    stopped = [f"step {x['name']} {x['outcome']}: {x['detail']}" for x in v.get("steps", [])
               if x["outcome"] in ("fail", "inconclusive") and x["name"] != "gates"]
    evs: list[E.Event] = []
    c = st.common(blk.block_id)
    primary = mem.primary_metric
    med = blk.median(primary) if primary else None
    state = f"{describe(blk.candidate)}: verdict {verdict}" + (
        f", {primary} median {med:.4g}" if med is not None else "")
    if blk.is_baseline:
        outcome = "progress" if any(r.success for r in blk.runs()) else "failed"
        state = "baseline measured: " + state
    elif verdict == "pass" and st.lt.task.exit.when == "all_gates_pass":
        evs.append(E.DeliverableAccepted(
            candidate=blk.candidate, summary=f"{describe(blk.candidate)} passes every gate",
            verification_event_id=v.get("event_id"), evidence=[v.get("event_id", "")], **c))
        outcome = "delivered"
    else:
        if verdict != "pass":
            bad = stopped + [r for r, g in zip(reasons, gates, strict=True)
                             if g["verdict"] != "pass"]
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
    # The comparison states every dimension the candidate's deployment differs in.
    differs = [f"differs from the baseline: {shown_differences(v['differs'], limit=40)}"] \
        if v.get("differs") else []
    evs.append(E.LoopBlockHandedOff(outcome=outcome, state_reached=state,
                                    findings=differs + stopped + reasons,
                                    next_sub_goal=next_goal, **c))
    return evs


def contenders(mem: TaskMemory) -> list[BlockRecord]:
    """Candidates that passed every gate and await the end of a best_in_scope search."""
    return [b for b in mem.execution_record if not b.is_baseline and b.verification
            and b.verification["verdict"] == "pass" and b.decision is None]


def stop_events(st: Stepper, mem: TaskMemory, reason: str, handoff: str | None
                 ) -> list[E.Event]:
    """The executor has nothing left: deliver the best passing contender, or hand off."""
    if st.lt.task.exit.when == "best_in_scope":
        passing = contenders(mem)
        metric = mem.primary_metric
        if passing and metric:
            higher = mem.primary_direction == "at_least"
            best = sorted(passing, key=lambda b: b.median(metric) or 0.0, reverse=higher)[0]
            vid = best.verification["event_id"]  # type: ignore[index]
            acc = E.DeliverableAccepted(candidate=best.candidate,
                                        summary=f"{describe(best.candidate)}: best passing "
                                        f"candidate in scope", verification_event_id=vid,
                                        evidence=[vid], **st.common(best.block_id))
            ex = E.TaskExited(state="delivered", reason=f"{describe(best.candidate)} is the best "
                              f"candidate passing every gate ({reason})",
                              evidence=[str(acc.event_id), vid], **st.common())
            return [acc, ex]
    text = handoff or f"{reason}; no candidate passed every gate. {handoff_text(mem)}"
    return [E.TaskExited(state="follow-up-handoff", reason=reason, handoff=text,
                         evidence=[b.block_id for b in mem.execution_record], **st.common())]


def start_events(st: Stepper, mem: TaskMemory, bid: str, index: int, sub_goal: str,
                  routing: dict[str, Any], cand: dict[str, Any], actor: E.Actor,
                  tool_ev: E.ToolInvoked | None, *, measure_again: bool = False,
                  problem: str | None = None, decided: list[E.Event] | None = None
                  ) -> list[E.Event]:
    """A block's start; `measure_again`: a configuration already tried is run again (the
    baseline of a reopened task); `problem`: why the candidate cannot run (a code candidate
    naming no commit), recorded as its rejection; `decided`: what deciding recorded (an
    agent's model and tool calls), saved in the block right after its start."""
    lt = st.lt
    c = st.common(bid)
    cand = canonical_candidate(lt.task.scope, cand)  # one spelling per configuration
    if problem is None and cand:
        problem = out_of_scope(lt.task, lt.point, lt.profile, cand)
    cfg = None if problem else effective_digest(lt.point, lt.profile, cand)
    digests = {**lt.digests, **({"config": cfg} if cfg else {})}
    evs: list[E.Event] = [E.LoopBlockStarted(
        index=index, sub_goal=sub_goal, routing=routing, candidate=cand, task_id=lt.task_id,
        block_id=bid, actor=actor, input_digests=digests, host=local_host())]
    if tool_ev is not None:
        evs.append(tool_ev.model_copy(update={"task_id": lt.task_id, "block_id": bid}))
    evs += [e.model_copy(update={"task_id": lt.task_id, "block_id": bid})
            for e in decided or ()]
    if problem:
        evs += [E.DirectionRejected(candidate=cand, reason=f"out of scope: {problem}", **c),
                E.LoopBlockHandedOff(outcome="no-progress", state_reached="not run",
                                     findings=[f"out of scope: {problem}"], **c)]
    elif cfg in mem.tried and not measure_again:
        prior = next(b.block_id for b in mem.execution_record if b.config_digest == cfg)
        evs.append(E.LoopBlockHandedOff(
            outcome="no-progress", state_reached="not run",
            findings=[f"{describe(cand)} was already tried in block {prior}; not run again"], **c))
    return evs
