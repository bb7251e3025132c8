"""Node work: run one claimed node (a command with its verification steps, or a task YAML
through the task loop), record its verification, and conclude it (handoffs, delivery or
rejection) on current state.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger import numbers as N
from ...ledger.clock import digest
from ...ledger.errors import ConflictError, LedgerError, NotFoundError
from ...ledger.graphspec import CommandWork, LoopWork, VerifyStep
from ...ledger.payloads import GateResult
from ...ledger.sizes import MAX_ARTIFACT_BYTES
from ...ledger.specs import SpecError, TaskDefinition, parse_spec
from ...ledger.store import Append
from ...ledger.streams import graph_stream, task_stream
from ...ledger.workspace import Workspace
from ...ledger.yamlio import load_yaml
from ...projections.graph import GraphView, catch_up, node_task_id
from ...projections.memory import TaskMemory, read_memory
from ..errors import HarnessError
from ..jsonl import last_json_line
from ..loop.define import check_owner, define_task_spec
from ..loop.run import run_task
from ..nodes.identity import local_host
from ..proc import CommandOutcome, last_line, run_in_session
from ..record import append_to_task
from ..tool_calls.calls import capture_redactor
from . import lease
from .commands import ACTOR, handoff_events


def last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object on the last non-empty stdout line (None when there is none)."""
    try:
        obj = last_json_line(stdout)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass
class NodeContext:
    ws: Workspace
    view: GraphView
    node: str
    attempt: int
    run_id: str
    worker: str

    @property
    def graph_id(self) -> str:
        return self.view.graph_id

    @property
    def task_id(self) -> str:
        return node_task_id(self.graph_id, self.node)

    @property
    def block(self) -> str:
        return f"a{self.attempt}"

    def cid(self, step: str) -> str:
        return f"{self.task_id}:{self.block}:{step}"


def workdir(ws: Workspace, graph_id: str) -> Path:
    return ws.home / "graphs" / graph_id / "work"


def repo_dir(ws: Workspace, graph_id: str, node: str, path: str | None) -> Path:
    """A repo node's directory under the graph's work dir. The path was checked when the node
    was defined (relative, no '..'); resolved here, symlinks included, it must stay inside."""
    base = workdir(ws, graph_id).resolve()
    target = (base / (path or f"repos/{node}")).resolve()
    if not target.is_relative_to(base):
        raise HarnessError(f"graph {graph_id!r}: repo node {node!r}: path {path!r} resolves to "
                           f"{target}, outside the graph's work dir {base}")
    return target


def _placeholders(ctx: NodeContext, cwd: Path) -> dict[str, str]:
    """What {python} {graph_dir} {workdir} {node} {attempt} stand for in a node's work."""
    return {"python": sys.executable, "graph_dir": ctx.view.graph_dir or str(cwd),
            "workdir": str(cwd), "node": ctx.node, "attempt": str(ctx.attempt)}


def _subst(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text


@dataclass
class WorkResult:
    passed: bool
    checks: list[GateResult]
    evidence: list[str]
    deliverable: dict[str, str]
    work_s: float
    reason: str = ""


def metric_checks(step: VerifyStep, value: Any) -> list[GateResult]:
    """A metric step judged on the value its work printed: one result per bound (at_least,
    at_most, equals), or one failed result when the metric is not a number there."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return [GateResult.check(False, name=step.name, kind="metric", metric=step.metric,
                                 reason=f"metric {step.metric!r} missing from the last JSON "
                                        "line")]
    x, why = N.metric_value(value)
    if x is None:
        return [GateResult.check(False, name=step.name, kind="metric", metric=step.metric,
                                 reason=f"metric {step.metric!r}: {why}")]
    out = []
    for direction, bound in (("at_least", step.at_least), ("at_most", step.at_most),
                             ("equals", step.equals)):
        if bound is None:
            continue
        ok = x >= bound if direction == "at_least" else x <= bound \
            if direction == "at_most" else x == bound
        sign = {"at_least": ">=", "at_most": "<=", "equals": "=="}[direction]
        out.append(GateResult.check(
            ok, name=step.name, kind="metric", metric=step.metric, threshold=bound,
            direction=direction, median=x, n=1, samples=[x],
            reason=f"{step.metric} {x:g} {'meets' if ok else 'fails'} {sign} {bound:g}"))
    return out


def run_command_work(ctx: NodeContext, work: CommandWork, cwd: Path) -> WorkResult:
    arts = ctx.ws.artifacts
    values = _placeholders(ctx, cwd)
    env = {**os.environ, **{k: _subst(v, values) for k, v in work.env.items()},
           "FORGE_GRAPH": ctx.graph_id, "FORGE_NODE": ctx.node,
           "FORGE_ATTEMPT": str(ctx.attempt), "FORGE_WORKDIR": str(cwd),
           "FORGE_GRAPH_DIR": values["graph_dir"], "PYTHON": sys.executable}
    evidence: list[str] = []
    work_s = 0.0

    red = capture_redactor(ctx.ws, env)  # the node's env values never reach the ledger

    def invoke(step: str, tool: str, argv: list[str], timeout_s: float) -> CommandOutcome:
        nonlocal work_s
        out = run_in_session(argv, cwd, env, timeout_s)
        out.stdout, out.stderr = red.text(out.stdout), red.text(out.stderr)
        argv = red.value(argv)
        work_s += out.duration_s
        ev = E.ToolInvoked(
            tool=tool, argv=argv, cwd=str(cwd), exit_code=out.exit_code,
            duration_s=round(out.duration_s, 4),
            stdout_digest=arts.put(out.stdout) if out.stdout else None,
            stderr_digest=arts.put(out.stderr) if out.stderr else None,
            error=out.error, task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR)
        append_to_task(ctx.ws, ctx.task_id, [ev], command_id=ctx.cid(step))
        evidence.append(str(ev.event_id))
        return out

    def argv_of(argv: list[str] | None, sh: str | None) -> list[str]:
        if argv is not None:
            return [_subst(a, values) for a in argv]
        return ["bash", "-c", _subst(sh or "", values)]

    main = invoke("work", "command", argv_of(work.argv, work.sh), work.timeout_s)
    checks: list[GateResult] = []
    if main.error or main.exit_code != 0:
        reason = main.error or f"work command exited {main.exit_code}"
        tail = last_line(main.stderr)
        checks.append(GateResult.check(False, name="work", kind="work",
                                       reason=reason + (f": {tail}" if tail else "")))
        return WorkResult(False, checks, evidence, {}, work_s, reason)
    metrics = last_json(main.stdout)
    for i, v in enumerate(work.verify):
        if v.metric is not None:
            checks += metric_checks(v, (metrics or {}).get(v.metric))
        else:
            out = invoke(f"verify{i}", f"verify:{v.name}", argv_of(v.argv, v.sh), v.timeout_s)
            ok = out.error is None and out.exit_code == 0
            detail = out.error or f"exit {out.exit_code}"
            if not ok and out.stderr.strip():
                detail += ": " + last_line(out.stderr)
            checks.append(GateResult.check(ok, name=v.name, kind="command", reason=detail))
    deliverable: dict[str, str] = {}
    missing, refused = [], []
    for rel in work.deliverables:
        f = cwd / _subst(rel, values)
        if f.is_file():
            try:  # streamed, bounded: the node's command wrote it (ledger/sizes.py)
                deliverable[rel] = arts.put_file(f, limit=MAX_ARTIFACT_BYTES)
            except LedgerError as e:  # too large, or an archive that cannot be redacted
                refused.append(f"{rel}: {e}")
        else:
            missing.append(rel)
    if missing or refused:
        checks.append(GateResult.check(False, name="deliverables", kind="deliverables",
                                       reason="; ".join(
                                           ([f"missing: {', '.join(missing)}"] if missing
                                            else []) + refused)))
    passed = all(c.passed for c in checks)
    failed = list(dict.fromkeys(c.name for c in checks if not c.passed))
    reason = "" if passed else f"verification failed: {', '.join(failed)}"
    if main.stdout and not deliverable:
        deliverable["stdout"] = arts.put(main.stdout)
    return WorkResult(passed, checks, evidence, deliverable, work_s, reason)


def run_loop_work(ctx: NodeContext, work: LoopWork, cwd: Path) -> WorkResult:
    """Run a task YAML through the Task Loop as task `<graph>.<node>.a<attempt>` (a new task
    per attempt, so a reworked node really re-runs). Paths in the YAML are resolved against
    its own directory; {python} {graph_dir} {workdir} {node} in argv (and in
    `sandbox.writable`) are filled in."""
    src = (Path(ctx.view.graph_dir or cwd) / work.task).resolve()
    values = _placeholders(ctx, cwd)
    tid = f"{ctx.task_id}.{ctx.block}"
    try:
        data, node = load_yaml(src)
        if not isinstance(data, dict):
            raise HarnessError(f"node {ctx.node}: loop task {src} is not a mapping")
        data = {k: v for k, v in data.items() if k != "kind"}
        data["id"] = tid
        for key in ("evaluator", "executor"):
            part = data.get(key)
            if isinstance(part, dict) and isinstance(part.get("argv"), list):
                part["argv"] = [_subst(str(a), values) for a in part["argv"]]
        box = data.get("sandbox")  # the directories its tool calls may write: {workdir}
        if isinstance(box, dict) and isinstance(box.get("writable"), list):
            box["writable"] = [_subst(str(a), values) for a in box["writable"]]
        task = parse_spec("task", data, path=src, node=node)
        assert isinstance(task, TaskDefinition)
        t0 = time.monotonic()
        define_task_spec(ctx.ws, task, src, graph_node=(ctx.graph_id, ctx.node))
    except SpecError as e:
        raise HarnessError(f"node {ctx.node}: loop task {e.problems[0]}") from None
    out = run_task(ctx.ws, tid)
    passed = out.exit_state == "delivered"
    checks = [GateResult.check(
        passed, name="task-loop", kind="task-loop", task=tid, n=out.blocks,
        reason=f"{out.status} {out.exit_state or ''}: {out.exit_reason or ''}".strip())]
    return WorkResult(passed, checks, [task_stream(tid)], {"task": digest({"task": tid})},
                      time.monotonic() - t0,
                      "" if passed else f"task loop {tid} ended {out.exit_state or out.status}")


def execute_node(ctx: NodeContext) -> str:
    """Run one claimed node to delivery or rejection, renewing its claim's lease meanwhile.
    Returns the final state."""
    with lease.lease(ctx.ws.home, ctx.graph_id, ctx.node, ctx.attempt):
        return _execute_node(ctx)


def _execute_node(ctx: NodeContext) -> str:
    t0 = time.monotonic()
    n = ctx.view.nodes[ctx.node]
    spec = n.spec
    definition = spec.model_dump(mode="json")
    begin: list[E.Event] = []
    try:
        mem: TaskMemory | None = read_memory(ctx.ws.ledger, ctx.task_id)[0]
    except NotFoundError:
        mem = None
    try:  # one owner per task stream: a standalone task's stream is never entered
        check_owner(ctx.ws, ctx.task_id, graph_node=(ctx.graph_id, ctx.node))
    except HarnessError as e:
        return _refuse_node(ctx, str(e), time.monotonic() - t0)
    if mem is None:
        begin.append(E.TaskDefined(
            title=spec.title or spec.id, task_type=spec.type or "", goal=spec.goal,
            definition=definition, definition_hash=digest(definition), task_id=ctx.task_id,
            actor=ACTOR))
    else:
        if mem.current_block is not None:
            # An earlier attempt's block, left open when its worker stopped: closed first.
            begin.append(E.LoopBlockHandedOff(
                outcome="failed", state_reached="abandoned",
                findings=[f"attempt {mem.current_block.index} stopped before it concluded"],
                task_id=ctx.task_id, block_id=mem.current_block.block_id, actor=ACTOR))
        if mem.status == "exited":
            begin.append(E.TaskReopened(reason=n.reason or f"attempt {ctx.attempt}",
                                        task_id=ctx.task_id, actor=ACTOR))
    begin.append(E.LoopBlockStarted(
        index=ctx.attempt, sub_goal=spec.goal or spec.title or spec.id,
        routing={"executor": spec.work.kind if spec.work else "none", "model_tier": "none",
                 "agent_topology": "single", "worker": ctx.worker, "run_id": ctx.run_id},
        host=local_host(), task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR))
    append_to_task(ctx.ws, ctx.task_id, begin, command_id=ctx.cid("begin"))
    cwd = workdir(ctx.ws, ctx.graph_id)
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        if isinstance(spec.work, CommandWork):
            res = run_command_work(ctx, spec.work, cwd)
        elif isinstance(spec.work, LoopWork):
            res = run_loop_work(ctx, spec.work, cwd)
        else:  # pragma: no cover - NodeSpec forbids it
            raise HarnessError(f"node {ctx.node} has no work")
    except HarnessError as e:
        res = WorkResult(False, [GateResult.check(False, name="work", kind="work",
                                                  reason=str(e))], [], {},
                         time.monotonic() - t0, str(e))
    ver = E.VerificationRecorded(
        contract_hash=digest(spec.work.model_dump(mode="json") if spec.work else {}),
        passed=res.passed, verdict="pass" if res.passed else "fail", gates=res.checks,
        evidence=res.evidence, task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR)
    ddig = digest(res.deliverable) if res.deliverable else None
    gstream = graph_stream(ctx.graph_id)
    append_to_task(ctx.ws, ctx.task_id, [ver], also=[Append(gstream, [E.NodeVerified(
        node=ctx.node, attempt=ctx.attempt, passed=res.passed, checks=res.checks,
        verification_event_id=ver.event_id, deliverable=res.deliverable,
        deliverable_digest=ddig, task_id=ctx.task_id, actor=ACTOR)])],
        command_id=ctx.cid("verified"))
    return _conclude(ctx, res, time.monotonic() - t0, ver)


def _refuse_node(ctx: NodeContext, reason: str, elapsed: float) -> str:
    """Reject the attempt on the graph stream alone (its claim released): the task stream it
    would have entered belongs to another owner and gets nothing."""
    for _ in range(200):
        view = ctx.view
        catch_up(ctx.ws.ledger, view)
        n = view.nodes[ctx.node]
        if n.attempt != ctx.attempt or n.state not in ("running", "verified"):
            return "abandoned"
        events: list[E.Event] = [E.NodeRejected(
            node=ctx.node, attempt=ctx.attempt, reason=reason, duration_s=round(elapsed, 4),
            actor=ACTOR)]
        try:
            ctx.ws.ledger.save(Append(graph_stream(ctx.graph_id), events,
                                      expected_version=view.version),
                               *lease.releases_for(ctx.graph_id, events),
                               command_id=ctx.cid("refused"))
            return "rejected"
        except ConflictError:
            continue
    raise HarnessError(f"graph {ctx.graph_id!r}: could not conclude {ctx.node} (stream busy)")


def _closing(ctx: NodeContext, res: WorkResult, ver: E.VerificationRecorded,
             final: str) -> list[E.Event]:
    """The node's task-stream ending for `final`: the standard task events."""
    spec = ctx.view.nodes[ctx.node].spec
    closing: list[E.Event]
    if final == "delivered":
        closing = [E.DeliverableAccepted(
            candidate={}, summary=f"{spec.id}: all {len(res.checks)} checks passed",
            verification_event_id=ver.event_id, evidence=res.evidence,
            task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR),
            E.LoopBlockHandedOff(outcome="delivered", state_reached="verified",
                                 task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR),
            E.TaskExited(state="delivered", reason="deliverable verified and handed off",
                         evidence=[str(ver.event_id)], task_id=ctx.task_id, actor=ACTOR)]
    elif final == "rejected":
        closing = [E.DirectionRejected(reason=res.reason or "verification failed",
                                       evidence=[str(ver.event_id), *res.evidence],
                                       task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR),
                   E.LoopBlockHandedOff(outcome="failed", state_reached="unverified",
                                        findings=[res.reason], task_id=ctx.task_id,
                                        block_id=ctx.block, actor=ACTOR),
                   E.TaskExited(state="failed-unverifiable", reason=res.reason,
                                evidence=[str(ver.event_id)], task_id=ctx.task_id,
                                actor=ACTOR)]
    else:  # reworked while running: the attempt is abandoned and the node runs again
        closing = [E.LoopBlockHandedOff(outcome="no-progress", state_reached="superseded",
                                        findings=["rework requested while running"],
                                        task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR)]
    return closing


def _conclude(ctx: NodeContext, res: WorkResult, elapsed: float,
              ver: E.VerificationRecorded) -> str:
    """Handoffs + delivery (or refusals + rejection) in one save, decided on current state."""
    gstream = graph_stream(ctx.graph_id)
    view = ctx.view
    for _ in range(200):
        catch_up(ctx.ws.ledger, view)
        n = view.nodes[ctx.node]
        if n.attempt != ctx.attempt or n.state not in ("running", "verified"):
            return "abandoned"  # someone abandoned this attempt (its runner was presumed dead)
        events: list[E.Event]
        delivered, refused = handoff_events(view, ctx.node, ctx.attempt)
        if n.stale:
            events = [*refused, E.NodeAbandoned(node=ctx.node, attempt=ctx.attempt,
                                                reason="rework requested while running")]
            final = "abandoned"
        elif res.passed:
            done = E.NodeDelivered(node=ctx.node, attempt=ctx.attempt,
                                   deliverable_digest=n.deliverable_digest,
                                   duration_s=round(elapsed, 4), work_s=round(res.work_s, 4),
                                   task_id=ctx.task_id, actor=ACTOR)
            events = [*delivered, done]
            for es in view.out_edges.get(ctx.node, ()):
                tgt = view.nodes[es.spec.dst]
                if es.spec.label == "control:stop" and tgt.state in ("pending", "needs-rework"):
                    events.append(E.NodeRejected(
                        node=tgt.id, attempt=tgt.attempt,
                        reason=f"stopped by {ctx.node} (control/stop) when it delivered",
                        evidence=[str(done.event_id)], actor=ACTOR))
            final = "delivered"
        else:
            events = [*refused, E.NodeRejected(
                node=ctx.node, attempt=ctx.attempt, reason=res.reason or "verification failed",
                evidence=[str(ver.event_id), *res.evidence], duration_s=round(elapsed, 4),
                work_s=round(res.work_s, 4), task_id=ctx.task_id, actor=ACTOR)]
            final = "rejected"
        try:
            append_to_task(ctx.ws, ctx.task_id, _closing(ctx, res, ver, final),
                           also=[Append(gstream, events, expected_version=view.version),
                                 *lease.releases_for(ctx.graph_id, events)],
                           command_id=ctx.cid("conclude"))
            return final
        except ConflictError:
            continue
    raise HarnessError(f"graph {ctx.graph_id!r}: could not conclude {ctx.node} (stream busy)")
