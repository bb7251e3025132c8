"""Task graphs on the wiki: one page per graph with a drawing, node states and rejections.

The drawing is a layered SVG (nodes in topological generations of the whole graph, left to
right; boxes coloured by state; handoff edges solid, state edges dashed, control edges thick)
so the static site shows the graph without JavaScript. It is drawn here, not by matplotlib
(as the wiki's plots are): boxes in a fixed layered layout are a few lines of SVG, with every
text escaped by `esc`, and cost nothing per page. The page also carries the Mermaid
source, the node table (state, why blocked, rework path) and the rejected directions with
their evidence. Task nodes link to their task pages when those exist.
"""

from __future__ import annotations

from typing import Any

from ..ledger.errors import LedgerError
from ..ledger.store import Ledger
from ..projections.errors import ProjectionError
from ..projections.graph import list_graphs, load_graph, node_task_id
from ..projections.graph_views import summary, to_mermaid
from .numbers import count
from .page import Page, esc, link, page_name, text
from .pages import task_path

STATE_FILL = {
    "pending": "#eeeeee", "ready": "#fff3bf", "running": "#d0ebff", "verified": "#d3f9d8",
    "delivered": "#b2f2bb", "rejected": "#ffc9c9", "needs-rework": "#ffd8a8",
    "available": "#e5dbff",
}
EDGE_STYLE = {"handoff": 'stroke="#495057"', "state": 'stroke="#868e96" stroke-dasharray="4 3"',
              "control": 'stroke="#c92a2a" stroke-width="2.5"'}
BOX_W, BOX_H, GAP_X, GAP_Y = 170, 34, 60, 14
GRAPH_INDEX = "graphs"  # the index of graphs: outside graphs/, so no graph id can take it


def graph_path(graph_id: str) -> str:
    return f"graphs/{page_name(graph_id)}"


def layout(view: Any) -> dict[str, tuple[float, float]]:
    """Node -> (x, y): repos and systems in the first column, then task nodes in columns by
    topological generation of the gating DAG (definition refuses cycles there)."""
    import networkx as nx  # here: importing the wiki (every forge command) stays fast

    g = view.gating_dag()
    columns = [sorted(n.id for n in view.nodes.values() if n.kind != "task")]
    try:
        columns += [sorted(gen) for gen in nx.topological_generations(g)]
    except nx.NetworkXUnfeasible:
        columns.append(sorted(g.nodes))
    pos: dict[str, tuple[float, float]] = {}
    for col, ids in enumerate(c for c in columns if c):
        for row, nid in enumerate(ids):
            pos[nid] = (10 + col * (BOX_W + GAP_X), 10 + row * (BOX_H + GAP_Y))
    return pos


def drawing_svg(view: Any) -> str:
    pos = layout(view)
    if not pos:
        return ""
    width = max(x for x, _ in pos.values()) + BOX_W + 10
    height = max(y for _, y in pos.values()) + BOX_H + 10
    ready = set(view.ready())
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="11" '
           f'role="img" aria-label="task graph {esc(view.graph_id)}">']
    for e in view.edges.values():
        (x1, y1), (x2, y2) = pos[e.spec.src], pos[e.spec.dst]
        style = EDGE_STYLE.get(e.spec.kind, EDGE_STYLE["handoff"])
        out.append(f'<line x1="{x1 + BOX_W:.0f}" y1="{y1 + BOX_H / 2:.0f}" x2="{x2:.0f}" '
                   f'y2="{y2 + BOX_H / 2:.0f}" {style} fill="none" opacity="0.7"/>')
    for n in view.nodes.values():
        x, y = pos[n.id]
        state = "ready" if n.id in ready and n.state == "pending" else n.state
        fill = STATE_FILL.get(state, "#ffffff")
        rx = 14 if n.kind != "task" else 4
        label = n.id if len(n.id) <= 24 else n.id[:23] + "…"
        sub = f"{n.spec.type or n.kind} · {state}"
        out.append(f'<g><title>{esc(n.id)}: {esc(state)}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="{rx}" '
                   f'fill="{fill}" stroke="#495057"/>'
                   f'<text x="{x + 6:.0f}" y="{y + 14:.0f}">{esc(label)}</text>'
                   f'<text x="{x + 6:.0f}" y="{y + 27:.0f}" fill="#495057" font-size="9">'
                   f'{esc(sub)}</text></g>')
    out.append("</svg>")
    return "".join(out)


def graph_page(view: Any, position: int, known_tasks: set[str]) -> Page:
    data = summary(view)
    p = Page(graph_path(view.graph_id), "graph", f"Task graph {view.graph_id}",
             position=position,
             summary=(f"task graph {view.graph_id}: {view.title} — "
                      f"{count(data['tasks'], 'task')}, {count(data['edges'], 'edge')}"),
             meta={"graph": view.graph_id, "tasks": data["tasks"], "edges": data["edges"],
                   "counts": data["counts"]})
    if view.title:
        p.add("p", view.title)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(data["counts"].items()))
    p.add("p", f"{count(data['tasks'], 'task')}, {count(data['edges'], 'edge')} — {counts}. "
               f"Critical path "
               f"({data['critical_path_s']:.1f} s): " + " → ".join(data["critical_path"]))
    svg = drawing_svg(view)
    if svg:
        p.add("svg", svg)

    def node_ref(nid: str) -> Any:
        tid = node_task_id(view.graph_id, nid)
        return link(task_path(tid), nid) if tid in known_tasks else nid

    p.add("h", "Nodes")
    p.add("table", ["node", "type", "state", "attempt", "why"],
          [(node_ref(r["id"]), r["type"], r["state"], r["attempt"], r["why"])
           for r in data["rows"]])
    rejected = [n for n in view.tasks() if n.state == "rejected"]
    if rejected:
        p.add("h", "Rejected directions")
        p.add("list", [text(node_ref(n.id), f": {n.reason} (evidence: "
                                             f"{', '.join(n.evidence) or 'none'})")
                       for n in rejected])
    p.add("h", "Mermaid source")
    p.add("code", to_mermaid(view))
    return p


def graph_pages(ledger: Ledger, position: int, known_tasks: set[str],
                on_error: Any = None) -> list[Page]:
    """One page per defined graph, plus an index of graphs when there is any. An event the
    ledger cannot decode is left out (handed to `on_error`, default: ignored here, as
    `forge check` lists it): a damaged event never stops the build."""
    def skip(u: Any) -> None:
        if on_error is not None:
            on_error(u)

    pages = []
    for gid in dict.fromkeys(list_graphs(ledger, on_error=skip)):
        try:
            view = load_graph(ledger, gid, on_error=skip)
        except (LedgerError, ProjectionError):
            continue  # nothing decodable left of this graph
        pages.append(graph_page(view, position, known_tasks))
    if pages:
        idx = Page(GRAPH_INDEX, "index", "Task graphs", position=position,
                   summary="index of task graphs")
        idx.add("list", [text(link(p.path, p.meta["graph"]), f" — {p.summary}")
                         for p in pages])
        pages.append(idx)
    return pages
