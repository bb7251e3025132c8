"""Task Graph state, folded from a graph stream into networkx (read side: never writes).

Contract:
- `load_graph(ledger, graph_id)` folds stream `graph:<id>` into a `GraphView`; `fold(events)`
  is the same over any event sequence (pure).
- Task node states: pending, running, verified, delivered, rejected, needs-rework. A node is
  *ready* when it is pending or needs-rework and every gating in-edge is satisfied: each inbound
  handoff delivered (which happens only after its source's verification passed) and each inbound
  control/start source delivered. State edges never gate. `ready()` lists ready nodes, most
  critical first; `blocked()` says why each other waiting node waits.
- Rework (`rework_plan`) propagates from a node along handoff, state and control/rework edges,
  through repo/system nodes, to every task node that has produced something (running, verified,
  delivered); it stops at nodes that never ran (they will run on the new inputs anyway) and at
  rejected nodes (a rejection is a decision; reopen it explicitly). Each target comes with the
  path that carries the rework.
- A rework of a node voids its handoffs: its consumers wait for the re-delivery, and a reworked
  node also waits for the reworked nodes on the path that carried the rework to it.
- `catch_up(ledger, view)` applies only new events (workers poll with it). The views of a
  `GraphView` (`summary`, `tree_lines`, `to_mermaid`, `to_dot`, `page_markdown`) are in
  `graph_views`.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from ..ledger import codec
from ..ledger import events as E
from ..ledger.graphspec import GATING, REWORK_CARRIERS, EdgeSpec, NodeSpec, edge_id, edge_label
from ..ledger.ids import LEDGER_CONTEXT
from ..ledger.store import Ledger, OnError
from ..ledger.streams import graph_stream
from .errors import ProjectionError

_NODES = TypeAdapter(list[NodeSpec])
_EDGE_KINDS = {"handoff": (None,), "state": (None,), "control": ("start", "stop", "rework")}


@dataclass(frozen=True, slots=True)
class Edge:
    """An edge as the view holds it: EdgeSpec's fields without a pydantic model per edge (a
    large graph holds thousands; building models was most of its fold)."""

    src: str
    dst: str
    kind: str
    action: str | None = None
    deliverable: str = ""
    access: str = "read"

    @property
    def id(self) -> str:
        return edge_id(self.src, self.dst, self.label)

    @property
    def label(self) -> str:
        return edge_label(self.kind, self.action)

    @classmethod
    def of(cls, spec: EdgeSpec) -> Edge:
        return cls(spec.src, spec.dst, spec.kind, spec.action, spec.deliverable, spec.access)

    @classmethod
    def from_dump(cls, d: dict[str, Any]) -> Edge:
        """From a stored EdgeSpec dump (validated when written); the shape is still checked,
        so a corrupt payload fails loudly."""
        try:
            kind, action = d["kind"], d.get("action")
            ok = action in _EDGE_KINDS[kind] and isinstance(d["from"], str) \
                and isinstance(d["to"], str)
        except (KeyError, TypeError):
            ok = False
        if not ok:
            raise ProjectionError(f"corrupt edge in graph definition: {d!r}")
        return cls(d["from"], d["to"], kind, action, d.get("deliverable", ""),
                   d.get("access", "read"))


if TYPE_CHECKING:  # networkx is imported where used: workers poll without paying for it
    import networkx as nx

WAITING = ("pending", "needs-rework")
PRODUCED = ("running", "verified", "delivered")


def node_task_id(graph_id: str, node_id: str) -> str:
    return f"{graph_id}.{node_id}"


@dataclass
class NodeState:
    spec: NodeSpec
    state: str = "pending"  # repo/system nodes: "available"
    attempt: int = 0
    run_id: str | None = None
    worker: str | None = None
    pid: int | None = None
    stale: bool = False  # reworked while running: its delivery will not count
    verified: bool = False
    verdict: bool | None = None  # the current attempt's verification outcome, if any
    verification_event_id: str | None = None
    deliverable_digest: str | None = None
    duration_s: float | None = None
    work_s: float | None = None
    reason: str | None = None  # rejection or rework reason
    evidence: list[str] = field(default_factory=list)
    rework_path: list[str] = field(default_factory=list)
    rework_after: set[str] = field(default_factory=set)  # reworked upstreams to wait for
    reworks: int = 0
    deliveries: int = 0
    rejections: int = 0

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def kind(self) -> str:
        return self.spec.kind


@dataclass
class EdgeState:
    spec: Edge
    delivered: bool = False
    attempt: int = 0
    deliverable_digest: str | None = None
    refused: int = 0
    last_refusal: str | None = None

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass
class RunInfo:
    run_id: str
    jobs: int
    pid: int
    pid_start: str
    host: str
    resumed: bool
    outcome: str | None = None
    started_by: str | None = None  # the person who started it (GraphRunStarted's human actor)


@dataclass
class GraphView:
    graph_id: str = ""
    title: str = ""
    description: str = ""
    source: str | None = None
    graph_dir: str | None = None
    version: int = 0
    nodes: dict[str, NodeState] = field(default_factory=dict)
    edges: dict[str, EdgeState] = field(default_factory=dict)
    runs: list[RunInfo] = field(default_factory=list)
    in_edges: dict[str, list[EdgeState]] = field(default_factory=dict)
    out_edges: dict[str, list[EdgeState]] = field(default_factory=dict)
    _priority: dict[str, float] | None = None

    # --- folding --------------------------------------------------------------------------

    def apply(self, ev: E.Event) -> None:
        self.version += 1
        match ev:
            case E.GraphDefined():
                self.graph_id, self.title = ev.graph_id, ev.title
                self.description, self.source, self.graph_dir = (
                    ev.description, ev.source, ev.graph_dir)
                for spec in _NODES.validate_python(ev.nodes, context=LEDGER_CONTEXT):
                    self._add_node(spec)
                for d in ev.edges:
                    self._add_edge(Edge.from_dump(d))
            case E.NodeAdded():
                self._add_node(NodeSpec.model_validate(ev.node, context=LEDGER_CONTEXT))
            case E.EdgeAdded():
                self._add_edge(Edge.of(EdgeSpec.model_validate(ev.edge, context=LEDGER_CONTEXT)))
            case E.GraphRunStarted():
                self.runs.append(RunInfo(ev.run_id, ev.jobs, ev.pid, ev.pid_start, ev.host,
                                         ev.resumed, started_by=ev.actor.name
                                         if ev.actor.kind == "human" else None))
            case E.GraphRunFinished():
                for r in self.runs:
                    if r.run_id == ev.run_id:
                        r.outcome = ev.outcome
            case E.NodeStarted():
                n = self.nodes[ev.node]
                n.state, n.attempt, n.run_id, n.worker, n.pid = (
                    "running", ev.attempt, ev.run_id, ev.worker, ev.pid)
                n.stale = n.verified = False
                n.verdict = None
            case E.NodeAbandoned():
                n = self.nodes[ev.node]
                if n.state in ("running", "verified") and n.attempt == ev.attempt:
                    n.state = "needs-rework" if (n.reworks or n.stale) else "pending"
                    n.stale = False
            case E.NodeVerified():
                n = self.nodes[ev.node]
                if n.attempt == ev.attempt and n.state == "running":
                    n.verified = n.verdict = ev.passed
                    n.verification_event_id = (
                        str(ev.verification_event_id) if ev.verification_event_id else None)
                    n.deliverable_digest = ev.deliverable_digest
                    if ev.passed:
                        n.state = "verified"
            case E.HandoffDelivered():
                es = self.edges[ev.edge]
                src = self.nodes[ev.src]
                if not src.stale and src.attempt == ev.attempt:
                    es.delivered, es.attempt = True, ev.attempt
                    es.deliverable_digest = ev.deliverable_digest
            case E.HandoffRefused():
                es = self.edges[ev.edge]
                es.refused += 1
                es.last_refusal = ev.reason
            case E.NodeDelivered():
                n = self.nodes[ev.node]
                if n.attempt == ev.attempt:
                    n.duration_s, n.work_s = ev.duration_s, ev.work_s
                    n.deliveries += 1
                    if n.stale:
                        n.state, n.stale = "needs-rework", False
                        self._void_handoffs(n.id)
                    else:
                        n.state, n.reason, n.rework_path = "delivered", None, []
                        n.rework_after = set()
            case E.NodeRejected():
                n = self.nodes[ev.node]
                n.state, n.reason, n.evidence = "rejected", ev.reason, list(ev.evidence)
                n.rejections += 1
                if ev.duration_s:
                    n.duration_s, n.work_s = ev.duration_s, ev.work_s
                self._void_handoffs(n.id)
            case E.ReworkRequested():
                n = self.nodes[ev.node]
                n.reason, n.rework_path = ev.reason, list(ev.path)
                n.rework_after |= {p for p in ev.path[:-1] if p != ev.node}
                n.reworks += 1
                if n.state in ("running", "verified"):
                    n.stale = True
                else:
                    n.state = "needs-rework"
                    n.verified = False
                self._void_handoffs(n.id)
            case _:
                pass

    def _add_node(self, spec: NodeSpec) -> None:
        self.nodes[spec.id] = NodeState(
            spec, state="pending" if spec.kind == "task" else "available")
        self.in_edges.setdefault(spec.id, [])
        self.out_edges.setdefault(spec.id, [])
        self._priority = None

    def _add_edge(self, spec: Edge) -> None:
        es = EdgeState(spec)
        self.edges[es.id] = es
        self.out_edges.setdefault(spec.src, []).append(es)
        self.in_edges.setdefault(spec.dst, []).append(es)
        self._priority = None

    def _void_handoffs(self, node: str) -> None:
        for es in self.out_edges.get(node, ()):
            es.delivered = False

    # --- queries --------------------------------------------------------------------------

    def tasks(self) -> list[NodeState]:
        return [n for n in self.nodes.values() if n.kind == "task"]

    def unmet(self, node: str) -> list[str]:
        """Why `node` cannot start, one line per unmet gate (empty when its gates are met)."""
        out = []
        # A reworked node waits for the reworked task nodes on the path that carried the
        # rework, even over non-gating state edges: it must see their new results.
        for p in sorted(self.nodes[node].rework_after):
            pn = self.nodes[p]
            if pn.kind == "task" and pn.state != "delivered":
                out.append(f"waits for rework of {p} ({pn.state})")
        for es in self.in_edges.get(node, ()):
            if es.spec.label not in GATING:
                continue
            src = self.nodes[es.spec.src]
            if es.spec.kind == "handoff" and es.delivered:
                continue
            if es.spec.kind == "control" and src.state == "delivered":
                continue
            what = f"handoff {es.spec.deliverable or 'deliverable'}" if es.spec.kind == "handoff" \
                else "control/start"
            why = src.state
            if src.state == "rejected":
                why = f"rejected: {src.reason}"
            elif src.state == "needs-rework":
                why = f"needs-rework: {src.reason}"
            elif es.last_refusal and src.state != "running":
                why += f"; last handoff refused: {es.last_refusal}"
            out.append(f"waits for {what} from {src.id} ({why})")
        return out

    def is_ready(self, node: str) -> bool:
        n = self.nodes[node]
        return n.kind == "task" and n.state in WAITING and not self.unmet(node)

    def ready(self) -> list[str]:
        """Ready nodes, highest priority (longest remaining critical path) first."""
        prio = self.priorities()
        ids = [n.id for n in self.tasks() if n.state in WAITING and not self.unmet(n.id)]
        return sorted(ids, key=lambda i: (-prio.get(i, 0.0), i))

    def blocked(self) -> dict[str, list[str]]:
        return {n.id: why for n in self.tasks() if n.state in WAITING
                for why in [self.unmet(n.id)] if why}

    def running(self) -> list[NodeState]:
        return [n for n in self.tasks() if n.state in ("running", "verified")]

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for n in self.tasks():
            c[n.state] = c.get(n.state, 0) + 1
        c["ready"] = len(self.ready())
        return c

    def finished(self) -> bool:
        """Nothing running and nothing ready: done (all delivered) or stuck behind rejections."""
        return not self.running() and not self.ready()

    def weight(self, node: str) -> float:
        n = self.nodes[node]
        if n.kind != "task":
            return 0.0
        return n.duration_s if n.duration_s is not None else n.spec.est_s

    def nx_graph(self) -> nx.MultiDiGraph[str]:
        import networkx as nx

        g: nx.MultiDiGraph[str] = nx.MultiDiGraph()
        for n in self.nodes.values():
            g.add_node(n.id, kind=n.kind, type=n.spec.type, state=n.state)
        for es in self.edges.values():
            g.add_edge(es.spec.src, es.spec.dst, key=es.spec.label, kind=es.spec.kind,
                       label=es.spec.label, delivered=es.delivered)
        return g

    def gating_dag(self) -> nx.DiGraph[str]:
        import networkx as nx

        g: nx.DiGraph[str] = nx.DiGraph()
        g.add_nodes_from(n.id for n in self.tasks())
        g.add_edges_from((es.spec.src, es.spec.dst) for es in self.edges.values()
                         if es.spec.label in GATING)
        return g

    def priorities(self) -> dict[str, float]:
        """Per task node: the heaviest path from it to a sink over gating edges (its own weight
        included) — scheduling this first shortens the makespan."""
        if self._priority is None:
            # Plain Kahn order (no networkx): this runs in every polling worker.
            succ: dict[str, list[str]] = {n.id: [] for n in self.tasks()}
            indeg = dict.fromkeys(succ, 0)
            for es in self.edges.values():
                if es.spec.label in GATING:
                    succ[es.spec.src].append(es.spec.dst)
                    indeg[es.spec.dst] += 1
            order = [n for n, d in indeg.items() if d == 0]
            for n in order:
                for m in succ[n]:
                    indeg[m] -= 1
                    if indeg[m] == 0:
                        order.append(m)
            prio: dict[str, float] = {}
            for n in reversed(order):
                prio[n] = self.weight(n) + max((prio[m] for m in succ[n]), default=0.0)
            self._priority = prio
        return self._priority

    def critical_path(self) -> tuple[list[str], float]:
        """The heaviest chain of task nodes over gating edges (weights: measured durations,
        else est_s) and its total."""
        import networkx as nx

        g = self.gating_dag()
        if not g:
            return [], 0.0
        best: dict[str, tuple[float, str | None]] = {}
        for n in nx.topological_sort(g):
            prev = max(((best[p][0], p) for p in g.predecessors(n)), default=(0.0, None))
            best[n] = (prev[0] + self.weight(n), prev[1])
        end = max(best, key=lambda k: (best[k][0], k))
        total = best[end][0]
        path: list[str] = []
        cur: str | None = end
        while cur is not None:
            path.append(cur)
            cur = best[cur][1]
        return path[::-1], total

    def edge_specs(self) -> list[Edge]:
        return [es.spec for es in self.edges.values()]

    def node_specs(self) -> list[NodeSpec]:
        return [n.spec for n in self.nodes.values()]


def fold(events: Iterable[E.Event]) -> GraphView:
    view = GraphView()
    # Folding allocates many long-lived objects; the cyclic GC's passes over them cost more
    # than the fold itself on large graphs, and nothing here creates reference cycles to reap.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for ev in events:
            view.apply(ev)
    finally:
        if was_enabled:
            gc.enable()
    return view


def load_graph(ledger: Ledger, graph_id: str, on_error: OnError = None) -> GraphView:
    """The graph's view from its stream. An undecodable event raises (naming its position),
    or, given `on_error` (readers such as the wiki), is handed to it and left out."""
    records = ledger.stream(graph_stream(graph_id), on_error=on_error)
    if not records:
        raise ProjectionError(f"unknown graph {graph_id!r} (define it with: forge graph new FILE)")
    return fold(r.event for r in records)


def catch_up(ledger: Ledger, view: GraphView) -> list[E.Event]:
    """Apply the graph stream's events after `view.version` to `view` (in place); returns
    them. Incremental folding gives the same view as a full `load_graph`."""
    stream = graph_stream(view.graph_id)
    # The recorder's `gt` read is the library's own API; Ledger.stream has no "after".
    rows = ledger.recorder.select_events(stream, gt=view.version)
    new = [codec.decode(stream, r.originator_version, r.topic, r.state) for r in rows]
    for ev in new:
        view.apply(ev)
    return new


def list_graphs(ledger: Ledger, on_error: OnError = None) -> list[str]:
    """Defined graphs in definition order (`on_error` as in `Ledger.log`)."""
    return [r.event.graph_id for r in ledger.log(types=[E.GraphDefined.TYPE], on_error=on_error)
            if isinstance(r.event, E.GraphDefined)]


def resolve_graph_id(ledger: Ledger, graph_id: str | None) -> str:
    """The given graph, or the only/latest defined one."""
    if graph_id:
        return graph_id
    ids = list_graphs(ledger)
    if not ids:
        raise ProjectionError("no graph defined yet (forge graph new FILE.yaml)")
    return ids[-1]


# --- rework propagation (pure) --------------------------------------------------------------


def rework_plan(view: GraphView, origin: str, *, include_origin: bool = True
                ) -> dict[str, list[str]]:
    """Task nodes that must re-run when `origin` is reworked, each with the path carrying it.

    BFS along REWORK_CARRIERS edges (through repo/system nodes). A task node is marked when it
    has produced something (running, verified, delivered) or already needs rework; the search
    does not pass nodes that never ran or were rejected (see module contract)."""
    if origin not in view.nodes:
        raise ProjectionError(f"unknown node {origin!r} in graph {view.graph_id!r}")
    plan: dict[str, list[str]] = {}
    if include_origin and view.nodes[origin].kind == "task":
        plan[origin] = [origin]
    seen = {origin}
    queue: deque[tuple[str, list[str]]] = deque([(origin, [origin])])
    while queue:
        cur, path = queue.popleft()
        for es in view.out_edges.get(cur, ()):
            if es.spec.label not in REWORK_CARRIERS:
                continue
            nxt = es.spec.dst
            if nxt in seen:
                continue
            seen.add(nxt)
            n = view.nodes[nxt]
            p = [*path, nxt]
            if n.kind != "task":
                queue.append((nxt, p))
            elif n.state in PRODUCED or n.state == "needs-rework":
                plan[nxt] = p
                queue.append((nxt, p))
    return plan
