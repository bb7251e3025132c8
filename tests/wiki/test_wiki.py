"""The journal wiki: pages, links, lint, freshness, determinism, related pages, retrieve,
optional narrative."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from infer_forge.cli import wiki_post
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream
from infer_forge.wiki import build as B
from infer_forge.wiki import lint as L
from infer_forge.wiki.page import parse_frontmatter
from infer_forge.wiki.retrieve import Retriever, retrieve

from tests.conftest import run_forge
from tests.helpers.index_ledger import build as build_ledger


@pytest.fixture
def ws(workspace):
    out = build_ledger(workspace)
    workspace.planted = out
    return workspace


def pages_of(home: Path) -> dict[str, str]:
    root = home / "wiki"
    return {f.relative_to(root).with_suffix("").as_posix(): f.read_text()
            for f in sorted(root.rglob("*.md"))}


def test_pages_links_frontmatter_and_site(ws):
    rep = B.build(ws, embeddings=False)
    pages = pages_of(ws.home)
    kinds: dict[str, int] = {}
    for name, text in pages.items():
        fm = parse_frontmatter(text)
        assert fm["type"] and isinstance(fm["ledger_position"], int), name
        kinds[fm["type"]] = kinds.get(fm["type"], 0) + 1
    # The build compiled the concept pages first (8 and their catalog; SCHEMA.md with them).
    assert kinds == {"task": 4, "decision": 3, "point": 4, "profile": 4, "model": 2,
                     "dimension": 8, "index": 3, "log": 1, "concurrency": 1, "concept": 8,
                     "concepts": 1, "schema": 1, "compare": 3, "history": 3}
    # index: home, compare and history (test_wiki_views.py)
    assert rep.pages == len(pages) - 1 == 45 and rep.concepts == 8
    task = pages["tasks/deepgemm-moe-h20"]
    fm = parse_frontmatter(task)
    assert fm["accelerator"] == "H20" and fm["exit_state"] == "failed-no-progress"
    assert fm["ledger_position"] == max(
        r.position for r in ws.ledger.stream_log(task_stream("deepgemm-moe-h20")))
    assert "| b2 | fail | correctness | token_match | fail | 0.61 | 0.99 |" in task
    dec_id = ws.planted["decisions"]["deepgemm-moe-h20"]
    dec = pages[f"decisions/deepgemm-moe-h20-rejected-{dec_id}"]
    assert "token match 0.61 < 0.99" in dec and "VerificationRecorded at ledger position" in dec
    assert "[[tasks/deepgemm-moe-h20|deepgemm-moe-h20]]" in dec
    log = pages["log"]
    order = [int(m) for m in re.findall(r"^- (\d+): ", log, re.M)]
    assert order == sorted(order) and len(order) >= 4 + 4 + 3 + 3 + 4
    # Every wiki link resolves, in markdown and in HTML.
    rep = L.lint(ws)
    assert rep.ok and rep.links > 100 and not rep.stale, rep.as_dict()
    site = ws.home / "site"
    for html in site.rglob("*.html"):
        for href in re.findall(r'href="([^"#?]+\.html)"', html.read_text()):
            assert (html.parent / href).resolve().is_file(), (html, href)
    assert "<svg" in (site / "profiles" / "qwen-h200-r1.html").read_text()
    entries = json.loads((site / "search.json").read_text())
    assert {e["u"] for e in entries} >= {"tasks/deepgemm-moe-h20.html", "index.html"}


def test_lint_catches_planted_broken_link_and_orphan(ws):
    B.build(ws, embeddings=False)
    page = ws.home / "wiki" / "tasks" / "tune-tiny-cpu.md"
    page.write_text(page.read_text().replace(
        "## Deployment point", "See [[decisions/no-such-decision|this]].\n\n## Deployment point"))
    (ws.home / "wiki" / "tasks" / "lonely.md").write_text("---\ntype: task\n---\n# lonely\n")
    rep = L.lint(ws)
    assert rep.broken == [{"page": "tasks/tune-tiny-cpu", "target": "decisions/no-such-decision"}]
    assert rep.orphans == ["tasks/lonely"]
    r = run_forge("wiki", "lint", home=ws.home)
    assert r.returncode == 1
    assert "broken link: tasks/tune-tiny-cpu -> decisions/no-such-decision" in r.stdout
    assert "orphan: tasks/lonely" in r.stdout


def test_freshness_and_determinism(ws):
    first = B.build(ws, embeddings=False)
    assert first.written == first.pages
    assert B.build(ws, embeddings=False).fresh  # same position: nothing to do
    before = pages_of(ws.home)
    ws.ledger.append(task_stream("tune-tiny-cpu"), [
        E.TaskReopened(reason="retry with bfloat16", task_id="tune-tiny-cpu")])
    assert L.lint(ws).stale  # the ledger moved past the wiki
    rep = B.build(ws, embeddings=False)
    assert not rep.fresh and 0 < rep.written < rep.pages and rep.unchanged > 0
    after = pages_of(ws.home)
    changed = {n for n in after if after[n] != before.get(n)}
    assert "tasks/tune-tiny-cpu" in changed and "tasks/tune-qwen-h200" not in changed
    fm = parse_frontmatter(after["tasks/tune-tiny-cpu"])
    reopened = ws.ledger.stream_log(task_stream("tune-tiny-cpu"))[-1].position
    assert fm["ledger_position"] == reopened and fm["exit_state"] is None
    assert not L.lint(ws).stale
    # Deterministic: a forced rebuild from scratch gives byte-identical pages.
    for f in (ws.home / "wiki").rglob("*.md"):
        f.unlink()
    B.build(ws, embeddings=False, force=True)
    assert pages_of(ws.home) == after


@pytest.mark.slow  # loads the embedding model in-process and in a CLI subprocess
def test_related_pages_and_retrieve(ws):
    B.build(ws)  # with embeddings (the offline all-MiniLM-L6-v2 package)
    task = pages_of(ws.home)["tasks/deepgemm-moe-h20"]
    related = task.split("## Related", 1)[1].split("## Backlinks", 1)[0]
    first = re.findall(r"\[\[([^\]\\|]+)", related)[0]
    assert first.startswith("decisions/deepgemm-moe-h20-rejected-")
    r = retrieve(ws, "why was the DeepGEMM MoE runner rejected on H20?", k=3)
    dec_id = ws.planted["decisions"]["deepgemm-moe-h20"]
    assert dec_id in [x["id"] for x in r["results"]]
    assert all(x["task_id"] == "deepgemm-moe-h20" for x in r["results"])
    # The build cached every vector the retriever needs: only the query is embedded.
    retr = Retriever.from_index(ws)
    assert len(retr.docs) == 3 + 9 + 4  # decisions + handoffs + task goals
    r = retrieve(ws, "continuous batching hurt throughput on CPU", k=1, kinds=("decision",))
    assert r["results"][0]["task_id"] == "tune-tiny-cpu"
    cli = run_forge("retrieve", "accepted chunked prefill on H200", "-k", "1", "--json",
                    home=ws.home)
    assert cli.returncode == 0, cli.stderr
    top = json.loads(cli.stdout)["results"][0]
    assert top["task_id"] == "tune-qwen-h200"


class _Chat(BaseHTTPRequestHandler):
    """The OpenAI chat-completions shape (as an SGLang server answers it)."""

    seen: list[dict] = []

    def log_message(self, *a):
        return

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Chat.seen.append(body)
        out = json.dumps({"id": "c1", "object": "chat.completion", "model": body["model"],
                          "choices": [{"index": 0, "finish_reason": "stop", "message": {
                              "role": "assistant", "content": "The candidate was measured "
                              "three times and the correctness gate decided."}}],
                          "usage": {"prompt_tokens": 10, "completion_tokens": 9}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def test_optional_narrative(ws):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        s = B.WikiSettings(embeddings=False, narrative_url=url, narrative_model="qwen")
        rep = B.build(ws, settings=s, post=wiki_post)
        assert rep.narrative == {"asked": 7, "cached": 0, "failed": 0}  # tasks + decisions
        assert _Chat.seen[0]["model"] == "qwen" and "deepgemm" in json.dumps(_Chat.seen)
        page = pages_of(ws.home)["tasks/deepgemm-moe-h20"]
        assert "## Narrative\n\nThe candidate was measured three times" in page
        rep = B.build(ws, settings=s, force=True, post=wiki_post)
        assert rep.narrative["cached"] == 7 and rep.narrative["asked"] == 0
    finally:
        srv.shutdown()
        srv.server_close()
    # Endpoint gone: pages stay complete, one failed attempt is reported.
    (ws.home / "wiki" / "_narrative.json").unlink()
    rep = B.build(ws, settings=s, force=True, post=wiki_post)
    assert rep.narrative["failed"] == 1 and rep.pages == 45
    assert "## Narrative" not in pages_of(ws.home)["tasks/deepgemm-moe-h20"]
    assert L.lint(ws).ok
