"""What a wiki build reuses to stay fast, and that reusing it changes nothing a reader sees:
one matplotlib figure kept between drawings, the site renderer's shortcuts through
markdown-it's inline parser, and pages not rendered again while what they are made of is
unchanged (`build.Rendered`)."""

from __future__ import annotations

import json

import pytest
from infer_forge.wiki import build as B
from infer_forge.wiki import page as PG
from infer_forge.wiki import plot as P
from infer_forge.wiki.page import Page, code, link, strong, text, to_html
from markdown_it import MarkdownIt

from tests.helpers.index_ledger import build as build_ledger

from .test_wiki_render import _samples

# --- one figure for every drawing -------------------------------------------------------


def _plots() -> list[dict]:
    return [
        {"points": [P.Point(120.0 + i, 1500.0 - 30 * i, f"b{i}", v)
                    for i, v in enumerate(["baseline", "accepted", "rejected", None, "x"])],
         "lines": [P.Line("x", 150.0, "TTFT SLO p99 150 ms"), P.Line("y", 1400.0, "floor")],
         "title": "one task"},
        {"points": [P.Point(float(i), 10.0 ** (i % 6), f"t{i}/b1", "accepted", f"rp{i % 3}")
                    for i in range(40)], "lines": [], "title": "several profiles, many points"},
        {"points": [P.Point(-3e5, 0.002, "neg", None, "a"), P.Point(7e5, 0.0025, "pos", None, "b")],
         "lines": [P.Line("y", 0.004, "above every point")], "title": "no verdicts"},
        {"points": [P.Point(2.0, 2.0, "only", "baseline")], "lines": [], "title": "one point"},
        {"points": [P.Point(1e6 + i / 2, 1e-7 * i, f"o{i}", "rejected") for i in range(4)],
         "lines": [], "title": "axes with an offset and a scale"},
    ]


def _draw(spec: dict) -> str:
    return P.plot_svg(spec["points"], xlabel="median TTFT (ms)",
                      ylabel="output throughput (tok/s)", title=spec["title"],
                      lines=spec["lines"])


def test_a_drawing_does_not_depend_on_the_drawings_before_it(monkeypatch):
    specs = _plots()
    fresh = []
    for spec in specs:  # each on a new figure
        P._CANVAS.clear()
        fresh.append(_draw(spec))
    assert all(s.startswith("<svg") for s in fresh)
    assert len(set(fresh)) == len(fresh)
    P._CANVAS.clear()
    for order in (specs, specs[::-1], specs[1:] + specs[:1]):  # one figure, any order
        assert [_draw(s) for s in order] == [fresh[specs.index(s)] for s in order]
    # What one drawing added is not in the next: its labels, lines and legend are gone.
    import xml.etree.ElementTree as ET

    def texts(svg: str) -> set[str]:
        return {"".join(t.itertext()) for t in
                ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")}

    assert "only" in texts(fresh[3]) and not {"b1", "floor", "rp0", "neg"} & texts(fresh[3])
    # Tiny values tick as the journal writes numbers: no offset, no exponent (numbers.py).
    assert "0.0000001" in texts(fresh[4]), texts(fresh[4])
    assert not any("e6" in t or "e−7" in t for t in texts(fresh[4])), texts(fresh[4])
    assert not any("1e" in t for t in texts(fresh[0]))  # no offset left from another plot
    # A drawing that fails midway gives no plot and leaves no half-drawn figure behind.
    calls = []

    def broken(axis, values):
        calls.append(values)
        raise ValueError("cannot scale")

    monkeypatch.setattr(P, "_limits", broken)
    assert _draw(specs[0]) == "" and calls and not P._CANVAS
    monkeypatch.undo()
    assert [_draw(s) for s in specs] == fresh


def test_the_y_label_clears_the_widest_tick_label():
    """The axis labels have fixed places (matplotlib would measure every tick label): the
    y label moves left with the width of the tick labels, so that they never overlap."""
    def label_x(ys: list[float]) -> float:
        P._draw([P.Point(float(i), y) for i, y in enumerate(ys)], [], "x", "y", "t", 6.4, 4.0)
        _, ax = P._CANVAS[(6.4, 4.0)]
        return ax.yaxis.label.get_position()[0]

    narrow, wide = label_x([1.0, 5.0]), label_x([100000.0, 900000.0])
    assert wide < narrow < 0


# --- markdown-it: shortcuts give the parser's own tokens ---------------------------------


def _plain_site_markdown(disable_more: bool) -> MarkdownIt:
    """The site's renderer as markdown-it makes it, without the inline shortcuts (and, with
    `disable_more` False, with every CommonMark block rule)."""
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.validateLink = lambda url: PG.SITE_HREF.fullmatch(url) is not None  # type: ignore
    md.enable("table")
    md.disable(["image", "autolink", "html_inline", "html_block", "reference"]
               + (["code", "blockquote", "hr", "lheading"] if disable_more else []))
    for name, rule in (("text", PG._render_text), ("code_inline", PG._render_code_inline),
                       ("code_block", PG._render_code_block), ("fence", PG._render_code_block),
                       ("link_open", PG._render_link_open),
                       ("link_close", PG._render_link_close)):
        md.add_render_rule(name, rule)
    return md


def _site_sources(s: str) -> list[str]:
    link_md = PG._site_link("../", {"tasks/t"})
    blocks = [("h", s), ("p", text(s, link("tasks/t", s), strong(s), " ", code(s), s)),
              ("list", [s, text(link("tasks/u", s), s), "1500", "b1"]),
              ("table", [s, "n"], [(s, 1.5), (text(link("tasks/t", s)), "pass"),
                                   ("plain cell", None)]),
              ("code", s)]
    return ["\n".join(PG._block_md(b, link_md)) for b in blocks]


def test_the_site_renderers_shortcuts_make_the_parsers_own_tokens():
    site = PG._markdown_it()
    plain = _plain_site_markdown(disable_more=True)
    full = _plain_site_markdown(disable_more=False)
    env = {"prefix": "../", "known": {"tasks/t"}}
    hits = 0
    for s in _samples(300) + ["plain words 1.5", "{\"engine.x\":16384}", "a_b", "no-progress"]:
        for src in _site_sources(s):
            want = plain.parse(src, dict(env))
            for _ in range(2):  # parsed, then from the renderer's memo of inline texts
                assert site.parse(src, dict(env)) == want, src
                html = site.render(src, dict(env))
                assert html == plain.render(src, dict(env)), src
            # The block rules left off never change forge's markdown.
            assert html == full.render(src, dict(env)), src
            hits += any(t.type == "inline" and PG._INLINE_MARKUP.search(t.content) is None
                        for t in want)
    assert hits > 100  # the shortcut was taken


def test_the_renderers_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(PG, "INLINE_MEMO", 3)
    PG._markdown_it.cache_clear()
    try:
        md = PG._markdown_it()
        got = [md.render(f"x\\_{i} *{i}*", {}) for i in range(10)] * 2
        assert got[:10] == got[10:] and got[3] == "<p>x_3 <em>3</em></p>\n"
    finally:
        PG._markdown_it.cache_clear()


# --- pages rendered again only when they changed ---------------------------------------


@pytest.fixture
def built(workspace):
    build_ledger(workspace)
    B.build(workspace, embeddings=False)
    return workspace


def _files(home) -> dict[str, bytes]:
    return {f.relative_to(home).as_posix(): f.read_bytes()
            for d in ("wiki", "site") for f in (home / d).rglob("*")
            if f.suffix in (".md", ".html")}


def _count_renders(monkeypatch) -> list[str]:
    rendered: list[str] = []
    real = B.to_html

    def counting(page, *a, **kw):
        rendered.append(page.path)
        return real(page, *a, **kw)

    monkeypatch.setattr(B, "to_html", counting)
    return rendered


def test_a_forced_build_renders_only_pages_that_changed(built, monkeypatch):
    home = built.home
    first = _files(home)
    rendered = _count_renders(monkeypatch)
    rep = B.build(built, embeddings=False, force=True)
    assert rendered == [] and rep.written == 0 and rep.unchanged == rep.pages
    assert _files(home) == first
    # A file edited or lost since it was written is rendered and written again.
    (home / "site" / "index.html").write_text("edited")
    (home / "wiki" / "log.md").unlink()
    rep = B.build(built, embeddings=False, force=True)
    assert sorted(rendered) == ["index", "log"] and rep.written == 2
    assert _files(home) == first
    # A damaged record: every page rendered, the same bytes, nothing rewritten.
    for damaged in ("not json", "[]", '{"index": ["a"], "log": 3}'):
        (home / "wiki" / B.RENDERED).write_text(damaged)
        rendered.clear()
        rep = B.build(built, embeddings=False, force=True)
        assert len(rendered) == rep.pages and rep.written == 0
        assert _files(home) == first
    # Another renderer (the page module's code, the libraries): every page rendered again.
    monkeypatch.setattr(B, "_renderer", lambda: "another renderer")
    rendered.clear()
    rep = B.build(built, embeddings=False, force=True)
    assert len(rendered) == rep.pages and _files(home) == first
    kept = json.loads((home / "wiki" / B.RENDERED).read_text())
    assert set(kept) == {p.removesuffix(".html").removeprefix("site/")
                         for p in first if p.startswith("site/")} - {"search"}


def test_what_a_page_is_made_of_includes_which_links_reach_a_built_page(tmp_path):
    def source(page: Page, known: set[str]) -> str:
        return B.Rendered(tmp_path / "r.json", known).source(page)

    p = Page("tasks/a", "task", "A")
    p.add("p", text("see ", link("tasks/b", "b")))
    base = source(p, {"tasks/a", "tasks/b"})
    assert source(p, {"tasks/a", "tasks/b", "tasks/c"}) == base  # another page: same
    assert source(p, {"tasks/a"}) != base  # its link's page is gone: rendered again
    # Each value shows its type: a Text is not a tuple, 1 is not 1.0 nor "1".
    cells = [("x", "y"), text("x", "y"), 1, 1.0, "1", None, "None", link("tasks/b", "1")]
    digests = set()
    for cell in cells:
        q = Page("tasks/a", "task", "A")
        q.add("table", ["c"], [(cell,)])
        digests.add(source(q, {"tasks/b"}))
    assert len(digests) == len(cells)
    q = Page("tasks/a", "task", "A", position=2)
    q.add("p", text("see ", link("tasks/b", "b")))
    assert source(q, {"tasks/a", "tasks/b"}) != base  # its ledger position is shown too
    assert to_html(q, []) != to_html(p, [])
