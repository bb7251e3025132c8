"""The wiki as a reader sees it: markdown rendered by markdown-it (no literal `**`), plain text
shown exactly as typed in the site and in any CommonMark view of the journal, and
throughput-vs-TTFT plots drawn by matplotlib with points labelled by block and verdict and the
SLO drawn. Safety of the same pages: tests/wiki/test_wiki_safety.py, test_browser.py."""

from __future__ import annotations

import random
import re
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from infer_forge.wiki import build as B
from infer_forge.wiki import plot as P
from infer_forge.wiki.page import Page, code, link, md_escape, strong, text, to_html, to_markdown
from infer_forge.wiki.pages import slo_lines, verdict_of
from infer_forge.wiki.snapshot import Snapshot
from markdown_it import MarkdownIt

from tests.conftest import run_forge
from tests.helpers.index_ledger import build as build_ledger

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def built(workspace):
    planted = build_ledger(workspace)
    B.build(workspace, embeddings=False)
    return workspace, planted


def site_page(ws, path: str) -> str:
    return (ws.home / "site" / f"{path}.html").read_text(encoding="utf-8")


def svg_texts(html: str) -> list[list[str]]:
    """The texts drawn in each <svg> of a page."""
    out = []
    for m in re.finditer(r"<svg.*?</svg>", html, re.S):
        root = ET.fromstring(m.group())
        out.append(["".join(t.itertext()) for t in root.iter(f"{SVG}text")])
    return out


# --- markdown rendered ------------------------------------------------------------------


def test_pages_render_their_markdown(built):
    ws, planted = built
    task = site_page(ws, "tasks/deepgemm-moe-h20")
    assert "<p><strong>Goal:</strong> Try the DeepGEMM MoE runner" in task
    assert "<strong>Status:</strong> exited" in task
    assert "**" not in task and "`" not in task.split("<svg", 1)[0]
    assert re.search(r"<table>\s*<thead>\s*<tr>\s*<th>dimension</th>", task)
    assert '<td><span class="fail">fail</span></td>' in task  # verdict cells keep their colour
    dec = site_page(ws, f"decisions/deepgemm-moe-h20-rejected-"
                        f"{planted['decisions']['deepgemm-moe-h20']}")
    assert ('<strong>Task:</strong> <a href="../tasks/deepgemm-moe-h20.html">deepgemm-moe-h20'
            '</a>') in dec
    assert "<strong>Candidate:</strong>" in dec and "**" not in dec
    point = site_page(ws, "points/" + planted["points"]["qwen-h20"].removeprefix("sha256:"))
    assert f"Deployment point <code>{planted['points']['qwen-h20']}</code>" in point
    profile = site_page(ws, "profiles/qwen-h200-r1")
    assert "Engine <strong>sglang</strong>, profile hash <code>sha256:" in profile
    model = site_page(ws, "models/qwen3-30b-a3b~155aaf9a3362ee55")
    assert "Model <strong>Qwen3-30B-A3B</strong>; runtime profiles:" in model
    # The journal keeps the markdown the site renders.
    md = (ws.home / "wiki" / "tasks" / "deepgemm-moe-h20.md").read_text()
    assert "**Goal:** Try the DeepGEMM MoE runner" in md
    assert "| b2 | fail | correctness | token_match | fail | 0.61 | 0.99 |" in md


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def _seen(html: str) -> tuple[set[str], str]:
    a = _Text()
    a.feed(html)
    a.close()
    return set(a.tags), " ".join("".join(a.text).split())


ALPHABET = list("\\`*_[]<>&#!|~-+=.):'\"(/ \t\n") + ["a", "b", "1", "é", "&amp;", "&#65;",
                                                     "<b>", "http://x", "***", "---", "1. ",
                                                     "    ", "\u00a0", "  \n"]


def _samples(n: int) -> list[str]:
    rnd = random.Random(10)
    out = ["**bold**", "_em_", "*", "# head", "> quote", "- item", "+ item", "1. one", "2) two",
           "---", "===", "```", "~~~", "    code", "<b>x</b>", "&amp;", "&#x41;", "a_b_c",
           "[x](javascript:y)", "![i](x.png)", "<https://e.example>", "[[tasks/a|a]]",
           "a\\", "x  ", "|a|b|", "\\*", "__init__", "<!-- c -->", "[r]: /u", "`a`"]
    for _ in range(n):
        out.append("".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 12))))
    return out


def _squeezed(s: str) -> str:
    return "".join(s.split())


STRUCTURE = {"h2", "p", "ul", "li", "div", "table", "thead", "tbody", "tr", "th", "td"}


def test_plain_text_shows_as_typed_on_the_site_and_in_the_journal():
    """Whatever a user typed: the site shows exactly it (no markup, link or tag formed), and
    so does any CommonMark renderer of the journal's markdown (one that passes raw HTML
    through, as viewers do), in every kind of block."""
    viewer = MarkdownIt("commonmark").enable("table")
    for s in _samples(400):
        want = _squeezed(s)
        p = Page("tasks/t", "task", "title")
        p.add("h", s)
        p.add("p", text(s, link("tasks/t", s), strong(s), " ", s))
        p.add("list", [s, text(s)])
        p.add("table", [s], [(s,), (text(link("nowhere!", s), s),)])
        body = to_html(p, [], known={"tasks/t"}).split("</p>", 1)[1]  # after title and meta
        tags, seen = _seen(body)
        assert tags <= STRUCTURE | {"a", "strong"}, (s, tags)
        assert _squeezed(seen) == want * 11, (s, seen)
        assert body.count("<a ") == 1 and body.count("<strong>") == (1 if want else 0), s
        for block in (("h", s), ("p", s), ("list", [s, s]), ("table", [s], [(s,)])):
            md = to_markdown(Page("tasks/t", "task", "t", blocks=[block])).split("\n# t\n")[1]
            tags, seen = _seen(viewer.render(md))
            assert tags <= STRUCTURE, (s, block[0], tags, md)
            assert _squeezed(seen) == want * (1 + (block[0] in ("list", "table"))), (s, md)
    assert md_escape("token_match 0.61 < 0.99") == "token_match 0.61 < 0.99"  # still readable


def test_markup_segments_render_once_and_escape_their_content():
    p = Page("index", "index", "t")
    p.add("p", text(strong("Goal:"), " ", code("a`b|c"), " ", strong("<i>*x*</i>"), "."))
    p.add("table", ["c"], [(text(code("x|y"), " ", strong("s|t")),)])
    html = to_html(p, [])
    assert "<strong>Goal:</strong> <code>a`b|c</code> <strong>&lt;i&gt;*x*&lt;/i&gt;</strong>." \
        in html
    assert "<td><code>x|y</code> <strong>s|t</strong></td>" in html
    with pytest.raises(TypeError):
        f"{strong('x')}"  # noqa: B018


# --- plots ------------------------------------------------------------------------------


def test_task_plot_labels_points_by_block_and_verdict_and_draws_the_slo(built):
    ws, _ = built
    (texts,) = svg_texts(site_page(ws, "tasks/deepgemm-moe-h20"))
    assert {"b1", "b2", "baseline", "rejected", "TTFT SLO p99 2,000 ms"} <= set(texts), texts
    assert "unjudged" not in texts and "qwen-h20@1" not in texts  # one task, one profile
    (texts,) = svg_texts(site_page(ws, "tasks/tune-qwen-h200"))
    assert {"b1", "b2", "baseline", "accepted"} <= set(texts), texts
    # A page over several tasks: task/block labels, shapes by runtime profile.
    (texts,) = svg_texts(site_page(ws, "index"))
    assert {"tune-tiny-cpu/b2", "deepgemm-moe-h20/b1", "qwen-h200@1", "qwen-h20@1",
            "tiny-cpu@1", "accepted", "rejected", "baseline"} <= set(texts), texts
    md = (ws.home / "wiki" / "tasks" / "deepgemm-moe-h20.md").read_text()
    assert "<svg" in md and "TTFT SLO p99 2,000 ms" in md


def _snap(tasks=(), decisions=(), points=()) -> Snapshot:
    return Snapshot(0, list(tasks), {}, {}, {}, list(decisions), {}, list(points), [], {})


def test_slo_lines_and_verdicts_from_what_the_index_holds():
    point = {"scenario": {"slo": {"ttft_ms": {"p50": 500, "p99": 2000.5},
                                  "throughput_floor": 100}}}
    t = {"point_hash": "sha256:p", "definition": '{"contract": {"gates": ['
         '{"name": "slo", "metric": "median_ttft_ms", "at_most": 450},'
         '{"name": "rel", "metric": "median_ttft_ms", "vs_baseline": "ratio", "at_most": 1.1},'
         '{"name": "floor", "metric": "output_throughput", "at_least": 120}]}}'}
    snap = _snap([t], points=[{"point_hash": "sha256:p", "point": point}])
    got = {(ln.axis, ln.value, ln.label) for ln in slo_lines(snap, t)}
    assert got == {("x", 500.0, "TTFT SLO p50 500 ms"), ("x", 2000.5, "TTFT SLO p99 2,000.5 ms"),
                   ("y", 100.0, "throughput floor 100 tok/s"), ("x", 450.0, "gate slo: ≤ 450 ms"),
                   ("y", 120.0, "gate floor: ≥ 120 tok/s")}
    # An inline point in the definition; whatever an old ledger holds, no line and no error.
    inline = {"definition": {"point": point}, "point_hash": None}
    assert len(slo_lines(_snap(), inline)) == 3
    for bad in ({"definition": "not json", "point_hash": "x"}, {"definition": None},
                {"definition": {"point": {"scenario": {"slo": {"ttft_ms": [1],
                                                               "throughput_floor": "fast"}}},
                                "contract": {"gates": [None, {"metric": "median_ttft_ms",
                                                              "at_most": True}]}}},
                {"definition": {"point": {"scenario": {"slo": {"ttft_ms": {"p50": None}}}}}}):
        assert slo_lines(_snap(), bad) == [], bad
    decisions = [{"task_id": "t", "block_id": "b2", "candidate_key": '{"a":1}', "kind": "rejected"},
                 {"task_id": "t", "block_id": "b2", "candidate_key": '{"a":1}', "kind": "accepted"},
                 {"task_id": "t", "block_id": None, "candidate_key": '{"c":3}', "kind": "rejected"}]
    snap = _snap(decisions=decisions)
    assert verdict_of(snap, "t", "b2", '{"a":1}') == "accepted"  # the latest decision
    assert verdict_of(snap, "t", "b1", "{}") == "baseline"
    assert verdict_of(snap, "t", None, None) == "baseline"
    assert verdict_of(snap, "t", "b3", '{"b":2}') == "unjudged"
    assert verdict_of(snap, "t", "b4", '{"c":3}') == "rejected"  # no block: by candidate
    assert verdict_of(snap, "u", "b2", '{"a":1}') == "unjudged"  # another task's decision


PAYLOAD = "</text><script>alert(1)</script>"


def _texts(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter(f"{SVG}text")]


def test_plot_text_is_escaped_and_cleaned():
    labels = [PAYLOAD, "$\\frac{1}{0$", "a\x00b\x1bc\u202ed", "\ud800x", "[[index|x]]",
              "<b>bold</b>", "&amp;"]
    pts = [P.Point(float(i), float(i * i), lab, "rejected", "g") for i, lab in enumerate(labels)]
    svg = P.plot_svg(pts, xlabel="x <i>", ylabel="y", title=PAYLOAD,
                     lines=[P.Line("x", 3, f"SLO {PAYLOAD}")])
    assert svg.startswith("<svg") and "<script" not in svg and "[[" not in svg
    texts = _texts(svg)
    for want in ("</text><script>alert(1)…", "$\\frac{1}{0$", "a b c d", " x", "[[index|x]]",
                 "<b>bold</b>", "&amp;", "x <i>", "SLO </text><script>alert(1)…"):
        assert any(want.strip() == t.strip() or want.strip() in t for t in texts), (want, texts)
    assert not any(re.search(r"[\x00-\x1f\u202e\ud800]", t) for t in texts)


@pytest.mark.parametrize("tampered", [
    '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><g><rect onclick="x()"/></g></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">'
    '<use xlink:href="https://evil.example/x.svg#a"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><a href="javascript:x"><text>t</text></a></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><image href="x.png"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><g clip-path="url(https://e.example/#p)"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><g clip-path="url(#nowhere)"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><foreignObject><p>x</p></foreignObject></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><text>unclosed</svg>',
    "not a drawing",
])
def test_a_drawing_that_is_not_plain_shapes_is_refused(tampered):
    assert P._checked(tampered) == ""


def test_plots_take_any_points():
    def draw(points, **kw):
        return P.plot_svg(points, xlabel="x", ylabel="y", title="t", **kw)

    assert draw([]) == ""
    assert draw([P.Point(float("nan"), 1.0), P.Point(None, 2.0), P.Point("3", 4.0),
                 P.Point(True, 1.0), P.Point(1.0, float("inf"))]) == ""
    one = draw([P.Point(2.0, 2.0, None or "—", None)])  # a single point, no verdict, no block
    assert one and "—" in _texts(one)
    same = draw([P.Point(5.0, 5.0, "b1", "accepted"), P.Point(5.0, 5.0, "b2", "rejected")])
    assert "b1, b2" in _texts(same)  # equal points: one label naming both
    assert draw([P.Point(1e-299, 1e299, "lo", None), P.Point(1e299, -1e299, "hi", None)])
    lines = draw([P.Point(1.0, 1.0, "b1", "baseline")],
                 lines=[P.Line("x", float("nan"), "nan"), P.Line("y", None, "none"),
                        P.Line("z", 1.0, "bad axis"), P.Line("x", 2.0, "ok")])
    texts = _texts(lines)
    assert "ok" in texts and not {"nan", "none", "bad axis"} & set(texts)
    many = draw([P.Point(float(i), float(i % 7), f"b{i}", "unjudged", f"rp{i % 20}")
                 for i in range(200)])
    texts = _texts(many)
    assert "b1" not in texts and "… 8 more" in texts and "rp0" in texts  # no clutter
    assert P.scatter_svg({"a": [(1.0, 2.0, "p")], "b": [(2.0, 1.0, "q")]}, xlabel="x",
                         ylabel="y", title="t")


def test_drawings_are_deterministic_and_kept_between_builds(built, tmp_path):
    ws, _ = built
    home = ws.home
    first = {f.relative_to(home).as_posix(): f.read_bytes()
             for d in ("wiki", "site") for f in (home / d).rglob("*.*")
             if f.suffix in (".md", ".html")}
    cache = home / "wiki" / B.PLOT_CACHE
    kept = P.PlotCache(cache)
    assert len(kept.kept) >= 8 and all(v.startswith("<svg") for v in kept.kept.values())
    # Drawn again from nothing, in another process: the same bytes.
    for d in ("wiki", "site"):
        shutil.rmtree(home / d)
    ws.close()
    r = run_forge("wiki", "build", "--no-embeddings", home=home)
    assert r.returncode == 0, r.stderr
    again = {f.relative_to(home).as_posix(): f.read_bytes()
             for d in ("wiki", "site") for f in (home / d).rglob("*.*")
             if f.suffix in (".md", ".html")}
    assert again == first
    # A cache entry someone changed is checked and drawn again, not shown.
    data = P.PlotCache(cache)
    key = next(k for k, v in data.kept.items() if v)
    data.kept[key] = data.kept[key].replace("<g ", '<g onload="alert(1)" ', 1)
    pts = [P.Point(1.0, 2.0, "b1", "baseline")]
    c = P.PlotCache(tmp_path / "plots.json")
    svg = c.plot_svg(pts, xlabel="x", ylabel="y", title="t")
    c.save()
    c2 = P.PlotCache(tmp_path / "plots.json")
    assert c2.plot_svg(pts, xlabel="x", ylabel="y", title="t") == svg and c2.drawn == 0
    (key,) = c2.kept
    c2.kept[key] = svg.replace("<g ", '<g onload="alert(1)" ', 1)
    assert c2.plot_svg(pts, xlabel="x", ylabel="y", title="t") == svg
    assert "onload" not in svg


def test_the_site_is_rendered_by_a_markdown_library(tmp_path: Path):
    """The page renderer is markdown-it with raw HTML, images and autolinks off: a link only
    to a site page."""
    from infer_forge.wiki.page import MD

    html = MD.render("<b>x</b> ![i](x.png) <https://e.example> [a](https://e.example) "
                     "[b](../tasks/b.html)", {"prefix": "../", "known": {"tasks/b"}})
    assert "<b>" not in html and "<img" not in html and 'href="https' not in html
    assert '<a href="../tasks/b.html">b</a>' in html
    html = MD.render("[b](../tasks/c.html)", {"prefix": "../", "known": {"tasks/b"}})
    assert "<a" not in html and ">b<" in html  # not a built page: its label
