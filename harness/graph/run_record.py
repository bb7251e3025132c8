"""A graph run as recorded, shared by both backends (`run` for local workers, `ray_backend`
for Ray tasks): `start_run` records its start (closing a dead run, abandoning its in-flight
nodes when resuming, pinning the member repos), `finish_run` its end and its `RunSummary`,
`interrupted` an early stop; `echo_progress` folds new graph events and echoes one line each;
`run_stats` counts a run's attempts, peak in flight and command time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from ...ledger import events as E
from ...ledger.errors import ConflictError
from ...ledger.store import Append, Ledger
from ...ledger.streams import graph_stream
from ...ledger.workspace import Workspace
from ...projections.graph import GraphView, catch_up, load_graph
from ..errors import HarnessError
from ..nodes.identity import local_host
from ..proc import alive, start_time
from ..task import human_actor
from . import lease
from .commands import check_node_streams
from .repos import member_nodes, pin_members
from .work import repo_dir, workdir

Echo = Callable[[str], None]

def quiet(_: str) -> None:
    return None


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


@dataclass
class RunStart:
    """A run as recorded by `start_run`: what each backend needs to drive and finish it."""

    run_id: str
    view: GraphView  # the graph as it was when the run started
    stale: list[str]  # nodes a dead run left in flight, abandoned now and run again
    logs: Path
    t0: float


def start_run(ws: Workspace, graph_id: str, jobs: int, resume: bool, echo: Echo,
              by: E.Actor | None = None) -> RunStart:
    """Record a run's start (GraphRunStarted, after closing a dead run and abandoning its
    in-flight nodes when `resume`), pin the member repos, make the work and log dirs. The
    start's actor is `by`, the person running the graph (default: the OS user)."""
    ledger = ws.ledger
    gstream = graph_stream(graph_id)
    view = load_graph(ledger, graph_id)
    for r in view.runs:
        if r.outcome is None and alive(r.pid, r.pid_start) and r.pid != os.getpid():
            raise HarnessError(f"graph {graph_id!r} is being run by pid {r.pid} (run {r.run_id})"
                               "; wait for it, or stop it and run: forge graph resume")
    # One owner per task stream: a node's stream a standalone task holds is refused before
    # anything is recorded (it was defined after the graph, or before the rule).
    check_node_streams(ws, graph_id, (n.spec for n in view.tasks()))
    stale = view.running()
    if stale and not resume:
        raise HarnessError(
            f"graph {graph_id!r} was interrupted with {len(stale)} node(s) in flight "
            f"({', '.join(n.id for n in stale)}); run: forge graph resume")
    # Where the repo nodes live, checked before anything is recorded.
    repos = [repo_dir(ws, graph_id, n.id, n.spec.path) for n in view.nodes.values()
             if n.kind == "repo" and not n.spec.member]
    members = member_nodes(ws, graph_id, view)  # MonoRepo members, checked now
    run_id = f"run{len(view.runs) + 1}-{uuid4().hex[:6]}"
    me = os.getpid()
    start: list[E.Event] = [E.GraphRunFinished(run_id=r.run_id, outcome="interrupted")
                            for r in view.runs if r.outcome is None]
    start += [E.NodeAbandoned(node=n.id, attempt=n.attempt,
                              reason=f"runner of {n.run_id} died (pid {n.pid} gone); re-run")
              for n in stale]
    # The member repo nodes' worktrees, pinned at the state recorded with the run.
    snapshot_id = pin_members(ws, graph_id, members)
    start.append(E.GraphRunStarted(run_id=run_id, jobs=jobs, pid=me, pid_start=start_time(me),
                                   host=local_host(), resumed=resume,
                                   repo_snapshot=snapshot_id, actor=by or human_actor()))
    try:
        ledger.save(Append(gstream, start, expected_version=view.version),
                    *lease.releases_for(graph_id, start))
    except ConflictError:
        raise HarnessError(f"graph {graph_id!r} changed while starting; try again") from None
    for d in repos:
        d.mkdir(parents=True, exist_ok=True)
    workdir(ws, graph_id).mkdir(parents=True, exist_ok=True)
    logs = ws.home / "graphs" / graph_id / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if stale:
        echo(f"resuming {graph_id}: re-running {', '.join(n.id for n in stale)}")
    return RunStart(run_id, view, [n.id for n in stale], logs, time.monotonic())


def finish_run(ws: Workspace, graph_id: str, rs: RunStart, jobs: int, failed: bool,
               unschedulable: dict[str, list[str]] | None = None) -> RunSummary:
    """Record the run's end (GraphRunFinished: completed, failed or stuck) and summarize it.
    `unschedulable`: nodes a backend could not place, with why (reported as blocked)."""
    wall = time.monotonic() - rs.t0
    final = load_graph(ws.ledger, graph_id)
    # Completed: every task delivered or rejected (a rejected direction is a result too).
    done = all(n.state in ("delivered", "rejected") for n in final.tasks())
    outcome = "completed" if done else ("failed" if failed else "stuck")
    counts = final.counts()
    ws.ledger.append(graph_stream(graph_id), [E.GraphRunFinished(
        run_id=rs.run_id, outcome=outcome, counts=counts, wall_s=round(wall, 3))],
        command_id=f"{graph_id}:{rs.run_id}:finished")
    stats = run_stats(ws.ledger, graph_id, rs.run_id)
    overhead = stats["overhead_s"] / stats["ran"] if stats["ran"] else 0.0
    path, _ = final.critical_path()
    return RunSummary(graph_id, rs.run_id, jobs, outcome, round(wall, 3), counts, stats["ran"],
                      stats["peak_in_flight"], round(stats["work_s"], 3),
                      round(max(0.0, overhead), 4), rs.stale,
                      {**final.blocked(), **(unschedulable or {})}, path)


def interrupted(ws: Workspace, graph_id: str, rs: RunStart) -> None:
    """Record that the run stopped early (the runner was interrupted or failed)."""
    ws.ledger.append(graph_stream(graph_id), [E.GraphRunFinished(
        run_id=rs.run_id, outcome="interrupted", wall_s=round(time.monotonic() - rs.t0, 3))])


def echo_progress(ledger: Ledger, live: GraphView, t0: float, echo: Echo) -> None:
    """Fold the graph's new events into `live` and echo a progress line for each."""
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
