"""Views of a Task Graph (pure functions of a `GraphView`, see `graph`): `summary` (JSON, with
`table_rows`), `tree_lines` (the gating DAG as an indented tree), `to_mermaid` and `to_dot`
(drawings, nodes coloured by state), and `page_markdown`, the graph's journal page.
"""

from __future__ import annotations

from typing import Any

from .graph import GraphView


def table_rows(view: GraphView) -> list[dict[str, Any]]:
    blocked = view.blocked()
    ready = set(view.ready())
    rows = []
    for n in view.nodes.values():
        rows.append({
            "id": n.id,
            "kind": n.kind,
            "type": n.spec.type or n.kind,
            "state": n.state,
            "ready": n.id in ready,
            "attempt": n.attempt,
            "duration_s": n.duration_s,
            "why": "; ".join(blocked.get(n.id, [])) or n.reason or "",
            "rework_path": n.rework_path,
            "evidence": n.evidence,
        })
    return rows


def summary(view: GraphView) -> dict[str, Any]:
    path, total = view.critical_path()
    return {
        "graph": view.graph_id,
        "title": view.title,
        "version": view.version,
        "nodes": len(view.nodes),
        "tasks": len(view.tasks()),
        "edges": len(view.edges),
        "counts": view.counts(),
        "ready": view.ready(),
        "blocked": view.blocked(),
        "critical_path": path,
        "critical_path_s": round(total, 3),
        "rows": table_rows(view),
    }


def tree_lines(view: GraphView) -> list[str]:
    """The gating DAG as an indented tree from its roots; a node reached again is a reference."""
    g = view.gating_dag()
    lines: list[str] = []
    shown: set[str] = set()

    def label(nid: str) -> str:
        n = view.nodes[nid]
        return f"{nid} [{n.spec.type}] {n.state}"

    def walk(nid: str, depth: int) -> None:
        pad = "  " * depth + ("└─ " if depth else "")
        if nid in shown:
            lines.append(f"{pad}{nid} (see above)")
            return
        shown.add(nid)
        lines.append(pad + label(nid))
        for s in sorted(g.successors(nid)):
            walk(s, depth + 1)

    for root in sorted(n for n in g if g.in_degree(n) == 0):
        walk(root, 0)
    others = [n for n in view.nodes.values() if n.kind != "task"]
    for n in others:
        users = sorted({es.spec.dst for es in view.out_edges[n.id]}
                       | {es.spec.src for es in view.in_edges[n.id]})
        lines.append(f"{n.kind}:{n.id} — state shared with {', '.join(users) or 'nobody'}")
    return lines


_STATE_STYLE = {
    "pending": ("#eeeeee", "#999999"),
    "ready": ("#fff7cc", "#c9a400"),
    "running": ("#cfe8ff", "#1f6fbf"),
    "verified": ("#d9f2d9", "#3c8c3c"),
    "delivered": ("#a8e0a8", "#2d6e2d"),
    "rejected": ("#f6c6c6", "#a33030"),
    "needs-rework": ("#ffd8a8", "#b3600b"),
    "available": ("#e8e0f5", "#6a4c9c"),
}


def _mid(nid: str) -> str:
    return "n_" + nid.replace("-", "_")


def _mermaid_text(text: str) -> str:
    """A label inside `"…"` in Mermaid: one line, no quote, no markup (Mermaid entity codes)."""
    text = " ".join(str(text).splitlines())
    return "".join({"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "[": "#91;",
                    "]": "#93;", "|": "#124;"}.get(c, c) for c in text)


def _dot_text(text: object) -> str:
    """A double-quoted DOT string: backslashes and quotes escaped, one line."""
    return " ".join(str(text).splitlines()).replace("\\", "\\\\").replace('"', '\\"')


def to_mermaid(view: GraphView) -> str:
    ready = set(view.ready())
    lines = ["flowchart LR"]
    for n in view.nodes.values():
        st = "ready" if n.id in ready and n.state == "pending" else n.state
        if n.kind == "task":
            lines.append(f'  {_mid(n.id)}["{n.id}<br/><small>{n.spec.type} · {st}</small>"]')
        elif n.kind == "repo":
            lines.append(f'  {_mid(n.id)}[("{n.id}<br/><small>repo</small>")]')
        else:
            lines.append(f'  {_mid(n.id)}{{{{"{n.id}<br/><small>system</small>"}}}}')
        lines.append(f"  class {_mid(n.id)} st_{st.replace('-', '_')}")
    for es in view.edges.values():
        a, b = _mid(es.spec.src), _mid(es.spec.dst)
        if es.spec.kind == "handoff":
            lab = _mermaid_text(es.spec.deliverable or "handoff")
            lines.append(f'  {a} -->|"{lab}"| {b}')
        elif es.spec.kind == "state":
            lines.append(f'  {a} -.->|"{es.spec.access}"| {b}')
        else:
            lines.append(f'  {a} ==>|"{es.spec.action}"| {b}')
    for st, (fill, stroke) in _STATE_STYLE.items():
        lines.append(f"  classDef st_{st.replace('-', '_')} fill:{fill},stroke:{stroke}")
    return "\n".join(lines) + "\n"


def to_dot(view: GraphView) -> str:
    ready = set(view.ready())
    lines = [f'digraph "{view.graph_id}" {{', "  rankdir=LR;", "  node [fontname=Helvetica];"]
    for n in view.nodes.values():
        st = "ready" if n.id in ready and n.state == "pending" else n.state
        fill, stroke = _STATE_STYLE.get(st, ("#ffffff", "#000000"))
        shape = {"task": "box", "repo": "cylinder", "system": "hexagon"}[n.kind]
        sub = f"{n.spec.type} · {st}" if n.kind == "task" else n.kind
        lines.append(f'  "{n.id}" [shape={shape}, style="filled,rounded", fillcolor="{fill}", '
                     f'color="{stroke}", label="{n.id}\\n{sub}"];')
    for es in view.edges.values():
        style = {"handoff": "solid", "state": "dashed", "control": "bold"}[es.spec.kind]
        lab = (es.spec.deliverable or "handoff") if es.spec.kind == "handoff" else (
            es.spec.access if es.spec.kind == "state" else es.spec.action)
        lines.append(f'  "{es.spec.src}" -> "{es.spec.dst}" [style={style}, '
                     f'label="{_dot_text(lab)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def page_markdown(view: GraphView) -> str:
    """A journal page for the graph (for the wiki): counts, the Mermaid drawing, every node with
    its state and reason, rejected directions with their evidence, and the critical path."""
    data = summary(view)
    lines = [f"# Task graph: {view.graph_id}", ""]
    if view.title:
        lines += [view.title, ""]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(data["counts"].items()))
    lines += [f"{data['tasks']} tasks, {data['edges']} edges — {counts}.", "",
              "```mermaid", to_mermaid(view).rstrip(), "```", "",
              "| node | type | state | attempt | why |", "|---|---|---|---|---|"]
    for r in data["rows"]:
        why = str(r["why"]).replace("|", "\\|")
        lines.append(f"| {r['id']} | {r['type']} | {r['state']} | {r['attempt']} | {why} |")
    rejected = [n for n in view.tasks() if n.state == "rejected"]
    if rejected:
        lines += ["", "## Rejected directions", ""]
        lines += [f"- **{n.id}**: {n.reason} (evidence: {', '.join(n.evidence) or 'none'})"
                  for n in rejected]
    lines += ["", f"Critical path ({data['critical_path_s']:.1f} s): "
              + " → ".join(data["critical_path"]), ""]
    return "\n".join(lines)
