"""A graph node's attempt as a Node Registry claim: the worker's claim on a node (NodeStarted)
is saved with a `ResourceClaimed` whose holder is the worker process (pid and start time, the
graph, node and run), renewed by heartbeats while the node runs (`claims.Lease`), and released
in the same save as the node's conclusion (or its abandonment by the runner). So `forge nodes
claims` shows every node in flight with its holder, and the stale-claim rule applies to a
worker that vanished.

Graph node claims name no GPUs or ports: a node's resources are requested from its backend
(the Ray backend asks Ray for its deployment point's GPUs); the claim is the lease on the
node's work.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ...ledger import events as E
from ...ledger.store import Append
from ...ledger.streams import CLAIMS_STREAM
from ..nodes.claims import Lease, this_process

HEARTBEAT_S = 10.0


def node_claim_id(graph_id: str, node: str, attempt: int) -> str:
    """The claim of one attempt of a node."""
    return f"node:{graph_id}.{node}.a{attempt}"


def claim_event(graph_id: str, node: str, attempt: int, run_id: str, worker: str,
                task_id: str) -> E.ResourceClaimed:
    """The claim saved with NodeStarted (no expected version: it names no shared resource,
    and the graph stream's version already makes the node's claim exclusive)."""
    return E.ResourceClaimed(
        claim_id=node_claim_id(graph_id, node, attempt), resources=(),
        holder=this_process(task=task_id, graph=graph_id, node=node, run_id=run_id),
        heartbeat_s=HEARTBEAT_S, purpose=f"graph {graph_id} node {node} attempt {attempt} "
        f"({worker})", task_id=task_id)


def release_events(graph_id: str, events: Sequence[E.Event]) -> list[E.Event]:
    """The releases of the attempts that graph `events` end (delivered, rejected, abandoned).
    Releasing a claim that is not active (already released, cleaned up, or never made)
    changes nothing in the fold."""
    out: list[E.Event] = []
    for ev in events:
        if isinstance(ev, E.NodeDelivered | E.NodeRejected | E.NodeAbandoned):
            why = ("delivered" if isinstance(ev, E.NodeDelivered) else
                   "rejected" if isinstance(ev, E.NodeRejected) else f"abandoned: {ev.reason}")
            out.append(E.ClaimReleased(claim_id=node_claim_id(graph_id, ev.node, ev.attempt),
                                       reason=why[:500]))
    return out


def releases_for(graph_id: str, events: Sequence[E.Event]) -> list[Append]:
    """`release_events` as the claims-stream append to save with the graph events (one
    append per stream per save: two would claim the same versions)."""
    out = release_events(graph_id, events)
    return [Append(CLAIMS_STREAM, out)] if out else []


def lease(home: str | os.PathLike[str], graph_id: str, node: str, attempt: int) -> Lease:
    """Heartbeats for the node's claim while its work runs (a thread, its own connection)."""
    return Lease(str(home), node_claim_id(graph_id, node, attempt), HEARTBEAT_S)
