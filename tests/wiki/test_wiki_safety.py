"""Nothing a user types runs script in the wiki, links off the site, or breaks a build.

Script, attribute breakouts, `[[javascript:…]]`, off-site and `..` links are planted in every
user-text field through the real CLI (tests/helpers/hostile.py); the produced HTML is parsed:
no script, no event handler attribute, no element or link the page generators do not make,
every href a page of the site. The markdown journal holds no link but forge's own. Pages of
ids that used to collide stay apart; ledgers built by ordinary commands always build.
(tests/wiki/test_browser.py loads the same pages in headless Chromium.)
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import open_workspace
from infer_forge.wiki import build as B
from infer_forge.wiki import lint as L
from infer_forge.wiki.page import (
    Page,
    link,
    page_name,
    parse_frontmatter,
    sort_key,
    text,
    to_html,
    to_markdown,
)
from infer_forge.wiki.pages import NAV
from infer_forge.wiki.plot import scatter_svg
from infer_forge.wiki.search_page import search_html

from tests.helpers.hostile import METRIC, REPO, SHOWN, TASK, build_hostile, forge

# What forge's page generators emit; anything else in a page came from user text.
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "nav", "a", "form", "input",
                "h1", "h2", "p", "ul", "li", "table", "thead", "tbody", "tr", "th", "td",
                "pre", "code", "strong", "figure", "span", "svg", "g", "rect", "text", "line",
                "circle", "defs", "path", "use", "clippath", "header", "main", "div",
                "details", "summary"}
URL_ATTRS = {"href", "src", "action", "formaction", "xlink:href", "srcset", "data", "poster"}


class Audit(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def audit_site(site: Path) -> dict[str, str]:
    """Every HTML page of the site passes; returns page -> its visible text."""
    texts: dict[str, str] = {}
    pages = sorted(site.rglob("*.html"))
    assert pages
    for f in pages:
        rel = f.relative_to(site).as_posix()
        html = f.read_text(encoding="utf-8")
        if rel == "search.html":  # forge's own page, with forge's own script
            assert html == search_html(NAV)
            continue
        a = Audit()
        a.feed(html)
        a.close()
        ids = {attrs.get("id") for _, attrs in a.tags} - {None}
        for tag, attrs in a.tags:
            assert tag in ALLOWED_TAGS, (rel, tag, attrs)
            for name, value in attrs.items():
                assert not name.startswith("on"), (rel, tag, name, value)
                if name in URL_ATTRS and tag == "use":  # a plot's marker: a shape of its own
                    assert (value or "").startswith("#") and value[1:] in ids, (rel, value)
                elif name in URL_ATTRS:
                    assert_site_url(site, f, value or "")
                for ref in re.findall(r"url\(([^)]*)\)", value or ""):  # clip paths
                    assert ref.startswith("#") and ref[1:] in ids, (rel, name, value)
            if tag == "a":
                assert "href" in attrs, (rel, attrs)
        assert "<script" not in html.lower(), rel
        texts[rel] = "".join(a.text)
    return texts


def assert_site_url(site: Path, page: Path, url: str) -> None:
    """A link from `page` to another page of the site: relative, no scheme or host, inside."""
    parts = urlsplit(url)
    assert not parts.scheme and not parts.netloc and not url.startswith(("/", "\\")), url
    assert ":" not in parts.path.split("/")[0], url
    target = (page.parent / unquote(parts.path)).resolve()
    assert target.is_relative_to(site.resolve()), (page, url)
    assert target.is_file(), (page, url)


def audit_journal(wiki: Path) -> None:
    """The markdown journal's wiki links (outside fenced code, which is verbatim) are forge's
    own: each to an existing page; and no `[[` is left outside them."""
    pages = {f.relative_to(wiki).with_suffix("").as_posix() for f in wiki.rglob("*.md")}
    for f in wiki.rglob("*.md"):
        md = f.read_text(encoding="utf-8")
        for target in L.forward_links(md, derived=True):
            assert target in pages, (f, target[:80])
        body = md.split("\n---\n", 1)[1]  # frontmatter is data (YAML), not markdown
        body = re.sub(r"(?ms)^(`{3,})$.*?^\1$", "", body)  # fenced code is verbatim
        assert body.count("[[") == len(L.forward_links(md, derived=True)), f


@pytest.fixture(scope="module")
def hostile_home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    build_hostile(root / "home", root / "specs")
    return root / "home"


def test_planted_script_and_links_are_inert_text_on_every_page(hostile_home):
    texts = audit_site(hostile_home / "site")
    everything = "\n".join(texts.values())
    # Honest: each field reached a page, as visible text (the payloads included).
    for field in SHOWN:
        assert f"fld-{field}" in everything, field
    for shown in ("[[javascript:window.__pwned=1;//|x]]", "<img src=x onerror=",
                  "</script><script>window.__pwned=1</script>", "[[https://evil.example|click]]"):
        assert shown in texts["index.html"] or shown in texts[f"tasks/{TASK}.html"], shown
    assert "fld-reason" in texts["index.html"]  # the rejection reason is on the home page
    assert "fld-candidate" in texts["log.html"]  # the candidate value is in the log
    assert METRIC.lstrip("!") in texts[f"tasks/{TASK}.html"]


def test_the_journal_links_only_to_its_own_pages(hostile_home):
    audit_journal(hostile_home / "wiki")
    with open_workspace(hostile_home) as ws:
        rep = L.lint(ws)
    assert not rep.broken and not rep.untyped, rep.as_dict()
    md = (hostile_home / "wiki" / "tasks" / f"{TASK}.md").read_text()
    assert "fld-title [[javascript:" in parse_frontmatter(md)["title"]  # data, as typed
    body = md.split("\n---\n", 1)[1]
    assert "[[javascript" not in body and "[[https" not in body
    assert not re.search(r"(?<!\\)<(img|script|svg on|https:)", body)  # no tag, no autolink
    assert "fld-goal \\[\\[javascript:" in body  # escaped, and still readable


def test_search_index_points_only_at_site_pages(hostile_home):
    site = hostile_home / "site"
    entries = json.loads((site / "search.json").read_text())
    assert any("fld-title" in e["t"] for e in entries)
    for e in entries:
        assert_site_url(site, site / "index.html", e["u"])


def _main(html: str) -> str:
    """A page's own content: what follows the site's header (its name, navigation, search)."""
    return html.split("<main>", 1)[1]


def test_renderer_links_only_to_built_pages():
    p = Page("tasks/a", "task", "t")
    p.add("p", text("see ", link("tasks/b", "b"), " and ", link("javascript:alert(1)", "js"),
                    " ", link("https://evil.example", "out"), " ", link("../../etc", "up"),
                    " ", link("//evil.example/x", "pr"), " ", link("tasks/missing", "gone"),
                    " ", link("Tasks/B", "caps")))
    html = _main(to_html(p, [], known={"tasks/a", "tasks/b"}))
    assert re.findall(r'href="([^"]*)"', html) == ["../tasks/b.html"]
    for label in ("js", "out", "up", "pr", "gone", "caps"):
        assert f">{label}<" not in html and label in html  # the label, as text
    # Without the list of pages, only the shape is checked: a relative page path.
    html = _main(to_html(p, []))
    assert re.findall(r'href="([^"]*)"', html) == ["../tasks/b.html", "../tasks/missing.html"]


def test_a_link_cannot_be_spliced_into_text():
    with pytest.raises(TypeError):
        f"{link('tasks/a', 'a')}"  # noqa: B018
    p = Page("index", "index", "[[javascript:x|t]]")
    p.add("p", "[[tasks/a|a]] user text that looks like a link")
    p.add("table", ["c|[[x]]"], [("[[tasks/a|a]]",), (link("tasks/a", "x]] [[y|z"),)])
    md, html = to_markdown(p), _main(to_html(p, [], known={"tasks/a"}))
    assert L.forward_links(md, derived=True) == ["tasks/a"]
    assert md.count("[[") == 2  # the link, and the title as data in the frontmatter
    assert html.count("<a ") == 1 and "[[tasks/a|a]]" not in html  # brackets as references
    assert "&#91;&#91;tasks/a|a&#93;&#93; user text" in html


# --- item 5: page names cannot collide ---------------------------------------------------


LEGACY_IDS = ["a b", "a-b", "x", "x.", "X", "a/b", "a_b", "<script>", "../../etc", "",
              "t" * 240, "t" * 239 + "T", "é", "a\nb", "a b\n"]


def test_page_names_are_injective_bounded_and_safe():
    names = [page_name(i) for i in LEGACY_IDS + ["tune-tiny-cpu", "b1", "g.n.a1"]]
    assert len(set(names)) == len(names)
    assert len({n.casefold() for n in names}) == len(names)  # case-insensitive file systems
    for n in names:
        assert re.fullmatch(r"[a-z0-9~][a-z0-9._~-]*", n) and len(n) <= 160 and "/" not in n
    assert page_name("tune-tiny-cpu") == "tune-tiny-cpu"  # a valid id is its own name


def _plant_task(ws, tid: str) -> None:
    """What an older ledger may hold: a task id no rule checked (bypassing every entry)."""
    ws.ledger.append(task_stream(tid), [E.TaskDefined(
        task_id=tid, title=f"title of {tid!r}", task_type="kernel", goal=f"goal of {tid!r}",
        definition={"id": tid}, definition_hash="sha256:" + "0" * 64)])


def test_tasks_whose_ids_used_to_share_a_page_get_their_own(workspace):
    ids = [i for i in LEGACY_IDS if i]
    for tid in ids:
        _plant_task(workspace, tid)
    rep = B.build(workspace, embeddings=False)
    pages = sorted((workspace.home / "wiki" / "tasks").glob("*.md"))
    assert len(pages) == len(ids), rep
    got = {parse_frontmatter(p.read_text())["task_id"] for p in pages}
    assert got == set(ids)
    site = workspace.home / "site"
    for f in (site / "tasks").glob("*.html"):
        assert len(f.name) < 200 and f.resolve().parent == (site / "tasks").resolve()
    audit_site(site)
    assert L.lint(workspace).ok


# --- item 6: whatever ordinary commands record, the wiki builds --------------------------


def _task_yaml(tmp: Path, tid: str, name: str | None = None) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    for kind in ("points", "profiles"):
        (tmp / kind / "tiny-cpu.yaml").write_text(
            (REPO / "examples" / kind / "tiny-cpu.yaml").read_text())
    data = {"id": tid, "type": "deployment-tuning", "goal": f"goal of {tid}",
            "point": "../points/tiny-cpu.yaml",
            "scope": {"engine.dtype": ["float32", "bfloat16"]},
            "contract": {"gates": [{"name": "tput", "metric": "output_throughput",
                                    "at_least": 1}]},
            "executor": {"kind": "manual"}}
    f = tmp / "tasks" / f"{name or tid}.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_ledgers_of_ordinary_commands_always_build(forge_home, tmp_path):
    home = forge_home
    forge(home, "init")
    bench = str(REPO / "tests/data/bench_serving/sglang-0.5.4.jsonl")
    long_id = "l" * 158 + "-z"  # the longest id there is
    assert len(long_id) == 160
    forge(home, "task", "new", str(_task_yaml(tmp_path / "a", long_id, "long")))
    forge(home, "task", "new", str(_task_yaml(tmp_path / "b", "empty")))  # nothing more
    forge(home, "task", "new", str(_task_yaml(tmp_path / "c", "t")))
    forge(home, "bench", "import", bench)  # no task at all: the measurements stream
    forge(home, "wiki", "build", "--no-embeddings")
    forge(home, "block", "start", long_id, "--sub-goal", "baseline")
    forge(home, "measure", long_id, "--metric", "output_throughput=10",
          "--metric", "median_ttft_ms=5")
    forge(home, "block", "verify", long_id)
    forge(home, "block", "handoff", long_id, "--state-reached", "baseline")
    forge(home, "block", "start", long_id, "--sub-goal", "bf16", "--set", "engine.dtype=bfloat16")
    forge(home, "measure", long_id, "--metric", "output_throughput=20",
          "--metric", "median_ttft_ms=4")
    forge(home, "block", "verify", long_id)
    forge(home, "task", "accept", long_id, "--summary", "bf16")
    forge(home, "block", "handoff", long_id, "--state-reached", "accepted")
    forge(home, "task", "exit", long_id, "--state", "delivered", "--reason", "done")
    # The case: results imported into a task without --block after block measurements.
    forge(home, "block", "start", "t", "--sub-goal", "baseline")
    forge(home, "measure", "t", "--metric", "output_throughput=10", "--metric",
          "median_ttft_ms=5")
    forge(home, "bench", "import", bench, "--task", "t")
    forge(home, "bench", "import", bench, "--task", "t", "--block", "b1")
    forge(home, "block", "handoff", "t", "--state-reached", "imported")
    # A graph without a single task node (a repo and a system only).
    graph = {"name": "no-tasks", "nodes": [{"id": "r", "kind": "repo"},
                                           {"id": "s", "kind": "system"}]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(graph))
    forge(home, "graph", "new", str(tmp_path / "g.yaml"))
    out = json.loads(forge(home, "wiki", "build", "--no-embeddings", "--json"))
    assert out["pages"] > 10
    site, wiki = home / "site", home / "wiki"
    assert (site / "tasks" / f"{long_id}.html").is_file()
    decisions = list((site / "decisions").glob("*.html"))
    assert len(decisions) == 1 and len(decisions[0].name) < 200
    assert (site / "graphs" / "no-tasks.html").is_file()
    audit_site(site)
    audit_journal(wiki)
    with open_workspace(home) as ws:
        assert L.lint(ws).ok


def test_plots_and_sorts_take_any_values():
    assert sorted([None, "b1", None, "a"], key=sort_key) == [None, None, "a", "b1"]
    assert sorted([("b1", None), (None, "{}"), ("", "{}")], key=sort_key)[0] == (None, "{}")
    s = scatter_svg({"rp": [(1e308, 1.0, "huge"), (float("nan"), 2.0, "nan"),
                            (float("inf"), 3.0, "inf"), (5.0, 5.0, "<b>ok</b>")]},
                    xlabel="x", ylabel="y", title="[[t|x]]")
    assert "<b>" not in s and "[[" not in s and "&lt;b&gt;ok" in s
    assert scatter_svg({"rp": [(2.0, 2.0, "one")]}, xlabel="x", ylabel="y", title="t")
    assert scatter_svg({"rp": [(1e20, 1e20, "same")]}, xlabel="x", ylabel="y", title="t")
    assert scatter_svg({"rp": [(float("nan"), 1.0, "n")]}, xlabel="x", ylabel="y",
                       title="t") == ""
