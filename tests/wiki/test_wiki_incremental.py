"""A journal that grows: a build after one new decision rewrites only the pages made from it
(every other page's files keep their bytes and mtime), and the site's sharded search index
rewrites only the shards it changed and finds the new page, in Python and in a real browser.
Timing at 10k tasks is bench/journal.py's."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.store import Append
from infer_forge.ledger.streams import task_stream
from infer_forge.wiki import build as B
from infer_forge.wiki import search_index as S

from tests.helpers.index_ledger import build as build_ledger

TASK = "qwen-h200-rev2"  # Qwen3-30B-A3B on H200, profile qwen-h200@2, point qwen-h200-r2


def _files(home: Path) -> dict[str, tuple[int, str]]:
    return {f.relative_to(home).as_posix(): (f.stat().st_mtime_ns,
                                             hashlib.sha256(f.read_bytes()).hexdigest())
            for d in ("wiki", "site") for f in (home / d).rglob("*") if f.is_file()}


def _decide(ws) -> str:
    d = E.DirectionRejected(candidate={"engine.schedule_policy": "fcfs"},
                            reason="fcfs lost 4% throughput", evidence=[], block_id="b1",
                            task_id=TASK, actor=E.Actor.tool("forge-test"))
    ws.ledger.save(Append(task_stream(TASK), [d]), command_id="test-one-more-decision")
    return f"decisions/{TASK}-rejected-{d.event_id}"


def _search(site: Path, term: str) -> set[str]:
    """The page's lookup, in Python: the term's shard, every token it begins, their docs."""
    root = site / S.SEARCH_DIR
    meta = S.unscript((root / "meta.js").read_text())
    name = S.shard_name(term)
    assert name in meta["shards"], term
    shard = S.unscript((root / "t" / f"{name}.js").read_text())
    nums = {c // 2 for tok, codes in shard.items() if tok.startswith(term) for c in codes}
    per = meta["per"]
    return {S.unscript((root / "d" / f"{n // per}.js").read_text())[n % per][0]
            for n in nums}


def test_one_new_decision_rewrites_only_the_pages_made_from_it(workspace):
    build_ledger(workspace)
    first = B.build(workspace, embeddings=False)
    before = _files(workspace.home)
    new = _decide(workspace)
    rep = B.build(workspace, embeddings=False)
    after = _files(workspace.home)
    changed = {k for k in after if before.get(k) != after[k]}
    pages = {k.split("/", 1)[1].removesuffix(".md") for k in changed
             if k.startswith("wiki/") and k.endswith(".md")}
    # What the decision is an input of: its own page and its task's; the home page, the log,
    # the in-flight page and the dimension indexes (counts of rejections, the position); the
    # task's point, profile and model pages (its plot's verdicts, their position); the concept
    # catalog (the build compiled the concepts the decision made stale); and every page that
    # now links to the new page (its Related and Backlinks blocks, a concept's citations).
    wiki = workspace.home / "wiki"
    linking = {f.relative_to(wiki).with_suffix("").as_posix() for f in wiki.rglob("*.md")
               if f"[[{new}|" in f.read_text() or f"[[{new}\\|" in f.read_text()}
    point = next(f.relative_to(wiki).with_suffix("").as_posix()
                 for f in (wiki / "points").glob("*.md") if "(qwen-h200-r2)" in f.read_text())
    # The history of the task's point (a verdict in its series) and the history index.
    history = next(f.relative_to(wiki).with_suffix("").as_posix()
                   for f in (wiki / "history").glob("*.md") if "qwen-h200@2" in f.read_text())
    expected = ({new, f"tasks/{TASK}", "index", "log", "concurrency", "concepts/index",
                 "models/qwen3-30b-a3b~155aaf9a3362ee55", "profiles/qwen-h200-r2", point,
                 "history", history}
                | {f"dims/{d}" for d in ("model", "task_type", "accelerator", "engine",
                                          "architecture", "parallelism", "runtime_profile",
                                          "scenario")}
                | linking - {new})
    assert pages == expected
    born = {k for k in after if k.startswith("wiki/concepts/") and k not in before}
    assert born == {"wiki/concepts/direction-engine-schedule-policy-fcfs~"
                    f"{k.split('~')[1]}" for k in born}  # fcfs: a new rejected direction
    assert rep.pages == first.pages + 1 + len(born)
    assert rep.written == len(expected) and rep.unchanged == rep.pages - len(expected)
    # Every other page's files are the ones the first build wrote: same bytes, same mtime.
    kept = {p for p in (k.split("/", 1)[1].removesuffix(".md") for k in before
                        if k.startswith("wiki/") and k.endswith(".md"))} - expected
    assert {"models/tiny-llama", "profiles/tiny-cpu-r1", "profiles/qwen-h200-r1"} <= kept
    for p in kept:
        for f in (f"wiki/{p}.md", f"site/{p}.html"):
            assert after.get(f) == before.get(f), f
    # The site's html pages changed exactly with the journal's.
    assert {k[5:-5] for k in changed if k.startswith("site/") and k.endswith(".html")} == pages
    # The search index: one doc shard (the new page takes the next number), the meta, and the
    # token shards of tokens that gained or lost a page; the others are kept.
    shards = {k for k in changed if k.startswith("site/search/")}
    assert {k for k in shards if k.startswith("site/search/d/")} == {"site/search/d/0.js"}
    kept_shards = {k for k in before if k.startswith("site/search/t/")} - shards
    assert kept_shards and "site/search/meta.js" in shards
    assert f"{new}.html" in _search(workspace.home / "site", "fcfs")
    assert f"{new}.html" in _search(workspace.home / "site", "schedul")  # a prefix
    assert rep.traced == 1  # the other decisions' traces were kept (wiki/_traces.json)
    # Nothing new: the build does nothing; forced, it renders nothing again.
    assert B.build(workspace, embeddings=False).fresh
    again = B.build(workspace, embeddings=False, force=True)
    assert again.written == 0 and again.traced == 0 and _files(workspace.home) == after
    # Built from nothing (no records, no kept traces), every page is the incremental one; but
    # the concept pages, which a cold build compiles all at this position (the incremental
    # build recompiled only the stale ones: the others keep the position they were compiled
    # at, and say so).
    def pages(files: dict[str, tuple[int, str]]) -> dict[str, str]:
        return {k: v[1] for k, v in files.items() if k.endswith((".md", ".html"))
                and not k.startswith(("wiki/concepts/", "site/concepts/"))}

    pages_now = pages(after)
    for d in ("wiki", "site"):
        shutil.rmtree(workspace.home / d)
    cold = B.build(workspace, embeddings=False)
    assert cold.traced == 4 and cold.written == rep.pages
    assert pages(_files(workspace.home)) == pages_now


def test_doc_numbers_survive_builds_and_holes_are_reused_after_renumbering():
    entries = [{"u": f"tasks/t{i}.html", "t": f"task {i}", "k": "task", "s": f"goal {i}"}
               for i in range(6)]
    nums = S.numbering(entries, {})
    assert nums == list(range(6))
    kept = {e["u"]: n for e, n in zip(entries, nums, strict=True)}
    grown = [{"u": "tasks/a.html", "t": "a", "k": "task", "s": "x"}, *entries[1:]]
    assert S.numbering(grown, kept) == [6, 1, 2, 3, 4, 5]  # t0 removed: a hole at 0
    files = S.search_files(grown, kept)
    docs = S.unscript(files["d/0.js"])
    assert docs[0] is None and docs[6][0] == "tasks/a.html"
    assert S.unscript(files["meta.js"])["docs"] == 7
    far = {"tasks/t1.html": 10_000}  # holes outnumber the docs: numbered afresh
    assert S.numbering(entries[:2], far) == [0, 1]
    # Title tokens are marked (odd codes), snippet-only tokens not.
    shard = S.unscript(files[f"t/{S.shard_name('task')}.js"])
    assert shard["task"] == [3, 5, 7, 9, 11]  # docs 1-5 (t1..t5) have "task" in the title
    assert S.tokens("DeepGEMM/H20, über_fast ½") == ["deepgemm", "h20", "über", "fast", "½"]


@pytest.mark.slow
def test_the_browser_finds_a_page_through_the_shards(workspace, tmp_path):
    from .test_browser import _browser, _serve, _stop, _url

    build_ledger(workspace)
    B.build(workspace, embeddings=False)
    p, errlog = _serve(workspace.home, tmp_path, "--no-build", "--no-embeddings")
    try:
        url = _url(p, tmp_path)
        drv = _browser(tmp_path)
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as EC
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            drv.get(f"{url}/search.html?q=deepgem")  # a prefix of a title's token
            WebDriverWait(drv, 30).until(
                EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
            links = [a.get_attribute("href") for a in
                     drv.find_elements(By.CSS_SELECTOR, "#results a")]
            assert f"{url}/tasks/deepgemm-moe-h20.html" in links, links
            fetched = drv.execute_script("return performance.getEntriesByType('resource')"
                                         ".map(e => new URL(e.name).pathname)")
            assert "/search/meta.js" in fetched and "/search.json" not in fetched
            assert f"/search/t/{S.shard_name('deepgem')}.js" in fetched
            assert "(text index unavailable" not in drv.find_element(By.ID, "status").text
            # A term in no page: no results, no error.
            drv.get(f"{url}/search.html?q=zzzqqq")
            WebDriverWait(drv, 30).until(
                EC.presence_of_element_located((By.CSS_SELECTOR, "#status[data-done]")))
            assert drv.find_element(By.ID, "status").text == '0 results for "zzzqqq"'
        finally:
            drv.quit()
    finally:
        _stop(p, errlog)


def _related(p) -> list[str]:
    i = next(i for i, b in enumerate(p.blocks) if b == ("h", "Related"))
    return [row[0].path for row in p.blocks[i + 1][2]]


def test_related_ties_are_broken_by_path_whatever_the_number_of_pages(tmp_path):
    """Pages that score alike (identical facets and texts) keep their Related lists when a
    page whose path sorts after theirs arrives: ties go to the first paths, over all pages."""
    import numpy as np
    from infer_forge.projections.embed import DEFAULT_MODEL, DIMENSIONS, text_key
    from infer_forge.wiki.page import Page

    def pages(n: int) -> list[Page]:
        facets = {"model": "m", "task_type": "t", "accelerator": "a", "engine": "e",
                  "runtime_profile": "r"}
        return [Page(f"tasks/t{i:04d}", "task", "same", facets=facets, embed=f"same {i}")
                for i in range(n)]

    # Their vectors differ in the last bits only (as a BLAS sum of identical texts does).
    rnd = np.random.default_rng(0)
    base = rnd.normal(size=DIMENSIONS)
    vecs = base + rnd.normal(size=(701, DIMENSIONS)) * 1e-7 * np.linalg.norm(base)
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
    keys = [text_key(B.embed_text(p)) for p in pages(701)]
    np.savez(tmp_path / "_embeddings.npz", model=np.array(DEFAULT_MODEL), keys=np.array(keys),
             vecs=vecs)
    settings = B.WikiSettings(embeddings=True)
    small, big = pages(700), pages(701)
    B.add_related(small, settings, tmp_path)
    B.add_related(big, settings, tmp_path)
    first = [f"tasks/t{i:04d}" for i in range(6)]
    for p in small[:3] + small[-3:] + small[600:603]:  # across the 512-row chunks
        assert _related(p) == [x for x in first if x != p.path][:5], p.path
    assert [_related(p) for p in small] == [_related(p) for p in big[:700]]
    assert _related(big[700]) == first[:5]
