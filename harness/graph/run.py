"""`run_graph`: record the run, start worker processes, watch them (respawn a dead one, mark
its nodes abandoned), echo progress, and summarize the run. `backend="ray"` hands the same
run to `ray_backend` (ready nodes as Ray tasks); both start and finish a run through
`run_record` (`start_run` / `finish_run`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ...ledger import events as E
from ...ledger.store import Append
from ...ledger.streams import graph_stream
from ...ledger.workspace import Workspace
from ...projections.graph import load_graph
from ..errors import HarnessError
from ..proc import die_with_parent
from . import lease
from .ray_backend import run_graph_ray
from .run_record import (
    Echo,
    RunSummary,
    echo_progress,
    finish_run,
    interrupted,
    quiet,
    start_run,
)


def run_graph(ws: Workspace, graph_id: str, *, jobs: int | None = None, resume: bool = False,
              echo: Echo = quiet, poll_s: float = 0.05, max_respawns: int | None = None,
              backend: str = "local", address: str | None = None,
              by: E.Actor | None = None) -> RunSummary:
    """Run the graph's ready nodes until nothing more can run: in `jobs` worker processes
    (backend "local"), or as Ray tasks on the cluster at `address` (backend "ray", see
    `ray_backend`; `jobs` bounds the tasks in flight). `by`: the person running it, the
    actor of the run's start (default: the OS user); node claims name them."""
    if backend == "ray":
        return run_graph_ray(ws, graph_id, jobs=jobs, resume=resume, echo=echo,
                             address=address, by=by)
    if backend != "local":
        raise HarnessError(f"backend {backend!r}: use local or ray")
    if address is not None:
        raise HarnessError("--address is for --backend ray (the local backend has no cluster)")
    jobs = max(1, jobs or os.cpu_count() or 1)
    ledger = ws.ledger
    gstream = graph_stream(graph_id)
    rs = start_run(ws, graph_id, jobs, resume, echo, by)
    view, run_id, logs, t0 = rs.view, rs.run_id, rs.logs, rs.t0
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
            [sys.executable, "-m", "infer_forge.harness.graph.worker", "--home", str(ws.home),
             "--graph", graph_id, "--run", run_id, "--worker", name],
            stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent())
        log.close()

    for i in range(n_workers):
        spawn(f"w{i + 1}")
    live = load_graph(ledger, graph_id)
    failed = False
    try:
        while procs:
            time.sleep(poll_s)
            echo_progress(ledger, live, t0, echo)
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
                    gone: list[E.Event] = [E.NodeAbandoned(
                        node=n.id, attempt=n.attempt, reason=f"worker {name} died (exit {rc})")
                        for n in orphans]
                    ledger.save(Append(gstream, gone), *lease.releases_for(graph_id, gone))
                if respawns_left > 0:
                    respawns_left -= 1
                    spawn(f"{name.split('.')[0]}.{spawned}")
                else:
                    failed = True
        echo_progress(ledger, live, t0, echo)
    except BaseException:
        for p in procs.values():
            p.kill()
        interrupted(ws, graph_id, rs)
        raise
    return finish_run(ws, graph_id, rs, jobs, failed)
