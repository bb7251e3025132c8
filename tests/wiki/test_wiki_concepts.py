"""Concept pages compiled across tasks (issue 17, items 1-3 and 6): the deterministic compile
of the demo's ledger (scripted numbers) and of the 39-node graph's, citations that resolve to
ledger events, the model's synthesis under the citation check (a scripted OpenAI-protocol
server; the project's tiny model as a real endpoint), freshness and `--stale`, SCHEMA.md and
llms.txt on the site."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.cli import wiki_post
from infer_forge.harness.demo import DEMO_TASK
from infer_forge.harness.loop.define import define_task, record_profile
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.index import open_index
from infer_forge.wiki.build import build
from infer_forge.wiki.concepts import claims
from infer_forge.wiki.concepts.compiler import compile_wiki
from infer_forge.wiki.concepts.evidence import event_sha
from infer_forge.wiki.concepts.model import load_catalog, save_catalog
from infer_forge.wiki.graphs import graph_path
from infer_forge.wiki.lint import forward_links, lint_dir
from infer_forge.wiki.pages import task_path

from tests.conftest import REPO, need, run_forge
from tests.e2e.test_demo import ScriptedEvaluator

from .test_wiki_safety import audit_site

EXAMPLES = REPO / "examples"


def run_demo(ws) -> str:
    tid = define_task(ws, DEMO_TASK)["task_id"]
    run_task(ws, tid, evaluator=ScriptedEvaluator())
    return tid


def second_task(ws, tmp_path: Path) -> str:
    """One more task on the demo's point that tries bfloat16 alone: one new decision."""
    text = DEMO_TASK.read_text()
    text = text.replace("id: demo-tune-tiny-cpu", "id: dtype-only-tiny-cpu")
    text = text.replace("point: ../points/demo-tiny-cpu.yaml",
                        f"point: {EXAMPLES / 'points' / 'demo-tiny-cpu.yaml'}")
    text = re.sub(r"scope:\n(  .*\n)+", "scope:\n  engine.dtype: [bfloat16]\n", text)
    f = tmp_path / "dtype-only.yaml"
    f.write_text(text)
    tid = define_task(ws, f)["task_id"]
    run_task(ws, tid, evaluator=ScriptedEvaluator())
    return tid


def index_events(ws) -> dict[str, tuple[str, str]]:
    with open_index(ws) as s:
        return {e: (t, p) for e, t, p in s.con.execute(
            "SELECT event_id, type, payload FROM events").fetchall()}


def assert_valid_citations(ws, catalog) -> None:
    """Every claim cites events the ledger holds, and the page records their hashes."""
    events = index_events(ws)
    assert catalog.pages
    for p in catalog.pages.values():
        assert p.claims and p.compiled_at <= catalog.position
        sources = {s.event_id: s for s in p.sources}
        for c in p.claims:
            assert c.citations, c
            for cit in c.citations:
                assert cit.event_id in events, (p.slug, cit)
                assert events[cit.event_id][0] == cit.type
                assert sources[cit.event_id].sha256 == event_sha(*events[cit.event_id])


def test_demo_compile_writes_cited_concept_pages(workspace, tmp_path):
    tid = run_demo(workspace)
    rep = compile_wiki(workspace, deterministic=True)
    cat = load_catalog(workspace.home / "wiki")
    assert set(rep.compiled) == set(cat.pages) and rep.pages == len(cat.pages)
    by = cat.by_concept()
    assert {p.kind for p in cat.pages.values()} == {"flag", "pairing", "failure", "direction"}
    assert {"flag:engine.dtype=bfloat16", "flag:engine.continuous_batching=true",
            "pairing:tiny-llama@x86_64", "failure:gate:ttft-slo/median_ttft_ms"} <= set(by)
    assert_valid_citations(workspace, cat)
    # The bfloat16 page cites the rejection, which is the decision's own event.
    with open_index(workspace) as s:
        (rejection,) = s.con.execute(
            "SELECT decision_id FROM decisions WHERE kind = 'rejected' AND task_id = $1",
            [tid]).fetchone()
    bf16 = by["flag:engine.dtype=bfloat16"]
    row = next(c for c in bf16.claims if c.section == "Decisions")
    assert row.row[3] == "rejected" and rejection in {c.event_id for c in row.citations}
    cite = next(c for c in row.citations if c.event_id == rejection)
    assert cite.type == "DirectionRejected" and cite.page.startswith("decisions/")
    assert [p.point_hash for p in bf16.points] == [bf16.points[0].point_hash]
    assert bf16.points[0].runtime_profile == "demo-tiny-cpu@1"
    # The journal: frontmatter, a citation link on every row, SCHEMA.md; a second compile
    # of the same index writes nothing new.
    md = (workspace.home / "wiki" / f"{bf16.path}.md").read_text()
    assert "state: fresh" in md and f"compiled_at: {cat.position}" in md
    for line in md.splitlines():
        if line.startswith("| demo-tune-tiny-cpu"):
            assert "[[decisions/" in line or "[[tasks/" in line, line
    assert (workspace.home / "wiki" / "SCHEMA.md").read_text().startswith("---\ntype: schema")
    again = compile_wiki(workspace, deterministic=True)
    assert again.written == 0 and load_catalog(workspace.home / "wiki") == cat
    # The site shows the state; llms.txt lists the concept pages; the journal lints clean.
    build(workspace, embeddings=False)
    html = (workspace.home / "site" / f"{bf16.path}.html").read_text()
    assert "State: fresh" in html and 'href="../decisions/' in html
    llms = (workspace.home / "site" / "llms.txt").read_text()
    assert f"({bf16.path}.html)" in llms and llms.startswith("# infer-forge journal")
    home = (workspace.home / "site" / "index.html").read_text()
    assert 'href="concepts/index.html"' in home
    assert lint_dir(workspace.home / "wiki").ok


def test_a_new_decision_makes_its_concepts_stale_and_stale_recompiles_only_them(
        workspace, tmp_path):
    run_demo(workspace)
    compile_wiki(workspace, deterministic=True)
    before = load_catalog(workspace.home / "wiki")
    second_task(workspace, tmp_path)
    r = run_forge("wiki", "compile", "--stale", "--json", home=workspace.home)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    after = load_catalog(workspace.home / "wiki")
    slug = {p.concept: p.slug for p in after.pages.values()}
    stale = {"flag:engine.dtype=bfloat16", "pairing:tiny-llama@x86_64",
             "failure:gate:ttft-slo/median_ttft_ms"}
    # New: bfloat16 alone as a rejected direction, and the throughput gate now failing twice
    new = {"direction:" + json.dumps({"engine.dtype": "bfloat16"}, separators=(",", ":")),
           "failure:gate:throughput/output_throughput"}
    assert rep["states"] == {"fresh": len(before.pages) - 3, "stale": 3}
    assert set(rep["compiled"]) == {slug[c] for c in stale | new}  # 5 of 9 pages
    assert rep["pages"] == len(before.pages) + 2
    for s, p in after.pages.items():
        if p.concept in stale | new:
            assert p.compiled_at == after.position > before.position
        else:
            assert p == before.pages[s]  # untouched
    assert_valid_citations(workspace, after)
    # A newer runtime profile revision on their point makes every page on it stale.
    prof = (EXAMPLES / "profiles" / "demo-tiny-cpu.yaml").read_text().replace("rev: 1",
                                                                                "rev: 2")
    (tmp_path / "rev2.yaml").write_text(prof)
    record_profile(workspace, tmp_path / "rev2.yaml")
    rep = compile_wiki(workspace, stale=True, deterministic=True)
    assert rep.states == {"stale": len(after.pages)}
    assert len(rep.compiled) == len(after.pages)
    build(workspace, embeddings=False)
    rep = compile_wiki(workspace, stale=True, deterministic=True)
    assert rep.states == {"fresh": len(after.pages)} and rep.compiled == []


def test_stale_state_shows_on_the_site_before_recompiling(workspace, tmp_path):
    run_demo(workspace)
    compile_wiki(workspace, deterministic=True)
    second_task(workspace, tmp_path)
    build(workspace, embeddings=False, compile_concepts=False)
    cat = load_catalog(workspace.home / "wiki")
    bf16 = cat.by_concept()["flag:engine.dtype=bfloat16"]
    fp32 = cat.by_concept()["flag:engine.dtype=float32"]
    site = workspace.home / "site"
    assert "State: stale" in (site / f"{bf16.path}.html").read_text()
    assert "new event(s) about flag:engine.dtype=bfloat16" in (
        site / f"{bf16.path}.html").read_text()
    assert "State: fresh" in (site / f"{fp32.path}.html").read_text()
    # A build compiles what is stale first (and the new concepts), then renders.
    rep = build(workspace, embeddings=False)
    assert rep.concepts == 5 and not rep.fresh
    now = load_catalog(workspace.home / "wiki")
    assert now.position == rep.position and len(now.pages) == len(cat.pages) + 2
    assert "State: fresh" in (site / f"{bf16.path}.html").read_text()
    assert build(workspace, embeddings=False).fresh  # nothing left to compile or render


def _with_model(ws, url: str, model: str = "scripted-chat", extra: str = ""):
    with open(ws.home / "forge.toml", "a") as f:
        f.write(f'\n[models.wiki]\nurl = "{url}"\nmodel = "{model}"\nfamily = "test"\n{extra}')
    ws2, _ = init_workspace(ws.home)
    return ws2


def test_generated_claims_with_an_invented_figure_or_a_bad_event_id_are_dropped(workspace):
    run_demo(workspace)
    bad_id = "00000000-0000-4000-8000-000000000000"
    with open_index(workspace) as q:  # a real event, but not evidence of the bfloat16 page
        (foreign,) = q.con.execute("SELECT event_id FROM events WHERE type = 'TaskDefined' "
                                   "LIMIT 1").fetchone()

    def reply(req):
        prompt = req["messages"][0]["content"]
        ids = re.findall(r"\[e:([0-9a-f-]{36})\]", prompt)
        first = ids[0]
        if '"engine.dtype = bfloat16"' not in prompt:  # names the page's concept, as told
            term = re.search(r"names it \(([^,)]+)", prompt).group(1)
            return {"content": f"{term} is in the ledger. [e:{first}]"}
        rej = re.search(r"was rejected in task .*?\[e:([0-9a-f-]{36})\]", prompt).group(1)
        return {"content": "\n".join([
            f"- bfloat16 was rejected: its throughput ratio was 1.02 against a 1.05 floor "
            f"[e:{rej}].",
            f"- bfloat16 raised throughput by 73% [e:{rej}].",
            f"- The baseline was stable over 3 runs [e:{bad_id}].",
            "- bfloat16 is always faster.",
            f"- The bfloat16 decision stands as recorded [e:{rej}].",
            # True, cited, and about something else: dropped (issue 32).
            f"- Continuous batching was not what this block tried [e:{rej}].",
            f"- The bfloat16 task was defined first [e:{foreign}]."])}

    with ScriptedChat([reply] * 20) as chat:
        ws = _with_model(workspace, chat.url)
        with ws:
            r = run_forge("wiki", "compile", "--json", home=ws.home)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["model"]["asked"] == rep["pages"] and rep["model"]["failed"] == 0
    cat = load_catalog(workspace.home / "wiki")
    bf16 = cat.by_concept()["flag:engine.dtype=bfloat16"]
    reasons = sorted(d["reason"] for d in rep["dropped"] if d["page"] == bf16.slug)
    concept = "flag:engine.dtype=bfloat16"
    assert foreign not in {s.event_id for s in bf16.sources}
    assert reasons == [f"cites an event that is not evidence of {concept}: {foreign}",
                       f"cites an unknown event: {bad_id}",
                       f"does not concern {concept} (names none of: bfloat16, dtype, "
                       "engine.dtype)",
                       "figure 73 is in none of its cited events", "uncited"]
    assert all(d["page"] == bf16.slug for d in rep["dropped"])
    synth = [c for c in bf16.claims if c.author == "model"]
    assert [c.text for c in synth] == [
        "bfloat16 was rejected: its throughput ratio was 1.02 against a 1.05 floor.",
        "The bfloat16 decision stands as recorded."]
    assert bf16.author == "model" and bf16.model == "wiki:scripted-chat"
    assert len(bf16.dropped) == 5
    # Every other page's synthesis named its concept and was published.
    assert all(any(c.author == "model" for c in p.claims) for p in cat.pages.values())
    assert_valid_citations(workspace, cat)
    md = (workspace.home / "wiki" / f"{bf16.path}.md").read_text()
    assert "1.02 against a 1.05 floor" in md
    assert "73%" not in md and "always faster" not in md  # reasons only, never the text
    assert "## Claims dropped" in md and "figure 73 is in none of its cited events" in md
    # The schema is what the model was given.
    assert "## Citations" in chat.requests[0]["messages"][0]["content"]


def test_a_down_model_endpoint_leaves_the_deterministic_pages(workspace):
    run_demo(workspace)
    ws = _with_model(workspace, "http://127.0.0.1:9/v1", extra="timeout_s = 5\n")
    with ws:
        rep = compile_wiki(ws, post=wiki_post)
    assert rep.model["failed"] == 1 and rep.model["asked"] == 0 and rep.pages >= 5
    cat = load_catalog(workspace.home / "wiki")
    assert all(p.author == "compiler" for p in cat.pages.values())
    r = run_forge("wiki", "compile", "--tier", "nope", home=workspace.home)
    assert r.returncode != 0 and "--tier 'nope': no [models.nope]" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_claim_check_rules():
    pay = {"a": json.dumps({"reason": "ratio 1.02 needs >= 1.05", "median": 102.0,
                            "occurred_at": "2026-12-01T11:05:53", "n": 3})}
    assert claims.check("Ratio 1.02 [e:a]", pay) is None
    assert claims.check("Throughput rose 2% [e:a]", pay) is None  # the ratio's change
    assert claims.check("Median 102 on H200 with bfloat16 [e:a]", pay) is None  # names
    assert claims.check("Median 102.4 [e:a]", pay).reason.startswith("figure 102.4")
    assert claims.check("At 11:05 it ran [e:a]", pay).reason.startswith("figure 11")
    assert claims.check("Median 102", pay).reason == "uncited"
    assert claims.check("Median 102 [e:b]", pay).reason == "cites an unknown event: b"
    assert claims.sentences("One [e:a]. Two. [e:a]\n- Three") == [
        "One [e:a].", "Two. [e:a]", "Three"]


def test_a_synthesis_sentence_must_concern_the_page_concept():
    flag = claims.Concept("flag:engine.continuous_batching=true", frozenset({"a"}))
    assert flag.terms == {"engine.continuous_batching", "continuous_batching"}
    assert claims.concerns("Continuous batching helped [e:a]", flag) is None
    assert claims.concerns("continuous_batching=true was kept [e:a]", flag) is None
    off = claims.concerns("The machine has two cores [e:a]", flag)
    assert off.reason.startswith("does not concern flag:engine.continuous_batching=true")
    assert claims.concerns("Continuous batching helped [e:a] [e:b]", flag).reason == \
        "cites an event that is not evidence of flag:engine.continuous_batching=true: b"
    pairing = claims.Concept("pairing:tiny-llama@cpu", frozenset({"a"}))
    assert pairing.terms == {"tiny-llama", "cpu"}
    assert claims.concerns("Tiny llama runs on the CPU [e:a]", pairing) is None
    gate = claims.Concept("failure:gate:ttft-slo/median_ttft_ms", frozenset({"a"}))
    assert gate.terms == {"ttft-slo", "median_ttft_ms"}
    pay = {"a": json.dumps({"median": 102.0})}
    kept, dropped = claims.split("TTFT SLO failed at 102 [e:a]\nDisk was full [e:a]", pay,
                                 gate)
    assert [k for k, _ in kept] == ["TTFT SLO failed at 102"]
    assert [d.reason.split(" (")[0] for d in dropped] == [
        "does not concern failure:gate:ttft-slo/median_ttft_ms"]


@pytest.mark.slow
def test_the_tiny_model_as_a_real_endpoint_publishes_nothing_uncited(workspace, hf_server):
    run_demo(workspace)
    ws = _with_model(workspace, f"{hf_server.base_url}/v1", hf_server.model,
                     "max_tokens = 48\ntimeout_s = 120\n")
    with ws:
        rep = compile_wiki(ws, post=wiki_post)
        assert rep.model["asked"] + rep.model["failed"] >= 1
        cat = load_catalog(ws.home / "wiki")
        assert_valid_citations(ws, cat)
        events = index_events(ws)
        for p in cat.pages.values():
            for c in p.claims:
                if c.author == "model":  # nonsense rarely survives; what does is checked
                    assert claims.check(
                        c.text + " " + " ".join(f"[e:{x.event_id}]" for x in c.citations),
                        {x.event_id: events[x.event_id][1] for x in c.citations}) is None
        assert build(ws, embeddings=False).pages > len(cat.pages)


@pytest.mark.slow
def test_the_39_node_graph_compiles_to_cited_concept_pages(forge_home):
    need(shutil.which("gcc") is not None, "gcc is needed by the example's kernel nodes")
    need(shutil.which("git") is not None, "git is needed by the example's sync nodes")
    assert run_forge("init").returncode == 0
    mono = forge_home.parent / "monorepo-example"
    shutil.copytree(EXAMPLES / "monorepo", mono,
                    ignore=shutil.ignore_patterns("remotes", "__pycache__"))
    subprocess.run([sys.executable, str(mono / "make_remotes.py")], check=True,
                   capture_output=True)
    assert run_forge("repos", "init", str(mono / "local.yaml")).returncode == 0
    assert run_forge("graph", "new", str(EXAMPLES / "graphs" / "serving-project.yaml")
                     ).returncode == 0
    # the example's toy parts: the wiki reads the run's events, not SGLang
    r = run_forge("graph", "run", "-j", "2", "--json", timeout=600,
                  env={"FORGE_SERVING_PROJECT": "fast"})
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_forge("wiki", "compile", "--json")
    assert r.returncode == 0, r.stderr
    ws, _ = init_workspace(forge_home)
    with ws:
        cat = load_catalog(forge_home / "wiki")
        assert_valid_citations(ws, cat)
        by = cat.by_concept()
        assert {"direction:node:serving-project.kernel-fp8-per-tensor",
                "direction:node:serving-project.kernel-moe-deepgemm-h20",
                "flag:engine.kernel_opt=-O1"} <= set(by)
        # A rejection links to its node's task page, or to the graph's page when the node
        # never ran (stopped by another node).
        fp8 = by["direction:node:serving-project.kernel-fp8-per-tensor"]
        assert any(c.type == "NodeRejected" and c.page == task_path(
            "serving-project.kernel-fp8-per-tensor") for cl in fp8.claims for c in cl.citations)
        moe = by["direction:node:serving-project.kernel-moe-deepgemm-h20"]
        assert any(c.type == "NodeRejected" and c.page == graph_path("serving-project")
                   for cl in moe.claims for c in cl.citations)
        assert (forge_home / "wiki" / "SCHEMA.md").is_file()
        build(ws, embeddings=False)
        assert lint_dir(forge_home / "wiki").ok


def test_planted_markup_in_a_candidate_value_stays_text_on_concept_pages(workspace, tmp_path):
    evil = "<script>alert(1)</script>[[tasks/x|y]](http://e.vil)"
    text = DEMO_TASK.read_text().replace("id: demo-tune-tiny-cpu", "id: planted-tiny-cpu")
    text = text.replace("point: ../points/demo-tiny-cpu.yaml",
                        f"point: {EXAMPLES / 'points' / 'demo-tiny-cpu.yaml'}")
    text = re.sub(r"scope:\n(  .*\n)+", f"scope:\n  engine.attn: [{json.dumps(evil)}]\n",
                  text)
    (tmp_path / "planted.yaml").write_text(text)
    tid = define_task(workspace, tmp_path / "planted.yaml")["task_id"]
    run_task(workspace, tid, evaluator=ScriptedEvaluator())
    compile_wiki(workspace, deterministic=True)
    build(workspace, embeddings=False)
    cat = load_catalog(workspace.home / "wiki")
    page = cat.by_concept()[f"flag:engine.attn={evil}"]
    texts = audit_site(workspace.home / "site")  # no script, no link off the site
    assert evil in texts[f"{page.path}.html"]  # shown as typed
    md = (workspace.home / "wiki" / f"{page.path}.md").read_text()
    body = md.split("\n---\n", 1)[1]  # the frontmatter holds it as data, as typed
    assert "[[tasks/x" not in body and "tasks/x" not in forward_links(md)
    llms = (workspace.home / "site" / "llms.txt").read_text()
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").render(llms)  # raw HTML allowed: the strictest reader
    assert "<script" not in rendered
    hrefs = re.findall(r'href="([^"]*)"', rendered)
    assert hrefs and all(re.fullmatch(r"[a-z0-9~][a-z0-9._~/-]*\.html", h) for h in hrefs)
    assert lint_dir(workspace.home / "wiki").ok


def test_a_page_whose_concept_left_the_ledger_is_orphaned_then_removed(workspace):
    run_demo(workspace)
    compile_wiki(workspace, deterministic=True)
    wiki = workspace.home / "wiki"
    cat = load_catalog(wiki)
    real = cat.by_concept()["flag:engine.dtype=bfloat16"]
    # A page of a concept no derivation gives (as after an index rebuilt from another ledger)
    gone = real.model_copy(update={"concept": "flag:engine.dtype=int3",
                                   "slug": "flag-gone", "title": "gone"})
    save_catalog(wiki, cat.model_copy(update={"pages": {**cat.pages, "flag-gone": gone}}))
    (wiki / "concepts" / "flag-gone.md").write_text("---\ntype: concept\n---\n")
    rep = compile_wiki(workspace, stale=True, deterministic=True)
    assert rep.states == {"fresh": len(cat.pages), "orphaned": 1} and rep.compiled == []
    kept = load_catalog(wiki).pages["flag-gone"]
    assert kept.state == "orphaned" and "no longer shows flag:engine.dtype=int3" in \
        kept.reasons[0]
    assert "state: orphaned" in (wiki / "concepts" / "flag-gone.md").read_text()
    rep = compile_wiki(workspace, deterministic=True)
    assert rep.removed == ["flag-gone"] and "flag-gone" not in load_catalog(wiki).pages
    assert not (wiki / "concepts" / "flag-gone.md").exists()
