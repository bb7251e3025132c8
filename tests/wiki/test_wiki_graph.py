"""The task graph drawn on the wiki."""

from __future__ import annotations

import yaml
from infer_forge.harness.graph.commands import define_graph, invalidate
from infer_forge.wiki.build import build
from infer_forge.wiki.lint import lint

WORK = {"sh": "true", "verify": [{"name": "ok", "sh": "true"}]}


def _graph_file(tmp_path):
    data = {
        "name": "mini",
        "title": "a three-task chain with a shared repo",
        "nodes": [
            {"id": "repo-x", "kind": "repo", "path": "."},
            {"id": "kern", "type": "kernel", "work": WORK},
            {"id": "integrate", "type": "engine-integration", "work": WORK},
            {"id": "evaluate", "type": "evaluation", "work": WORK},
        ],
        "edges": [
            {"from": "kern", "to": "integrate", "kind": "handoff"},
            {"from": "integrate", "to": "evaluate", "kind": "handoff"},
            {"from": "repo-x", "to": "kern", "kind": "state"},
        ],
    }
    p = tmp_path / "mini.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_graph_page_draws_nodes_in_dependency_order_and_links_resolve(workspace, tmp_path):
    define_graph(workspace, _graph_file(tmp_path))
    report = build(workspace, embeddings=False)
    page = workspace.home / "site" / "graphs" / "mini.html"
    assert page.is_file(), report
    html = page.read_text()
    assert "<svg" in html and "task graph mini" in html
    # Layered left to right along the handoff chain: the repo, then kern, integrate, evaluate.
    xs = {}
    for nid in ("repo-x", "kern", "integrate", "evaluate"):
        i = html.index(f"<title>{nid}:")
        xs[nid] = float(html[html.index('x="', i) + 3:].split('"', 1)[0])
    assert xs["repo-x"] < xs["kern"] < xs["integrate"] < xs["evaluate"]
    assert "pending" in html and "ready" in html  # kern is ready, the others wait
    md = (workspace.home / "wiki" / "graphs" / "mini.md").read_text()
    assert "flowchart LR" in md  # the Mermaid source travels with the page
    home = (workspace.home / "wiki" / "index.md").read_text()
    assert "[[graphs/mini|mini]]" in home
    report = lint(workspace)
    assert report.ok, report.as_dict()


def test_graph_page_is_rebuilt_when_the_graph_moves(workspace, tmp_path):
    define_graph(workspace, _graph_file(tmp_path))
    first = build(workspace, embeddings=False)
    invalidate(workspace, "mini", "kern", reason="planted invalidation")
    second = build(workspace, embeddings=False)
    assert second.position > first.position and second.written >= 1
