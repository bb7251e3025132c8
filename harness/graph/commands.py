"""Graph commands: define and evolve a graph, request rework, invalidate, reject, and the
handoff gate (`handoff_events`, `hand_off`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.errors import ConflictError
from ...ledger.graphspec import (
    NodeSpec,
    check_graph,
    load_graph_spec,
    parse_edge,
    parse_node,
)
from ...ledger.streams import graph_stream
from ...ledger.workspace import Workspace
from ...projections.graph import (
    GraphView,
    load_graph,
    node_task_id,
    rework_plan,
)
from ..errors import HarnessError
from ..loop.define import GRAPH_RUNNER, check_owner

ACTOR = GRAPH_RUNNER


def check_node_streams(ws: Workspace, graph_id: str, nodes: Iterable[NodeSpec]) -> None:
    """Refuse a graph whose task node's stream `<graph>.<node>` a standalone task holds
    (`check_owner`: one owner per task stream; the graph never takes one over)."""
    for n in nodes:
        if n.kind == "task":
            check_owner(ws, node_task_id(graph_id, n.id), graph_node=(graph_id, n.id))

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
    check_node_streams(ws, spec.name, spec.nodes)
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
    check_node_streams(ws, graph_id, [node])
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

def format_plan(plan: dict[str, list[str]]) -> list[str]:
    return [f"{node}: via {' -> '.join(path)}" if len(path) > 1 else f"{node}: reopened"
            for node, path in plan.items()]
