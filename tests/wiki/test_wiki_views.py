"""The journal's compare and history views (wiki/compare_page.py, wiki/history_page.py) in a
site built by `wiki build`: on the hand-built index ledger (tests/helpers/index_ledger.py) and
on a task whose runs stored per-request records (tests/helpers/compare_records.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from infer_forge.wiki import build as B
from infer_forge.wiki.page import parse_frontmatter

from tests.helpers.compare_records import TASK, build_records
from tests.helpers.index_ledger import build as build_ledger

E_NOTATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE][+-]?\d+")


def _md(home: Path, page: str) -> str:
    return (home / "wiki" / f"{page}.md").read_text()


def _without_svg(text: str) -> str:
    return re.sub(r"<svg.*?</svg>", "", text, flags=re.S)


def _heads(md: str) -> list[str]:
    return re.findall(r"^## (.+)$", md, re.M)


@pytest.fixture
def planted(workspace):
    build_ledger(workspace)
    return workspace


def test_compare_pages_of_the_hand_built_ledger(planted):
    rep = B.build(planted, embeddings=False)
    home = planted.home
    idx = _md(home, "compare")
    assert parse_frontmatter(idx)["type"] == "index"
    for tid in ("deepgemm-moe-h20", "tune-qwen-h200", "tune-tiny-cpu"):
        assert f"[[compare/{tid}\\|" in idx, idx  # a link in a table cell
        assert (home / "site" / "compare" / f"{tid}.html").is_file()
    assert "qwen-h200-rev2" not in idx  # one measured block: nothing to compare
    md = _md(home, "compare/tune-qwen-h200")
    fm = parse_frontmatter(md)
    assert (fm["type"], fm["a"], fm["b"], fm["b_is"]) == ("compare", "b1", "b2", "accepted")
    assert _heads(md)[:4] == ["What differed", "Gated metrics", "Latency distributions",
                              "Other metrics"]
    assert re.search(r"^\| candidate \| baseline \| chunked_prefill_size=16384 \|$", md, re.M), md
    [tput] = [ln for ln in md.splitlines() if ln.startswith("| output_throughput |")]
    cells = [c.strip() for c in tput.strip("|").split("|")]
    assert cells[1] == "throughput"
    # Medians with their intervals (markdown escapes the brackets), delta, ratio, the better
    # side, beyond noise, each side's verdicts.
    assert cells[2:] == ["2,000 \\[1,990 – 2,010\\] (n 3)", "2,200 \\[2,190 – 2,210\\] (n 3)",
                         "200 (+10 %)", "1.1× \\[1.09 – 1.111\\]", "B", "yes", "—",
                         "throughput: pass"]
    assert "Per-request records: A 0 of 3 runs, B 0 of 3 runs." in md
    assert md.count("the run stored no records artifact") == 6
    assert "<svg" not in md  # no records: no distribution drawn
    other = md[md.index("## Other metrics"):]
    assert "| median_ttft_ms |" in other
    for page in ("compare", "compare/tune-qwen-h200", "compare/deepgemm-moe-h20"):
        text = _without_svg(_md(home, page))
        assert not E_NOTATION.search(text), (page, E_NOTATION.search(text))
    # The task's page reaches its comparison (its backlinks).
    assert "[[compare/tune-qwen-h200|Compare tune-qwen-h200" in _md(home, "tasks/tune-qwen-h200")
    home_md = _md(home, "index")
    assert "[[compare|Compare blocks]]" in home_md and "[[history|" in home_md
    # The history view: one page per point (profile revision left out), an index of them.
    hidx = _md(home, "history")
    pages = sorted((home / "wiki" / "history").glob("*.md"))
    assert len(pages) == 3 and hidx.count("[[history/") == 3
    [qwen] = [p for p in pages if "qwen-h200@2" in p.read_text()]
    h = qwen.read_text()
    assert parse_frontmatter(h)["metric"] == "output_throughput"
    assert "<svg" in h and "measured block, in ledger order" in h
    rows = [ln for ln in h.splitlines() if re.match(r"^\| \d \|", ln)]
    assert [r.split("|")[-2].strip() for r in rows] == ["baseline", "accepted", "baseline"]
    assert "qwen-h200@1" in rows[1] and "2,200" in rows[1] and "qwen-h200@2" in rows[2]
    assert "higher is better" in h and "2 runtime profile revisions" in h
    # The same index builds the same pages: a forced build writes nothing.
    again = B.build(planted, embeddings=False, force=True)
    assert again.written == 0 and again.pages == rep.pages


def test_compare_page_draws_the_latency_cdfs_from_the_records(workspace):
    build_records(workspace)
    B.build(workspace, embeddings=False)
    home = workspace.home
    md = _md(home, f"compare/{TASK}")
    html = (home / "site" / "compare" / f"{TASK}.html").read_text()
    assert html.count("<svg") == 3 and md.count("<svg") == 3
    for xlabel, a, b in (("TTFT (ms)", 40, 44), ("ITL (ms)", 160, 200),
                         ("E2E latency (ms)", 40, 20)):
        assert xlabel in html
        assert f"A b1 (n {a})" in html and f"B b2 (n {b})" in html, (xlabel, a, b)
    assert "fraction of requests ≤ x" in html and "fraction of token gaps ≤ x" in html
    assert f"{TASK}: TTFT CDF, b1 vs b2" in html
    # The percentiles beside the drawings, and what had no records.
    assert "| TTFT (ms) | A | 40 | 145 | 185 | 195 |" in md
    assert "| A | b1-m3 | the run stored no records artifact |" in md
    assert md.count("bench_serving stores no per-request E2E latency") == 3
    assert "Per-request records: A 2 of 3 runs, B 4 of 4 runs." in md
    assert not E_NOTATION.search(_without_svg(md))
