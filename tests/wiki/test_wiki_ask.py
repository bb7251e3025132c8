"""`forge wiki ask`: answers from the journal with citations, on the demo's ledger (the demo
task run by the real loop with the scripted numbers of tests/e2e/test_demo.py): the extractive
answer cites the rejection event, from the index alone and through the compiled concept
catalog; `--file` and a build put the answer on the site; a model tier behind a scripted
OpenAI-protocol server has its invented figure and its bad event id dropped; the MCP tool
answers over the real MCP protocol."""

from __future__ import annotations

import asyncio
import json

import pytest
from infer_forge.cli import wiki_post
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace, open_workspace
from infer_forge.wiki import lint as L
from infer_forge.wiki.ask import ask, terms
from infer_forge.wiki.concepts.compiler import compile_wiki
from infer_forge.wiki.errors import WikiError

from tests.conftest import run_forge
from tests.e2e.test_demo import ScriptedEvaluator, _scripted_demo

QUESTION = "why was bfloat16 rejected?"


def _demo(ws) -> dict[str, str]:
    """Run the demo task with scripted numbers; the ids of its rejection (of bfloat16) and
    of the verification behind it."""
    _scripted_demo(ws, ScriptedEvaluator())
    evs = [r.event for r in ws.ledger.stream(task_stream("demo-tune-tiny-cpu"))]
    [rej] = [e for e in evs if type(e).__name__ == "DirectionRejected"]
    assert rej.candidate["engine.dtype"] == "bfloat16"
    return {"rejection": str(rej.event_id), "verification": str(rej.evidence[0])}


@pytest.fixture
def demo(workspace):
    return workspace, _demo(workspace)


def test_terms_stem_and_drop_common_words():
    assert terms("Why was bfloat16 rejected on the H200?") == {"bfloat16", "reject", "h200"}
    assert terms("--enable-dp-attention rejections") == {"enable", "dp", "attent", "reject"}


def test_ask_on_the_demo_cites_the_rejection_from_the_index(demo):
    ws, ids = demo
    a = ask(ws, QUESTION, embeddings=False)
    assert a.mode == "extractive" and a.route == ["index"]
    first = a.claims[0]
    assert "bfloat16" in first.text and first.text.startswith("Rejected")
    cited = {c.event_id: c for c in first.citations}
    assert cited[ids["rejection"]].type == "DirectionRejected"
    assert cited[ids["rejection"]].page.startswith("decisions/demo-tune-tiny-cpu-rejected-")
    assert ids["verification"] in cited
    # Every claim is cited with events the ledger holds.
    held = {str(r.event.event_id) for r in ws.ledger.log()}
    assert all(c.citations and {x.event_id for x in c.citations} <= held for c in a.claims)
    # Nothing matches: no claim, and the answer says so.
    none = ask(ws, "zebra unicorn", embeddings=False)
    assert none.claims == [] and "nothing" in none.text()
    with pytest.raises(WikiError, match="no word to look for"):
        ask(ws, "why was it?", embeddings=False)


def test_ask_on_the_hand_built_ledger(workspace):
    from tests.helpers.index_ledger import build as build_ledger

    ids = build_ledger(workspace)
    a = ask(workspace, "why was the DeepGEMM MoE path rejected on H20?", embeddings=False)
    first = a.claims[0]
    assert "DeepGEMM" in first.text and "deepgemm-moe-h20" in first.text
    assert ids["decisions"]["deepgemm-moe-h20"] in {c.event_id for c in first.citations}


def test_ask_falls_back_to_retrieval_when_no_word_matches(workspace):
    from tests.helpers.index_ledger import build as build_ledger

    build_ledger(workspace)
    a = ask(workspace, "numerical precision drift")  # no word of it is in the record
    assert a.route == ["index", "retrieval"] and a.claims
    held = {str(r.event.event_id) for r in workspace.ledger.log()}
    for c in a.claims:
        assert c.source == "retrieval" and c.score >= 0.2
        assert c.citations and {x.event_id for x in c.citations} <= held
    assert ask(workspace, "numerical precision drift", embeddings=False).claims == []


def test_ask_reads_the_concept_catalog_first_and_follows_its_links(demo):
    ws, ids = demo
    compile_wiki(ws, deterministic=True)
    a = ask(ws, QUESTION, embeddings=False)
    assert a.route == ["catalog", "index"]
    assert any(p.startswith("concepts/flag-engine-dtype-bfloat16") for p in a.consulted)
    decision_pages = [p for p in a.consulted if p.startswith("decisions/")]
    assert decision_pages and all("rejected" in p for p in decision_pages)
    assert ids["rejection"] in a.cited()
    assert any(c.source.startswith("concepts/") for c in a.claims)
    assert a.caveats == []  # the pages are fresh, the rejection is no accepted finding
    # A newer revision of the demo's profile: the concept pages read are stale now.
    from infer_forge.harness.loop.define import record_profile

    from tests.conftest import REPO

    rev2 = ws.home.parent / "demo-tiny-cpu-r2.yaml"
    rev2.write_text((REPO / "examples/profiles/demo-tiny-cpu.yaml").read_text()
                    .replace("rev: 1", "rev: 2").replace("compile: false", "compile: true"))
    record_profile(ws, rev2)
    b = ask(ws, QUESTION, embeddings=False)
    stale = [c for c in b.claims if c.source.startswith("concepts/")]
    assert stale and all(any("is stale: runtime profile demo-tiny-cpu@2" in v
                             for v in c.caveats) for c in stale)


def test_cli_ask_json_file_and_build_show_the_answer_page(demo):
    ws, ids = demo
    home = ws.home
    r = run_forge("wiki", "ask", QUESTION, "--json", "--no-embeddings", home=home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert ids["rejection"] in out["cited"] and out["filed"] is None
    c = next(x for x in out["claims"][0]["citations"] if x["event_id"] == ids["rejection"])
    assert c["url"] == c["page"] + ".html"
    human = run_forge("wiki", "ask", QUESTION, "--no-embeddings", home=home)
    assert f"[e:{ids['rejection']}] DirectionRejected" in human.stdout
    assert not (home / "wiki" / "answers").exists()  # nothing filed without --file

    filed = run_forge("wiki", "ask", QUESTION, "--file", "--no-embeddings", home=home)
    assert filed.returncode == 0, filed.stderr
    [path] = [line.split("filed as ")[1].rstrip(")") for line in filed.stdout.splitlines()
              if "filed as" in line]
    md = (home / "wiki" / f"{path}.md").read_text()
    assert "type: answer" in md and ids["rejection"][:8] in md
    b = run_forge("wiki", "build", "--no-embeddings", home=home)
    assert b.returncode == 0, b.stderr
    html = (home / "site" / f"{path}.html").read_text()
    assert "why was bfloat16 rejected?" in html
    assert 'href="../decisions/demo-tune-tiny-cpu-rejected-' in html  # the citation's link
    assert "answers/index" in (home / "wiki" / "index.md").read_text()
    rep = L.lint(ws, record=False)
    assert not [x for x in rep.orphans + [b["page"] for b in rep.broken]
                if x.startswith("answers/")], rep
    # Nothing to file when nothing answers: one line, exit 1.
    bad = run_forge("wiki", "ask", "zebra unicorn", "--file", "--no-embeddings", home=home)
    assert bad.returncode == 1 and "nothing to file" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_a_model_tier_phrases_the_answer_and_invented_claims_are_dropped(forge_home):
    ws, _ = init_workspace(forge_home)
    ids = _demo(ws)
    ws.close()
    good = (f"bfloat16 was rejected: its median throughput was 102 against a baseline of 100 "
            f"[e:{ids['verification']}].")
    invented = f"bfloat16 also cut TTFT by 37% [e:{ids['rejection']}]."
    bad_id = "It crashed the engine twice [e:0b5e6f7a-0000-4000-8000-000000000000]."
    with ScriptedChat([{"content": f"{good}\n{invented}\n{bad_id}"}]) as chat:
        with open(forge_home / "forge.toml", "a") as f:
            f.write(f'\n[models.wiki]\nurl = "{chat.url}"\nmodel = "scripted"\n'
                    'family = "test"\n')
        ws = open_workspace(forge_home)
        try:
            a = ask(ws, QUESTION, embeddings=False, post=wiki_post)
        finally:
            ws.close()
        prompt = chat.requests[0]["messages"][-1]["content"]
    assert QUESTION in prompt and ids["rejection"] in prompt  # the evidence was given
    assert a.mode == "model" and a.model == "wiki:scripted"
    assert [c.text for c in a.claims] == [good.replace(f" [e:{ids['verification']}]", "")]
    assert [x.event_id for x in a.claims[0].citations] == [ids["verification"]]
    reasons = {d["reason"] for d in a.dropped}
    assert reasons == {"figure 37 is in none of its cited events",
                       "cites an unknown event: 0b5e6f7a-0000-4000-8000-000000000000"}


def test_a_failing_model_leaves_the_extractive_answer(forge_home):
    ws, _ = init_workspace(forge_home)
    ids = _demo(ws)
    ws.close()
    nonsense = {"content": "the the llama of of 12 14 [e:zzz] weights weights"}
    with ScriptedChat([{"status": 503, "body": "down"}, nonsense]) as chat:
        with open(forge_home / "forge.toml", "a") as f:
            f.write(f'\n[models.wiki]\nurl = "{chat.url}"\nmodel = "scripted"\n'
                    'family = "test"\ntimeout_s = 10\n')
        ws = open_workspace(forge_home)
        try:
            a = ask(ws, QUESTION, embeddings=False, post=wiki_post)
            b = ask(ws, QUESTION, embeddings=False, post=wiki_post)  # the tiny model's kind of text
            with pytest.raises(WikiError, match="no \\[models.nope\\]"):
                ask(ws, QUESTION, tier="nope")
        finally:
            ws.close()
    assert a.mode == "extractive" and "failed" in (a.note or "")
    assert ids["rejection"] in a.cited()
    assert b.mode == "extractive" and "dropped by the citation check" in (b.note or "")
    assert b.dropped and ids["rejection"] in b.cited()


def test_the_mcp_tool_answers_over_the_mcp_protocol(forge_home):
    from ..harness.mcp.test_mcp import call, stdio_client

    ws, _ = init_workspace(forge_home)
    ids = _demo(ws)
    ws.close()

    async def session() -> None:
        async with stdio_client(forge_home) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "journal_ask" in names
            out = await call(c, "journal_ask", {"question": QUESTION})
            assert ids["rejection"] in out["cited"] and out["mode"] == "extractive"
            why = await call(c, "journal_ask", {"question": "why was it?"}, ok=False)
            assert "no word to look for" in why and "\n" not in why

    asyncio.run(session())


def test_a_filed_answer_is_redacted_and_replaces_the_same_question(demo):
    from infer_forge.wiki.answers import file_answer, load_answers

    ws, ids = demo
    secret = "sk-ant-api03-" + "Q" * 40
    q = f"why was bfloat16 rejected with key {secret}?"
    filed = file_answer(ws, ask(ws, q, embeddings=False))
    raw = (ws.home / "wiki" / "answers" / "_answers.json").read_text()
    assert secret not in raw and "[REDACTED" in raw
    assert secret not in (ws.home / "wiki" / f"{filed.path}.md").read_text()
    assert ids["rejection"] in {s.event_id for s in filed.sources}
    assert filed.position == ask(ws, q, embeddings=False).position > 0
    again = file_answer(ws, ask(ws, q, embeddings=False))
    assert again.slug == filed.slug and len(load_answers(ws.home / "wiki").answers) == 1
