"""Running a task graph: define it, evolve it, and execute its ready nodes in parallel workers.

Contracts:
- Definition and evolution are events on stream `graph:<id>`: `define_graph` writes one
  GraphDefined carrying the initial nodes and edges; `add_node` / `add_edge` append NodeAdded /
  EdgeAdded, checked against the current graph (dangling, cycle) and written with the stream's
  expected version, so two concurrent edits cannot both pass a stale check.
- `run_graph` starts `jobs` worker processes (`python -m infer_forge.harness.graph_runner`)
  sharing one ledger. A worker claims a ready node by appending NodeStarted with the graph
  stream's expected version: a ConflictError means the stream moved (maybe another claim), so it
  re-reads and tries again; no node is claimed twice. Workers pick up nodes as they become
  ready and exit when nothing is ready or in flight. Workers (and their commands) die with
  the runner (PR_SET_PDEATHSIG), so a kill -9 of the runner leaves no orphan at work.
- `run_graph(resume=True)` after a crash marks the dead run's in-flight nodes NodeAbandoned
  (their partial events stay on the task stream) and runs them again as a new attempt; a
  delivered node is never run again. Without `resume`, such leftovers are an error.
- Verification before handoff: a node's outbound handoffs are decided by `handoff_events`
  from the projected state: delivered only if the source's current attempt passed
  verification, else HandoffRefused is recorded. The same gate serves `hand_off`, the manual
  API, which records the refusal and raises.
- Rework: `request_rework` / `invalidate` append one ReworkRequested per node of
  `projections.graph.rework_plan` (reason + path), atomically.
- Node work: `command` (argv or `bash -c`, then verification steps) is recorded on the node's
  task stream `task:<graph>.<node>` as TaskDefined, LoopBlockStarted (one block per attempt),
  ToolInvoked per command, VerificationRecorded, then DeliverableAccepted or DirectionRejected
  and TaskExited. `loop` work runs a task YAML through `harness.loop` (issue 3) as its own
  task `<graph>.<node>.a<attempt>`; the node passes when that loop exits delivered.
- A node's verification and its NodeVerified are one atomic save; its handoffs, delivery (or
  refusals, rejection) and task-stream ending are another, written with the graph stream's
  expected version so the decision is made on current state.
Command ids are deterministic (graph, node, attempt, step), so a retried append never doubles.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from ..ledger import events as E
from ..ledger.clock import digest
from ..ledger.errors import ConflictError
from ..ledger.graphspec import (
    CommandWork,
    LoopWork,
    check_graph,
    load_graph_spec,
    parse_edge,
    parse_node,
)
from ..ledger.store import Append, Ledger, task_stream
from ..ledger.workspace import Workspace, open_workspace
from ..projections.graph import (
    GraphView,
    catch_up,
    graph_stream,
    load_graph,
    node_task_id,
    rework_plan,
)
from .errors import HarnessError
from .loop.define import define_task
from .loop.run import run_task
from .tools.calls import capture_redactor

Echo = Callable[[str], None]
ACTOR = E.Actor.tool("graph-runner")


def _quiet(_: str) -> None:
    return None


# --- definition and evolution -------------------------------------------------------------


def define_graph(ws: Workspace, path: str | Path) -> tuple[GraphView, bool]:
    """Define a graph from YAML. Returns (view, created); the same file again is a no-op,
    a different spec under an existing name is an error."""
    p = Path(path).resolve()
    spec = load_graph_spec(p)
    stream = graph_stream(spec.name)
    h = spec.spec_hash()
    if ws.ledger.version(stream):
        view = load_graph(ws.ledger, spec.name)
        first = ws.ledger.stream(stream, until_version=1)[0].event
        if isinstance(first, E.GraphDefined) and first.spec_hash == h:
            return view, False
        raise HarnessError(f"graph {spec.name!r} is already defined with another spec; evolve it "
                           "with forge graph add-node/add-edge or give the new graph another name")
    defined = E.GraphDefined(
        graph_id=spec.name, title=spec.title, description=spec.description, source=str(p),
        graph_dir=str(p.parent), spec_hash=h, actor=ACTOR,
        nodes=[n.model_dump(mode="json") for n in spec.nodes],
        edges=[e.dump() for e in spec.edges])
    ws.ledger.append(stream, [defined], expected_version=0, command_id=f"graph:{spec.name}:{h}")
    return load_graph(ws.ledger, spec.name), True


def add_node(ws: Workspace, graph_id: str, data: dict[str, Any], reason: str = "") -> GraphView:
    view = load_graph(ws.ledger, graph_id)
    node = parse_node(data, f"graph {graph_id}: new node")
    check_graph([*view.node_specs(), node], view.edge_specs(), f"graph {graph_id}")
    ws.ledger.append(graph_stream(graph_id), [E.NodeAdded(node=node.model_dump(mode="json"),
                                                          reason=reason)],
                     expected_version=view.version)
    return load_graph(ws.ledger, graph_id)


def add_edge(ws: Workspace, graph_id: str, data: dict[str, Any], reason: str = "") -> GraphView:
    view = load_graph(ws.ledger, graph_id)
    edge = parse_edge(data, f"graph {graph_id}: new edge")
    check_graph(view.node_specs(), [*view.edge_specs(), edge], f"graph {graph_id}")
    ws.ledger.append(graph_stream(graph_id), [E.EdgeAdded(edge=edge.dump(), reason=reason)],
                     expected_version=view.version)
    return load_graph(ws.ledger, graph_id)


# --- rework, invalidation, rejection --------------------------------------------------------


def request_rework(ws: Workspace, graph_id: str, node: str, reason: str, *,
                   trigger: str = "rework", evidence: Iterable[str] = (),
                   actor: E.Actor = E.SYSTEM) -> dict[str, list[str]]:
    """Reopen `node` and mark every downstream consumer needs-rework (one event each, with the
    path). `trigger="invalidate"` also records DeliverableInvalidated. Returns the plan."""
    for _ in range(20):
        view = load_graph(ws.ledger, graph_id)
        if node not in view.nodes or view.nodes[node].kind != "task":
            raise HarnessError(f"graph {graph_id!r} has no task node {node!r}")
        plan = rework_plan(view, node)
        # The origin is reopened even if it never ran or was rejected: the request is explicit.
        plan.setdefault(node, [node])
        events: list[E.Event] = []
        if trigger == "invalidate":
            events.append(E.DeliverableInvalidated(node=node, reason=reason,
                                                   evidence=list(evidence), actor=actor))
        for target, path in plan.items():
            carried = "control" if _via_control(view, path) else trigger
            events.append(E.ReworkRequested(node=target, origin=node, trigger=carried,
                                            reason=reason, path=path, actor=actor))
        try:
            ws.ledger.append(graph_stream(graph_id), events, expected_version=view.version,
                             command_id=f"rework:{graph_id}:{node}:{view.version}")
            return plan
        except ConflictError:
            continue
    raise HarnessError(f"graph {graph_id!r} kept moving; rework of {node!r} not recorded")


def _via_control(view: GraphView, path: list[str]) -> bool:
    for a, b in zip(path, path[1:], strict=False):
        if f"{a}->{b}:control:rework" in view.edges:
            return True
    return False


def invalidate(ws: Workspace, graph_id: str, node: str, reason: str,
               evidence: Iterable[str] = ()) -> dict[str, list[str]]:
    return request_rework(ws, graph_id, node, reason, trigger="invalidate", evidence=evidence)


def reject(ws: Workspace, graph_id: str, node: str, reason: str,
           evidence: Iterable[str] = ()) -> None:
    """Reject a direction by hand: the node stays in the graph with the reason and evidence."""
    view = load_graph(ws.ledger, graph_id)
    n = view.nodes.get(node)
    if n is None or n.kind != "task":
        raise HarnessError(f"graph {graph_id!r} has no task node {node!r}")
    if n.state in ("running", "verified"):
        raise HarnessError(f"node {node!r} is running (attempt {n.attempt}); reject it after")
    ws.ledger.append(graph_stream(graph_id), [E.NodeRejected(
        node=node, attempt=n.attempt, reason=reason, evidence=list(evidence))],
        expected_version=view.version)


# --- verification before handoff ---------------------------------------------------------


def handoff_events(view: GraphView, src: str, attempt: int
                   ) -> tuple[list[E.HandoffDelivered], list[E.HandoffRefused]]:
    """The handoff gate for every outbound handoff edge of `src`: delivered only when the
    current attempt's deliverable passed verification (and was not reworked meanwhile)."""
    n = view.nodes[src]
    ok = n.state == "verified" and n.verified and n.attempt == attempt and not n.stale
    if ok:
        why = ""
    elif n.attempt != attempt:
        why = f"attempt {attempt} is not the current attempt ({n.attempt})"
    elif n.stale:
        why = "rework was requested while it ran"
    elif n.state == "running":
        why = "deliverable failed verification" if n.verdict is False else \
            "deliverable not verified yet"
    else:
        why = f"source is {n.state}, not verified"
    delivered: list[E.HandoffDelivered] = []
    refused: list[E.HandoffRefused] = []
    for es in view.out_edges.get(src, ()):
        if es.spec.kind != "handoff":
            continue
        if ok:
            delivered.append(E.HandoffDelivered(
                edge=es.id, src=src, dst=es.spec.dst, attempt=attempt,
                deliverable_digest=n.deliverable_digest,
                verification_event_id=n.verification_event_id, actor=ACTOR))
        else:
            refused.append(E.HandoffRefused(edge=es.id, src=src, dst=es.spec.dst,
                                            reason=why, actor=ACTOR))
    return delivered, refused


def hand_off(ws: Workspace, graph_id: str, src: str, dst: str) -> E.HandoffDelivered:
    """Hand `src`'s deliverable to `dst` by hand. Unverified work is refused: the refusal is
    recorded, then HarnessError is raised."""
    view = load_graph(ws.ledger, graph_id)
    eid = f"{src}->{dst}:handoff"
    if eid not in view.edges:
        raise HarnessError(f"graph {graph_id!r} has no handoff edge {src} -> {dst}")
    delivered, refused = handoff_events(view, src, view.nodes[src].attempt)
    mine_ok = [d for d in delivered if d.edge == eid]
    mine_no = [r for r in refused if r.edge == eid]
    ws.ledger.append(graph_stream(graph_id), mine_ok or mine_no, expected_version=view.version)
    if mine_no:
        raise HarnessError(f"handoff {src} -> {dst} refused: {mine_no[0].reason}")
    return mine_ok[0]


# --- node work ---------------------------------------------------------------------------


def _die_with_parent(parent: int) -> Callable[[], None]:
    """preexec_fn: the child gets SIGKILL when its parent dies (Linux), so a kill -9 of the
    runner takes its workers and their commands with it."""

    def fn() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(137)

    return fn


@dataclass
class CommandOutcome:
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None


_SETPRIV = shutil.which("setpriv")


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> CommandOutcome:
    """Run a node's command in its own session; it dies with its worker. `setpriv` sets the
    parent-death signal without a Python preexec_fn (which forces a slow fork: ~45 ms)."""
    t0 = time.monotonic()
    guard: dict[str, Any] = {"preexec_fn": _die_with_parent(os.getpid())}
    if _SETPRIV:
        argv, guard = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv], {}
    try:
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True,
                             **guard)
    except OSError as e:
        return CommandOutcome(None, "", "", time.monotonic() - t0,
                              f"cannot start {argv[-1] if _SETPRIV else argv[0]} in {cwd}: "
                              f"{e.strerror or e}")
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        return CommandOutcome(p.returncode, out, err, time.monotonic() - t0,
                              f"timed out after {timeout_s:g}s")
    return CommandOutcome(p.returncode, out, err, time.monotonic() - t0)


def last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None
    return None


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


def _subst(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text


@dataclass
class WorkResult:
    passed: bool
    checks: list[dict[str, Any]]
    evidence: list[str]
    deliverable: dict[str, str]
    work_s: float
    reason: str = ""


def run_command_work(ctx: NodeContext, work: CommandWork, cwd: Path) -> WorkResult:
    ledger, arts = ctx.ws.ledger, ctx.ws.artifacts
    values = {"python": sys.executable, "graph_dir": ctx.view.graph_dir or str(cwd),
              "workdir": str(cwd), "node": ctx.node, "attempt": str(ctx.attempt)}
    env = {**os.environ, **{k: _subst(v, values) for k, v in work.env.items()},
           "FORGE_GRAPH": ctx.graph_id, "FORGE_NODE": ctx.node,
           "FORGE_ATTEMPT": str(ctx.attempt), "FORGE_WORKDIR": str(cwd),
           "FORGE_GRAPH_DIR": values["graph_dir"], "PYTHON": sys.executable}
    tstream = task_stream(ctx.task_id)
    evidence: list[str] = []
    work_s = 0.0

    red = capture_redactor(ctx.ws, env)  # the node's env values never reach the ledger

    def invoke(step: str, tool: str, argv: list[str], timeout_s: float) -> CommandOutcome:
        nonlocal work_s
        out = _run(argv, cwd, env, timeout_s)
        out.stdout, out.stderr = red.text(out.stdout), red.text(out.stderr)
        argv = red.value(argv)
        work_s += out.duration_s
        ev = E.ToolInvoked(
            tool=tool, argv=argv, cwd=str(cwd), exit_code=out.exit_code,
            duration_s=round(out.duration_s, 4),
            stdout_digest=arts.put(out.stdout) if out.stdout else None,
            stderr_digest=arts.put(out.stderr) if out.stderr else None,
            error=out.error, task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR)
        ledger.append(tstream, [ev], command_id=ctx.cid(step))
        evidence.append(str(ev.event_id))
        return out

    def argv_of(argv: list[str] | None, sh: str | None) -> list[str]:
        if argv is not None:
            return [_subst(a, values) for a in argv]
        return ["bash", "-c", _subst(sh or "", values)]

    main = invoke("work", "command", argv_of(work.argv, work.sh), work.timeout_s)
    checks: list[dict[str, Any]] = []
    if main.error or main.exit_code != 0:
        reason = main.error or f"work command exited {main.exit_code}"
        tail = " ".join(main.stderr.strip().splitlines()[-1:])[:200]
        checks.append({"name": "work", "passed": False,
                       "detail": reason + (f": {tail}" if tail else "")})
        return WorkResult(False, checks, evidence, {}, work_s, reason)
    metrics = last_json(main.stdout)
    for i, v in enumerate(work.verify):
        if v.metric is not None:
            val = (metrics or {}).get(v.metric)
            if not isinstance(val, int | float) or isinstance(val, bool):
                checks.append({"name": v.name, "passed": False, "metric": v.metric,
                               "detail": f"metric {v.metric!r} missing from the last JSON line"})
                continue
            ok = ((v.at_least is None or val >= v.at_least)
                  and (v.at_most is None or val <= v.at_most)
                  and (v.equals is None or val == v.equals))
            bound = {k: b for k, b in (("at_least", v.at_least), ("at_most", v.at_most),
                                       ("equals", v.equals)) if b is not None}
            checks.append({"name": v.name, "passed": ok, "metric": v.metric, "value": val,
                           **bound})
        else:
            out = invoke(f"verify{i}", f"verify:{v.name}", argv_of(v.argv, v.sh), v.timeout_s)
            ok = out.error is None and out.exit_code == 0
            detail = out.error or f"exit {out.exit_code}"
            if not ok and out.stderr.strip():
                detail += ": " + out.stderr.strip().splitlines()[-1][:200]
            checks.append({"name": v.name, "passed": ok, "detail": detail})
    deliverable: dict[str, str] = {}
    missing = []
    for rel in work.deliverables:
        f = cwd / _subst(rel, values)
        if f.is_file():
            deliverable[rel] = arts.put(f.read_bytes())
        else:
            missing.append(rel)
    if missing:
        checks.append({"name": "deliverables", "passed": False,
                       "detail": f"missing: {', '.join(missing)}"})
    passed = all(c["passed"] for c in checks)
    failed = [c["name"] for c in checks if not c["passed"]]
    reason = "" if passed else f"verification failed: {', '.join(failed)}"
    if main.stdout and not deliverable:
        deliverable["stdout"] = arts.put(main.stdout)
    return WorkResult(passed, checks, evidence, deliverable, work_s, reason)


def run_loop_work(ctx: NodeContext, work: LoopWork, cwd: Path) -> WorkResult:
    """Run a task YAML through issue 3's Task Loop as task `<graph>.<node>.a<attempt>` (a new
    task per attempt, so a reworked node really re-runs). Paths in the YAML are resolved
    against its own directory; {python} {graph_dir} {workdir} {node} in argv are filled in."""
    import yaml

    from ..ledger.specs import SpecError, load_yaml

    src = (Path(ctx.view.graph_dir or cwd) / work.task).resolve()
    try:
        data = load_yaml(src)[0]
    except SpecError as e:
        raise HarnessError(f"node {ctx.node}: cannot read loop task {src}: "
                           f"{e.problems[0]}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"node {ctx.node}: loop task {src} is not a mapping")
    values = {"python": sys.executable, "graph_dir": ctx.view.graph_dir or str(cwd),
              "workdir": str(cwd), "node": ctx.node, "attempt": str(ctx.attempt)}
    tid = f"{ctx.task_id}.{ctx.block}"
    data["id"] = tid
    for key in ("point", "profile"):
        if data.get(key):
            data[key] = str((src.parent / data[key]).resolve())
    for key in ("evaluator", "executor"):
        part = data.get(key)
        if isinstance(part, dict) and isinstance(part.get("argv"), list):
            part["argv"] = [_subst(str(a), values) for a in part["argv"]]
    copy = cwd / "loops" / f"{tid}.yaml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    t0 = time.monotonic()
    define_task(ctx.ws, copy, actor=ACTOR)
    out = run_task(ctx.ws, tid)
    passed = out.exit_state == "delivered"
    checks = [{"name": "task-loop", "passed": passed, "task": tid, "blocks": out.blocks,
               "detail": f"{out.status} {out.exit_state or ''}: {out.exit_reason or ''}".strip()}]
    return WorkResult(passed, checks, [f"task:{tid}"], {"task": digest({"task": tid})},
                      time.monotonic() - t0,
                      "" if passed else f"task loop {tid} ended {out.exit_state or out.status}")


def execute_node(ctx: NodeContext) -> str:
    """Run one claimed node to delivery or rejection. Returns the final state."""
    t0 = time.monotonic()
    ledger = ctx.ws.ledger
    n = ctx.view.nodes[ctx.node]
    spec = n.spec
    tstream = task_stream(ctx.task_id)
    definition = spec.model_dump(mode="json")
    begin: list[E.Event] = []
    if not ledger.version(tstream):
        begin.append(E.TaskDefined(
            title=spec.title or spec.id, task_type=spec.type or "", goal=spec.goal,
            definition=definition, definition_hash=digest(definition), task_id=ctx.task_id,
            actor=ACTOR))
    elif ctx.attempt > 1:
        begin.append(E.TaskReopened(reason=n.reason or f"attempt {ctx.attempt}",
                                    task_id=ctx.task_id, actor=ACTOR))
    begin.append(E.LoopBlockStarted(
        index=ctx.attempt, sub_goal=spec.goal or spec.title or spec.id,
        routing={"executor": spec.work.kind if spec.work else "none", "model_tier": "none",
                 "agent_topology": "single", "worker": ctx.worker, "run_id": ctx.run_id},
        task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR))
    ledger.append(tstream, begin, command_id=ctx.cid("begin"))
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
        res = WorkResult(False, [{"name": "work", "passed": False, "detail": str(e)}], [], {},
                         time.monotonic() - t0, str(e))
    ver = E.VerificationRecorded(
        contract_hash=digest(spec.work.model_dump(mode="json") if spec.work else {}),
        passed=res.passed, verdict="pass" if res.passed else "fail", gates=res.checks,
        evidence=res.evidence, task_id=ctx.task_id, block_id=ctx.block, actor=ACTOR)
    ddig = digest(res.deliverable) if res.deliverable else None
    gstream = graph_stream(ctx.graph_id)
    ledger.save(Append(tstream, [ver]), Append(gstream, [E.NodeVerified(
        node=ctx.node, attempt=ctx.attempt, passed=res.passed, checks=res.checks,
        verification_event_id=ver.event_id, deliverable=res.deliverable,
        deliverable_digest=ddig, task_id=ctx.task_id, actor=ACTOR)]),
        command_id=ctx.cid("verified"))
    return _conclude(ctx, res, time.monotonic() - t0, ver)


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
            ctx.ws.ledger.save(Append(gstream, events, expected_version=view.version),
                               Append(task_stream(ctx.task_id), _closing(ctx, res, ver, final)),
                               command_id=ctx.cid("conclude"))
            return final
        except ConflictError:
            continue
    raise HarnessError(f"graph {ctx.graph_id!r}: could not conclude {ctx.node} (stream busy)")


# --- workers -------------------------------------------------------------------------------


def worker_loop(ws: Workspace, graph_id: str, run_id: str, worker: str,
                poll_s: float = 0.03) -> int:
    """Claim and run ready nodes until nothing is ready or in flight in this run.
    Returns how many nodes this worker ran."""
    ran = 0
    gstream = graph_stream(graph_id)
    view = load_graph(ws.ledger, graph_id)
    idle = 0
    while True:
        catch_up(ws.ledger, view)
        run = next((r for r in view.runs if r.run_id == run_id), None)
        if run is None or run.outcome is not None:
            return ran
        ready = view.ready()
        if not ready:
            if not any(n.run_id == run_id for n in view.running()):
                return ran
            # Polling the ledger, the only channel between workers; back off while idle.
            idle += 1
            time.sleep(min(poll_s * idle, 0.25))
            continue
        idle = 0
        node = ready[0]
        attempt = view.nodes[node].attempt + 1
        claim = E.NodeStarted(node=node, attempt=attempt, run_id=run_id, worker=worker,
                              pid=os.getpid(), task_id=node_task_id(graph_id, node),
                              actor=ACTOR,
                              input_digests={es.spec.src: es.deliverable_digest or ""
                                             for es in view.in_edges.get(node, ())
                                             if es.spec.kind == "handoff"})
        try:
            ws.ledger.append(gstream, [claim], expected_version=view.version,
                             command_id=f"{graph_id}:{node}:a{attempt}:start:{run_id}:{worker}")
        except ConflictError:
            continue
        catch_up(ws.ledger, view)
        execute_node(NodeContext(ws, view, node, attempt, run_id, worker))
        ran += 1


def _proc_start(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not start or _proc_start(pid) == start


@dataclass
class RunSummary:
    graph_id: str
    run_id: str
    jobs: int
    outcome: str
    wall_s: float
    counts: dict[str, int]
    ran: int  # node attempts concluded in this run
    peak_in_flight: int
    work_s: float  # sum of time inside node commands
    overhead_per_node_s: float  # mean claim-to-conclusion time not spent in node commands
    abandoned: list[str] = field(default_factory=list)
    blocked: dict[str, list[str]] = field(default_factory=dict)
    critical_path: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _progress_line(t: float, ev: E.Event, view: GraphView) -> str | None:
    total = len(view.tasks())
    c = view.counts()
    tail = (f"[{c.get('delivered', 0)}/{total} delivered, {len(view.running())} running, "
            f"{c.get('ready', 0)} ready]")
    match ev:
        case E.NodeStarted():
            return f"[{t:6.1f}s] start     {ev.node} (attempt {ev.attempt}, {ev.worker})  {tail}"
        case E.NodeDelivered():
            return f"[{t:6.1f}s] delivered {ev.node} in {ev.duration_s:.2f}s  {tail}"
        case E.NodeRejected():
            return f"[{t:6.1f}s] rejected  {ev.node}: {ev.reason}  {tail}"
        case E.NodeAbandoned():
            return f"[{t:6.1f}s] abandoned {ev.node} (attempt {ev.attempt}): {ev.reason}"
        case E.HandoffRefused():
            return f"[{t:6.1f}s] refused   handoff {ev.src} -> {ev.dst}: {ev.reason}"
    return None


def run_graph(ws: Workspace, graph_id: str, *, jobs: int | None = None, resume: bool = False,
              echo: Echo = _quiet, poll_s: float = 0.05, max_respawns: int | None = None
              ) -> RunSummary:
    """Run the graph's ready nodes in `jobs` worker processes until nothing more can run."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    ledger = ws.ledger
    gstream = graph_stream(graph_id)
    view = load_graph(ledger, graph_id)
    for r in view.runs:
        if r.outcome is None and _alive(r.pid, r.pid_start) and r.pid != os.getpid():
            raise HarnessError(f"graph {graph_id!r} is being run by pid {r.pid} (run {r.run_id})"
                               "; wait for it, or stop it and run: forge graph resume")
    stale = view.running()
    if stale and not resume:
        raise HarnessError(
            f"graph {graph_id!r} was interrupted with {len(stale)} node(s) in flight "
            f"({', '.join(n.id for n in stale)}); run: forge graph resume")
    # Where the repo nodes live, checked before anything is recorded.
    repos = [repo_dir(ws, graph_id, n.id, n.spec.path) for n in view.nodes.values()
             if n.kind == "repo"]
    run_id = f"run{len(view.runs) + 1}-{uuid4().hex[:6]}"
    me = os.getpid()
    start: list[E.Event] = [E.GraphRunFinished(run_id=r.run_id, outcome="interrupted")
                            for r in view.runs if r.outcome is None]
    start += [E.NodeAbandoned(node=n.id, attempt=n.attempt,
                              reason=f"runner of {n.run_id} died (pid {n.pid} gone); re-run")
              for n in stale]
    start.append(E.GraphRunStarted(run_id=run_id, jobs=jobs, pid=me, pid_start=_proc_start(me),
                                   host=socket.gethostname(), resumed=resume))
    try:
        ledger.append(gstream, start, expected_version=view.version)
    except ConflictError:
        raise HarnessError(f"graph {graph_id!r} changed while starting; try again") from None
    for d in repos:
        d.mkdir(parents=True, exist_ok=True)
    workdir(ws, graph_id).mkdir(parents=True, exist_ok=True)
    logs = ws.home / "graphs" / graph_id / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if stale:
        echo(f"resuming {graph_id}: re-running {', '.join(n.id for n in stale)}")
    todo = [n for n in view.tasks() if n.state != "delivered"]
    n_workers = max(1, min(jobs, len(todo)))
    echo(f"graph {graph_id}: {len(view.tasks())} tasks, {len(todo)} to do, "
         f"{n_workers} worker(s), run {run_id}")
    procs: dict[str, subprocess.Popen] = {}
    spawned = 0
    respawns_left = max_respawns if max_respawns is not None else 2 * n_workers

    def spawn(name: str) -> None:
        nonlocal spawned
        spawned += 1
        log = (logs / f"{run_id}-{name}.log").open("w")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "infer_forge.harness.graph_runner", "--home", str(ws.home),
             "--graph", graph_id, "--run", run_id, "--worker", name],
            stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_die_with_parent(me))
        log.close()

    for i in range(n_workers):
        spawn(f"w{i + 1}")
    live = load_graph(ledger, graph_id)
    failed = False
    try:
        while procs:
            time.sleep(poll_s)
            _echo_new(ledger, live, t0, echo)
            for name, p in list(procs.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del procs[name]
                if rc == 0:
                    continue
                tail = (logs / f"{run_id}-{name}.log").read_text()[-400:].strip()
                echo(f"worker {name} died (exit {rc}): {tail.splitlines()[-1] if tail else ''}")
                orphans = [n for n in load_graph(ledger, graph_id).running()
                           if n.run_id == run_id and n.worker == name]
                if orphans:
                    ledger.append(gstream, [E.NodeAbandoned(
                        node=n.id, attempt=n.attempt, reason=f"worker {name} died (exit {rc})")
                        for n in orphans])
                if respawns_left > 0:
                    respawns_left -= 1
                    spawn(f"{name.split('.')[0]}.{spawned}")
                else:
                    failed = True
        _echo_new(ledger, live, t0, echo)
    except BaseException:
        for p in procs.values():
            p.kill()
        ledger.append(gstream, [E.GraphRunFinished(run_id=run_id, outcome="interrupted",
                                                   wall_s=round(time.monotonic() - t0, 3))])
        raise
    wall = time.monotonic() - t0
    final = load_graph(ledger, graph_id)
    # Completed: every task delivered or rejected (a rejected direction is a result too).
    done = all(n.state in ("delivered", "rejected") for n in final.tasks())
    outcome = "completed" if done else ("failed" if failed else "stuck")
    counts = final.counts()
    ledger.append(gstream, [E.GraphRunFinished(run_id=run_id, outcome=outcome, counts=counts,
                                               wall_s=round(wall, 3))],
                  command_id=f"{graph_id}:{run_id}:finished")
    stats = run_stats(ledger, graph_id, run_id)
    overhead = stats["overhead_s"] / stats["ran"] if stats["ran"] else 0.0
    path, _ = final.critical_path()
    summary = RunSummary(graph_id, run_id, jobs, outcome, round(wall, 3), counts, stats["ran"],
                         stats["peak_in_flight"], round(stats["work_s"], 3),
                         round(max(0.0, overhead), 4), [n.id for n in stale], final.blocked(),
                         path)
    return summary


def _echo_new(ledger: Ledger, live: GraphView, t0: float, echo: Echo) -> None:
    for ev in catch_up(ledger, live):
        line = _progress_line(time.monotonic() - t0, ev, live)
        if line:
            echo(line)


def run_stats(ledger: Ledger, graph_id: str, run_id: str) -> dict[str, Any]:
    """Peak concurrent in-flight nodes, attempts concluded and command time of one run."""
    in_flight: set[tuple[str, int]] = set()
    mine = False
    peak = ran = 0
    work = overhead = 0.0
    for r in ledger.stream(graph_stream(graph_id)):
        ev = r.event
        if isinstance(ev, E.NodeStarted):
            mine = ev.run_id == run_id
            if mine:
                in_flight.add((ev.node, ev.attempt))
                peak = max(peak, len(in_flight))
        elif isinstance(ev, E.NodeDelivered | E.NodeRejected | E.NodeAbandoned):
            key = (ev.node, ev.attempt)
            if key in in_flight:
                in_flight.discard(key)
                if not isinstance(ev, E.NodeAbandoned):
                    ran += 1
                    work += ev.work_s
                    overhead += max(0.0, ev.duration_s - ev.work_s)
    return {"peak_in_flight": peak, "ran": ran, "work_s": work, "overhead_s": overhead}


def main(argv: list[str] | None = None) -> int:
    """Worker process entry point (started by run_graph)."""
    ap = argparse.ArgumentParser(prog="graph-worker")
    ap.add_argument("--home", required=True)
    ap.add_argument("--graph", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--worker", required=True)
    a = ap.parse_args(argv)
    ws = open_workspace(a.home)
    try:
        worker_loop(ws, a.graph, a.run, a.worker)
    finally:
        ws.close()
    return 0


def format_plan(plan: dict[str, list[str]]) -> list[str]:
    return [f"{node}: via {' -> '.join(path)}" if len(path) > 1 else f"{node}: reopened"
            for node, path in plan.items()]


if __name__ == "__main__":
    sys.exit(main())
