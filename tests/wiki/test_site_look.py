"""The journal site as a reader sees it, in a real browser (headless Chromium, one session):
every page kind opened from the built files (`file://`, the path `forge wiki build` prints)
at 1280 px and 390 px wide, a screenshot of each in the test's output folder, no page wider
than the window, no number in e-notation, and search answering from `file://`.

A page kind is one line of `PAGES`: its name and how to find its file in the built site."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from infer_forge.harness.graph.commands import define_graph
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import ENDPOINTS_STREAM
from infer_forge.wiki import build as B
from infer_forge.wiki.answers import file_answer
from infer_forge.wiki.ask import ask

from tests.helpers.index_ledger import build as build_ledger
from tests.wiki.test_browser import _browser
from tests.wiki.test_site_content import _tool_output_and_engine
from tests.wiki.test_wiki_graph import _graph_file

pytestmark = pytest.mark.slow

WIDTHS = (1280, 390)
E_NOTATION = re.compile(r"\b\d(\.\d+)?e[+-]\d+\b", re.IGNORECASE)


def _first(site: Path, pattern: str, but: str = "") -> str:
    found = sorted(f.relative_to(site).as_posix() for f in site.glob(pattern)
                   if f.name != but)
    assert found, pattern
    return found[0]


# Page kind -> its page (a path under the site, with a query where the page needs one).
PAGES: dict[str, Callable[[Path], str]] = {
    "home": lambda site: "index.html",
    "task": lambda site: "tasks/deepgemm-moe-h20.html",
    "decision": lambda site: _first(site, "decisions/deepgemm-moe-h20-rejected-*.html"),
    "concept": lambda site: _first(site, "concepts/*.html", but="index.html"),
    "concepts": lambda site: "concepts/index.html",
    "compare": lambda site: _first(site, "compare/*.html"),
    "compare index": lambda site: "compare.html",
    "history": lambda site: _first(site, "history/*.html"),
    "history index": lambda site: "history.html",
    "point": lambda site: _first(site, "points/*.html"),
    "profile": lambda site: _first(site, "profiles/*.html"),
    "model": lambda site: _first(site, "models/*.html"),
    "dimension": lambda site: _first(site, "dims/*.html"),
    "graph": lambda site: "graphs/mini.html",
    "graphs index": lambda site: "graphs.html",
    "artifact": lambda site: _first(site, "artifacts/*.html"),
    "endpoints": lambda site: "endpoints.html",
    "answer": lambda site: _first(site, "answers/*.html", but="index.html"),
    "answers index": lambda site: "answers/index.html",
    "log": lambda site: "log.html",
    "concurrency": lambda site: "concurrency.html",
    "search": lambda site: "search.html?q=deepgemm",
}

LOOK = """const d = document.documentElement, s = document.getElementById('status');
return {scroll: d.scrollWidth, client: d.clientWidth, inner: window.innerWidth,
        height: d.scrollHeight, text: document.body.innerText,
        nav: document.querySelectorAll('header nav a').length,
        status: s ? s.textContent : null, done: s ? s.hasAttribute('data-done') : true};"""


def test_every_page_kind_fits_both_widths_and_reads_well(workspace, tmp_path):
    build_ledger(workspace)
    _tool_output_and_engine(workspace)  # a tool's output: an artifact page
    define_graph(workspace, _graph_file(tmp_path))
    t1 = datetime.now(UTC)
    workspace.ledger.append(ENDPOINTS_STREAM, [E.EndpointSummarized(  # the endpoints page
        url="http://127.0.0.1:30000", start=t1 - timedelta(minutes=1), end=t1, interval_s=1.0,
        samples=60, missed=0, errors=0, last_error="", actor=E.Actor.tool("forge-test"))])
    first = B.build(workspace, embeddings=False)
    assert first.concepts > 0  # the build compiled the concept pages itself
    file_answer(workspace, ask(workspace, "why was deep_gemm rejected?", embeddings=False))
    B.build(workspace, embeddings=False)  # with the filed answer's pages
    site = workspace.home / "site"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"\nscreenshots: {shots}")
    drv = _browser(tmp_path)
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        for width in WIDTHS:
            for kind, where in PAGES.items():
                drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                    "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
                path, _, query = where(site).partition("?")
                url = (site / path).as_uri() + (f"?{query}" if query else "")
                drv.get(url)
                WebDriverWait(drv, 30).until(lambda d: d.execute_script(LOOK)["done"])
                st = drv.execute_script(LOOK)
                assert st["inner"] == width, (kind, width, st["inner"])
                assert st["scroll"] <= st["client"] + 1, (kind, width, st["scroll"])
                shown = E_NOTATION.findall(st["text"])
                assert not shown, (kind, width, E_NOTATION.search(st["text"]))
                assert st["nav"] >= 3, (kind, "the site's navigation")
                # The whole page in one picture: the window as tall as the page.
                drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                    "width": width, "height": min(st["height"], 6000),
                    "deviceScaleFactor": 1, "mobile": False})
                shot = shots / f"{kind}-{width}.png"
                assert drv.save_screenshot(str(shot)) and shot.stat().st_size > 1000
                print(f"  {shot}")
                if kind == "search":  # from file://: the index loads as scripts
                    assert "unavailable" not in st["status"], st["status"]
                    assert re.match(r"[1-9]\d* results? for", st["status"]), st["status"]
                    assert "deepgemm-moe-h20" in st["text"]
        # Dark mode by the reader's setting: the same page on a dark background.
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        drv.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        drv.get((site / PAGES["task"](site)).as_uri())
        bg = drv.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert bg == "rgb(20, 23, 27)", bg
        shot = shots / "task-1280-dark.png"
        assert drv.save_screenshot(str(shot))
        print(f"  {shot}")
    finally:
        drv.quit()
