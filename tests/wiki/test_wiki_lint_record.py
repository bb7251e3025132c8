"""`forge wiki lint`'s checks over the whole record: a planted contradiction (two accepted
findings of one candidate on one point that disagree beyond the noise band) and a planted
stale claim (a finding whose runtime profile moved on and was never re-verified), on a
ledger written by the harness's own writers (define, block start, measure, verify, accept)."""

from __future__ import annotations

import json
from pathlib import Path

from infer_forge.harness.loop.define import define_task, record_profile
from infer_forge.harness.loop.manual import (
    accept,
    handoff_block,
    record_measurement,
    start_block,
    verify_block,
)
from infer_forge.wiki import lint as L
from infer_forge.wiki import record_lint as R
from infer_forge.wiki.ask import ask
from infer_forge.wiki.build import build
from infer_forge.wiki.concepts.compiler import compile_wiki
from infer_forge.wiki.concepts.model import (
    concept_path,
    concept_slug,
    load_catalog,
    save_catalog,
)

from tests.conftest import REPO, run_forge
from tests.e2e.test_demo import ScriptedEvaluator, _scripted_demo

from ..harness.loop.test_loop import make_task_dir

CB = {"engine.continuous_batching": True}


def _block(ws, tid: str, cand: dict, tputs: tuple[float, ...], ttft: float) -> dict:
    start_block(ws, tid, f"measure {cand or 'baseline'}", cand)
    for t in tputs:
        record_measurement(ws, tid, {"output_throughput": t, "median_ttft_ms": ttft,
                                     "token_match": 1.0, "failed": 0.0})
    v = verify_block(ws, tid)
    handoff_block(ws, tid, state_reached=f"measured {cand or 'baseline'}")
    return v


def _task_accepting_cb(ws, root: Path, tid: str, gain: float) -> str:
    """Task `tid` on the tiny-cpu point: a baseline at ~100 tok/s, continuous batching at
    ~100·(1+gain) tok/s (three repeats each, ±1%), verified and accepted."""
    define_task(ws, make_task_dir(root / f"specs-{tid}", tid))
    _block(ws, tid, {}, (100.0, 101.0, 99.0), 300.0)
    c = 100.0 * (1 + gain)
    v = _block(ws, tid, CB, (c, c * 1.01, c * 0.99), 200.0)
    assert v["verdict"] == "pass", v
    return accept(ws, tid, block="b2")["event_id"]


def test_planted_contradiction_is_an_error(workspace, tmp_path):
    first = _task_accepting_cb(workspace, tmp_path, "cb-fast", 0.40)
    second = _task_accepting_cb(workspace, tmp_path, "cb-slow", 0.08)
    rep = L.lint(workspace)
    assert rep.findings == 2
    [c] = [x for x in rep.contradictions if x["metric"] == "output_throughput"]
    assert {c["a"]["decision_id"], c["b"]["decision_id"]} == {first, second}
    assert c["band"] == "learned" and 0 < c["cv"] < 0.02  # the ±1% repeats, pooled
    assert c["concepts"] == [concept_path(concept_slug("flag", "engine.continuous_batching=true"))]
    assert abs(c["difference"] - 0.32) < 0.01 and c["tolerance"] == round(4 * c["cv"], 4)
    assert not rep.ok
    r = run_forge("wiki", "lint", "--json", home=workspace.home)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert [x["metric"] for x in out["contradictions"]] == ["output_throughput"]
    text = run_forge("wiki", "lint", home=workspace.home).stdout
    assert "contradiction: engine.continuous_batching=true on point" in text


def test_findings_within_the_band_do_not_contradict(workspace, tmp_path):
    _task_accepting_cb(workspace, tmp_path, "cb-one", 0.30)
    _task_accepting_cb(workspace, tmp_path, "cb-two", 0.31)
    rep = L.lint(workspace)
    assert rep.findings == 2 and rep.contradictions == []


def test_contradiction_rule_uses_the_default_band_without_history():
    a = R.Finding("d1", "t1", "b2", "{}x", {}, "sha256:p", "s@1", 1,
                  effects={"output_throughput": 0.10})
    b = R.Finding("d2", "t2", "b2", "{}x", {}, "sha256:p", "s@1", 2,
                  effects={"output_throughput": 0.25})
    assert R.contradictions([a, b], {}) == []  # 0.15 < 4 × 5%
    b.effects["output_throughput"] = 0.35
    [c] = R.contradictions([a, b], {("sha256:p", "output_throughput"): None})
    assert c["band"] == "default" and c["tolerance"] == 0.2
    assert R.contradictions([a, b], {("sha256:p", "output_throughput"): 0.1}) == []
    b.point_hash = "sha256:q"  # another point: not the same claim
    assert R.contradictions([a, b], {}) == []


def _profile_rev2(root: Path, old: str, new: str) -> Path:
    src = (REPO / "examples/profiles/tiny-cpu.yaml").read_text()
    assert old in src
    p = root / "tiny-cpu-r2.yaml"
    p.write_text(src.replace("rev: 1", "rev: 2").replace(old, new))
    return p


def test_planted_stale_claim_is_a_warning(workspace, tmp_path):
    decision = _task_accepting_cb(workspace, tmp_path, "cb-old", 0.40)
    assert L.lint(workspace).stale_claims == []  # rev 1 is the newest: nothing moved on
    record_profile(workspace, _profile_rev2(tmp_path, "cb_num_blocks: 512",
                                                "cb_num_blocks: 1024"))
    rep = L.lint(workspace)
    [s] = rep.stale_claims
    assert s["decision_id"] == decision and s["latest"] == "tiny-cpu@2"
    assert "accepted on tiny-cpu@1" in s["reason"]
    # ask says so next to the claims that cite it
    ans = ask(workspace, "what did continuous batching do?", embeddings=False)
    assert decision in ans.cited()
    assert any(v.startswith(f"stale claim {decision}: accepted on tiny-cpu@1")
               for v in ans.caveats)
    build(workspace, embeddings=False)
    r = run_forge("wiki", "lint", home=workspace.home)
    assert r.returncode == 0, r.stdout + r.stderr  # a warning, not an error
    assert f"stale claim: {decision}" in r.stdout
    assert run_forge("wiki", "lint", "--strict", home=workspace.home).returncode == 1


def test_mentions_rule():
    got = R.mentions([("e1", 'next: try engine.cb=false, engine.dtype="bfloat16".'),
                      ("e2", None), ("e3", "xengine.y=2 and engine.z=1.5"),
                      ("e4", "engine.cb=false again")])
    assert got == {"flag:engine.cb=false": "e1", "flag:engine.dtype=bfloat16": "e1",
                   "flag:engine.z=1.5": "e3"}


def test_stale_claim_rules():
    f = R.Finding("d1", "t1", "b2", '{"engine.x":true}', {"engine.x": True}, "sha256:p",
                  "svc@1", 1)
    revs = {"svc": {1: {"x": False}, 2: {"x": False}}}
    assert [s["decision_id"] for s in R.stale_claims([f], revs, [])] == ["d1"]
    # re-verified at the newest rev with the candidate applied: not stale
    ok = [{"runtime_profile": "svc@2", "candidate": {"engine.x": True}}]
    assert R.stale_claims([f], revs, ok) == []
    # verified there, but without the flag: still stale
    other = [{"runtime_profile": "svc@2", "candidate": {}}]
    assert len(R.stale_claims([f], revs, other)) == 1
    # the newer revision folded the flag in and its baseline passed: re-verified
    revs["svc"][2] = {"x": True}
    assert R.stale_claims([f], revs, other) == []
    # a re-check on an older revision than the newest does not count
    revs["svc"][3] = {"x": False}
    assert len(R.stale_claims([f], revs, other)) == 1


def test_concepts_without_a_page_and_orphaned_concept_pages(workspace):
    _scripted_demo(workspace, ScriptedEvaluator())
    bf16 = concept_path(concept_slug("flag", "engine.dtype=bfloat16"))
    rep = L.lint(workspace)
    assert {"page": bf16, "concept": "flag:engine.dtype=bfloat16",
            "mentioned_in": None} in rep.missing_concepts
    assert rep.ok and rep.warnings >= len(rep.missing_concepts)
    compile_wiki(workspace, deterministic=True)
    rep = L.lint(workspace)
    assert rep.missing_concepts == [] and rep.orphaned_concepts == []
    # A handoff that mentions a setting no page covers: a concept without a page.
    define_task(workspace, make_task_dir(workspace.home.parent / "specs-m", "mention"))
    start_block(workspace, "mention", "baseline", {})
    handoff_block(workspace, "mention", state_reached="baseline only",
                  next_sub_goal="try engine.attn_implementation=eager next")
    [m] = L.lint(workspace).missing_concepts
    assert m["concept"] == "flag:engine.attn_implementation=eager"
    assert m["page"] == concept_path(concept_slug("flag", "engine.attn_implementation=eager"))
    hand = [r.event for r in workspace.ledger.stream("task:mention")
            if r.type == "LoopBlockHandedOff"]
    assert m["mentioned_in"] == str(hand[0].event_id)
    # A page whose concept the ledger does not show: orphaned (a warning).
    wiki = workspace.home / "wiki"
    cat = load_catalog(wiki)
    page = next(p for p in cat.pages.values() if p.concept == "flag:engine.dtype=bfloat16")
    ghost = page.model_copy(update={"concept": "flag:engine.dtype=float8",
                                    "slug": concept_slug("flag", "engine.dtype=float8")})
    save_catalog(wiki, cat.model_copy(update={"pages": {**cat.pages, ghost.slug: ghost}}))
    rep = L.lint(workspace)
    assert rep.orphaned_concepts == [{"page": ghost.path, "concept": "flag:engine.dtype=float8"}]
    r = run_forge("wiki", "lint", "--json", home=workspace.home)
    out = json.loads(r.stdout)
    assert out["orphaned_concepts"][0]["concept"] == "flag:engine.dtype=float8"
    assert out["warnings"] >= 1
