"""The graph worker process (`python -m infer_forge.harness.graph.worker`, started by
`run_graph`): claims ready nodes by appending NodeStarted with the graph stream's expected
version, and runs them until nothing is ready or in flight in its run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from ...ledger import events as E
from ...ledger.errors import ConflictError
from ...ledger.store import Append
from ...ledger.streams import CLAIMS_STREAM, graph_stream
from ...ledger.workspace import Workspace, open_workspace
from ...projections.graph import (
    GraphView,
    catch_up,
    load_graph,
    node_task_id,
)
from . import lease
from .commands import ACTOR
from .work import NodeContext, execute_node


def claim_node(ws: Workspace, view: GraphView, node: str, run_id: str, worker: str,
               before: Sequence[E.Event] = ()) -> int | None:
    """Claim `node`'s next attempt for `worker`: NodeStarted appended (after `before`, in the
    same save) with the graph stream's version `view` was folded at. Returns the attempt, or
    None when the stream moved since (re-read and decide again). The command id is
    deterministic (graph, node, attempt, run, worker): a retried save adds nothing."""
    graph_id = view.graph_id
    attempt = view.nodes[node].attempt + 1
    run = next((r for r in view.runs if r.run_id == run_id), None)
    claim = E.NodeStarted(node=node, attempt=attempt, run_id=run_id, worker=worker,
                          pid=os.getpid(), task_id=node_task_id(graph_id, node),
                          actor=ACTOR, on_behalf_of=run.started_by if run else None,
                          input_digests={es.spec.src: es.deliverable_digest or ""
                                         for es in view.in_edges.get(node, ())
                                         if es.spec.kind == "handoff"})
    try:
        # The node's claim in the Node Registry (and the release of any attempt `before`
        # abandons) in the same save.
        ws.ledger.save(
            Append(graph_stream(graph_id), [*before, claim], expected_version=view.version),
            Append(CLAIMS_STREAM, [*lease.release_events(graph_id, before),
                                   lease.claim_event(graph_id, node, attempt, run_id, worker,
                                                     claim.task_id or "")]),
            command_id=f"{graph_id}:{node}:a{attempt}:start:{run_id}:{worker}")
    except ConflictError:
        return None
    return attempt


def worker_loop(ws: Workspace, graph_id: str, run_id: str, worker: str,
                poll_s: float = 0.03) -> int:
    """Claim and run ready nodes until nothing is ready or in flight in this run.
    Returns how many nodes this worker ran."""
    ran = 0
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
        attempt = claim_node(ws, view, node, run_id, worker)
        if attempt is None:
            continue
        catch_up(ws.ledger, view)
        execute_node(NodeContext(ws, view, node, attempt, run_id, worker))
        ran += 1


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

if __name__ == "__main__":
    sys.exit(main())
