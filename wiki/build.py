"""`forge wiki build`: pages from the index → markdown journal (FORGE_HOME/wiki) and a static
HTML site (FORGE_HOME/site) with a search page.

Contracts:
- Compile, then render: concept pages that are stale (or concepts without a page) are
  compiled first, as `forge wiki compile --stale` would (when the ledger moved since the last
  compile), so the site never shows a concept page behind the record it could compile.
- Tool output: the artifacts a decision's trace names as a tool's output (stdout, an engine's
  log) are read (their first READ_BYTES), redacted and shown as a preview beside the call,
  with a page each (artifacts.py).
- Deterministic: the same index gives byte-identical pages (no build times in them).
- Freshness: every page records the ledger position it reflects; a file is rewritten only
  when its content changed, pages whose sources vanished are removed, and a build at an
  unchanged index position with unchanged settings does nothing.
- Reuse: drawings are kept between builds by what they draw (`_plots.json`; the compare and
  history views' `_view_plots.json`), each task's comparison by its last ledger position
  (`_compare.json`), and a page whose content, links and renderer are unchanged is not
  rendered again (`_rendered.json`).
- Related pages: embedding similarity of title + summary + facets (sentence-transformers),
  plus a bonus per shared dimension; without embeddings, shared dimensions alone.
- Backlinks are derived after all pages exist; lint ignores them when looking for orphans.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ledger.config import WikiSettingsToml
from ..ledger.workspace import Workspace
from ..projections.index import open_index
from . import narrative, trace_cache
from . import page as page_module
from .answers import answer_pages
from .artifacts import READ_BYTES, Preview, artifact_page, preview
from .chat import Post
from .compare_page import compare_pages
from .concepts.site import catalog_digest, llms_txt, site_pages
from .concurrency import concurrency_page
from .embed import EmbeddingCache
from .endpoints import endpoints_page
from .files import write_if_changed
from .graphs import GRAPH_INDEX, graph_pages
from .history_page import history_pages
from .page import Page, link, text, to_html, to_markdown
from .pages import FACETS, NAV, make_pages
from .plot import PlotCache
from .retrieve import corpus_docs
from .search_index import write_search_index
from .search_page import search_html
from .snapshot import Snapshot, load

STATE = "_state.json"
BUILD_VERSION = 5  # bump when page generation changes: existing wikis rebuild (2: graph pages;
# 3: user text never forms a link, injective page names, the graph index at `graphs`;
# 4: the site rendered from markdown by markdown-it, plots by matplotlib with verdicts and SLOs;
# 5: human titles, numbers by unit, tool output previews and artifact pages, search shards
# as scripts, the compare and history views)
PLOT_CACHE = "_plots.json"  # drawings kept between builds (plot.PlotCache)
VIEW_PLOTS = "_view_plots.json"  # the compare and history views' drawings (their own cache)
VIEW_INDEXES = ("compare", "history")  # their index pages, listed on the home page
COMPARE_CACHE = "_compare.json"  # each task's comparison, kept by its last position
RENDERED = "_rendered.json"  # what each page's files were rendered from (Rendered)
RELATED_K = 5
DIM_BONUS = 0.05  # added to the cosine similarity per shared dimension
SCORE_STEP = 1e-4  # related scores are compared (and shown) at this step
MANAGED = ("tasks", "decisions", "points", "profiles", "models", "dims", "graphs", "answers",
           "artifacts", "compare", "history")


@dataclass
class WikiSettings:
    embeddings: bool = True
    model: str | None = None
    narrative_url: str | None = None
    narrative_model: str | None = None
    narrative_key_env: str | None = None

    @classmethod
    def from_config(cls, w: WikiSettingsToml, embeddings: bool = True) -> WikiSettings:
        """From forge.toml's `[wiki]` as the one strict schema read it (ledger/config.py)."""
        n = w.narrative
        return cls(embeddings=embeddings and w.embeddings, model=w.embedding_model,
                   narrative_url=n.url if n else None, narrative_model=n.model if n else None,
                   narrative_key_env=n.api_key_env if n else None)

    def key(self) -> dict[str, Any]:
        return {"v": BUILD_VERSION, "embeddings": self.embeddings, "model": self.model,
                "narrative": [self.narrative_url, self.narrative_model]}


@dataclass
class BuildReport:
    position: int
    pages: int = 0
    written: int = 0
    unchanged: int = 0
    removed: int = 0
    traced: int = 0  # decisions traced afresh (the others' traces kept: trace_cache.py)
    fresh: bool = False  # nothing to do: the wiki already reflects this position
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    wiki_dir: str = ""
    site_dir: str = ""
    narrative: dict[str, int] = field(default_factory=dict)
    concepts: int = 0  # concept pages compiled before rendering (stale or new)


def embed_text(p: Page) -> str:
    if p.embed:
        return p.embed
    facets = ", ".join(f"{k} {v}" for k, v in sorted(p.facets.items()) if v)
    return f"{p.title}. {p.summary}. {facets}"


def add_related(pages: list[Page], settings: WikiSettings, cache_dir: Path,
                extra_texts: Sequence[str] = ()) -> None:
    """A 'Related' block on task and decision pages: top-k by cosine + shared dimensions.
    `extra_texts` are embedded into the same cache (retrieve's corpus)."""
    cand = [p for p in pages if p.kind in ("task", "decision")]
    if len(cand) < 2:
        if settings.embeddings and extra_texts:
            cache = EmbeddingCache(cache_dir / "_embeddings.npz", settings.model)
            cache.embed(list(extra_texts))
            cache.save()
        return
    import numpy as np  # here: importing the wiki (every forge command) stays fast

    n = len(cand)
    codes = np.zeros((n, len(FACETS)), np.int64)
    for j, f in enumerate(FACETS):
        vocab: dict[Any, int] = {}
        for i, p in enumerate(cand):
            v = p.facets.get(f)
            codes[i, j] = -1 - i if v is None else vocab.setdefault(v, len(vocab))
    vecs = None
    if settings.embeddings:
        cache = EmbeddingCache(cache_dir / "_embeddings.npz", settings.model)
        vecs = cache.embed([embed_text(p) for p in cand])
        cache.embed(list(extra_texts))
        cache.save()
    # Scores are compared at SCORE_STEP and ties broken by path, over all candidates: pages of
    # identical texts score identically up to the last bits of a BLAS sum, which move with
    # the matrix's shape, so one new page would otherwise reorder every tie (and rewrite
    # thousands of pages of a growing journal).
    by_facet = np.ascontiguousarray(codes.T)
    rank = np.empty(n, np.float64)
    rank[sorted(range(n), key=lambda i: cand[i].path)] = np.arange(n)
    chunk = 512
    k = min(RELATED_K, n - 1)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        shared = np.zeros((e - s, n), np.float32)
        for col in by_facet:  # one facet at a time: 7x faster than one (rows, n, facets) sum
            shared += col[s:e, None] == col[None, :]
        score = DIM_BONUS * shared
        if vecs is not None:
            score += vecs[s:e] @ vecs.T
        steps = np.rint(score.astype(np.float64) / SCORE_STEP)
        steps[np.arange(e - s), np.arange(s, e)] = -np.inf
        key = -steps * n + rank  # exact in float64: |steps| < 1e5, n < 1e9
        top = np.argpartition(key, k - 1, axis=1)[:, :k]
        for r in range(e - s):
            idx = sorted(top[r], key=lambda j: key[r, j])
            p = cand[s + r]
            rows = [(link(cand[j].path, cand[j].title), cand[j].kind,
                     round(float(steps[r, j]) * SCORE_STEP, 3)) for j in idx]
            p.add("h", "Related")
            p.add("table", ["page", "kind", "score"], rows)


def add_backlinks(pages: list[Page]) -> None:
    incoming: dict[str, set[str]] = defaultdict(set)
    titles = {p.path: p.title for p in pages}
    for p in pages:
        for target in p.links():
            if target != p.path:
                incoming[target].add(p.path)
    for p in pages:
        srcs = sorted(incoming.get(p.path, ()))
        if p.kind in ("log", "index"):
            continue
        p.add("h", "Backlinks")
        p.add("list", [link(s, titles.get(s, s)) for s in srcs[:200]]
              + ([f"… and {len(srcs) - 200} more"] if len(srcs) > 200 else [])
              or ["(none)"])


def search_entries(pages: list[Page]) -> list[dict[str, str]]:
    return [{"u": p.path + ".html", "t": p.title, "k": p.kind, "s": p.text(400)}
            for p in sorted(pages, key=lambda p: p.path)]




def compile_stale(ws: Workspace, wiki_dir: Path, post: Post | None) -> int:
    """Compile the concept pages that are not fresh, and concepts without a page, when the
    ledger moved since the last compile (module contract); how many were compiled."""
    from .concepts.compiler import compile_wiki  # in the function: start-up time
    from .concepts.model import load_catalog

    with open_index(ws) as s:
        position = s.caught_up.position if s.caught_up else 0
    if load_catalog(wiki_dir).position == position:
        return 0
    return len(compile_wiki(ws, stale=True, post=post).compiled)


def read_previews(traces: dict[str, dict[str, Any]]) -> dict[str, Preview]:
    """Digest -> the redacted preview of each tool output the traces name and the artifact
    store holds (its first READ_BYTES read)."""
    out: dict[str, Preview] = {}
    for chain in traces.values():
        arts = {a.get("digest"): a for a in chain.get("artifacts") or []}
        for call in chain.get("tool_calls") or []:
            a = arts.get(call.get("stdout"))
            if a is None or a["digest"] in out or not a.get("path"):
                continue
            try:
                with open(a["path"], "rb") as f:
                    data = f.read(READ_BYTES + 1)
            except OSError:
                continue  # not in this store: the page shows the digest
            out[a["digest"]] = preview(a["digest"], a["what"], a["relative"],
                                       data[:READ_BYTES], whole=len(data) <= READ_BYTES)
    return dict(sorted(out.items()))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _renderer() -> str:
    """What renders every page: the page module's code (markdown, HTML, escaping, CSS), the
    markdown and YAML libraries' versions, the build's version and the site's navigation."""
    try:
        code = Path(page_module.__file__ or "").read_bytes()
    except OSError:
        code = b""
    versions = [importlib.metadata.version(d) for d in ("markdown-it-py", "PyYAML")]
    return _sha256(repr((BUILD_VERSION, _sha256(code), versions, NAV)).encode())


class Rendered:
    """The journal and site files of each page as the last build wrote them, kept in the wiki's
    `_rendered.json`: per page, the digest of all its files are made of (its head and blocks,
    which of its links reach a built page, `_renderer()`) and the digests of the two files
    written. A page whose digest is the one kept, and whose files on disk are the ones written,
    is not rendered again (markdown-it is most of a build's time when the plots are kept): a
    forced build of an unchanged index renders nothing, a build after new events renders the
    pages they changed. A file edited or lost since is written again; a damaged record is
    ignored (every page rendered)."""

    def __init__(self, path: Path, known: set[str]) -> None:
        self.path, self.known = path, known
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        self.kept: dict[str, list[str]] = {
            k: v for k, v in (data.items() if isinstance(data, dict) else ())
            if isinstance(v, list) and len(v) == 3 and all(isinstance(x, str) for x in v)}
        self.now: dict[str, list[str]] = {}

    def source(self, p: Page) -> str:
        """The digest of what the page's files are made of. Reprs: a Text, a Link and the
        index's values (str, numbers, None) each show their type and value."""
        made_of = (_renderer(), p.path, p.kind, p.title, p.position, p.meta, p.blocks,
                   sorted(p.links() & self.known))
        return _sha256(repr(made_of).encode("utf-8", "surrogatepass"))

    def unchanged(self, p: Page, source: str, files: Sequence[Path]) -> bool:
        kept = self.kept.get(p.path)
        if kept is None or kept[0] != source:
            return False
        for f, digest in zip(files, kept[1:], strict=True):
            try:
                if _sha256(f.read_bytes()) != digest:
                    return False
            except OSError:
                return False
        self.now[p.path] = kept
        return True

    def record(self, p: Page, source: str, texts: Sequence[str]) -> None:
        self.now[p.path] = [source, *(_sha256(t.encode("utf-8")) for t in texts)]

    def save(self) -> None:
        if self.now != self.kept:
            write_if_changed(self.path, json.dumps(self.now, sort_keys=True, separators=(",", ":")))


def _prune(root: Path, keep: set[Path], ext: str) -> int:
    removed = 0
    for sub in MANAGED:
        d = root / sub
        if not d.is_dir():
            continue
        for f in d.rglob(f"*{ext}"):
            if f not in keep:
                f.unlink()
                removed += 1
    return removed


def build_pages(snap: Snapshot, settings: WikiSettings, wiki_dir: Path,
                timings: dict[str, float], stats: dict[str, int],
                extra_texts: Sequence[str] = (), extra_pages: Sequence[Page] = (),
                post: Post | None = None) -> list[Page]:
    t = time.perf_counter()
    plots = PlotCache(wiki_dir / PLOT_CACHE)
    pages = make_pages(snap, plots)
    plots.save()
    if extra_pages:
        pages += extra_pages
        home = next(p for p in pages if p.path == "index")
        if any(p.kind == "graph" for p in extra_pages):
            home.add("h", "Task graphs")
            home.add("list", [text(link(GRAPH_INDEX, "all task graphs"))]
                     + [text(link(p.path, p.meta["graph"]), f" — {p.summary}")
                        for p in extra_pages if p.kind == "graph"])
        for p in extra_pages:
            if p.kind == "concurrency":
                home.add("h", "Tasks in flight")
                home.add("p", text(link(p.path, p.title), f": {p.summary}"))
            if p.kind == "endpoints":
                home.add("h", "Monitored endpoints")
                home.add("p", text(link(p.path, p.title), f": {p.summary}"))
            if p.kind == "concepts":
                home.add("h", "Concepts across tasks")
                home.add("p", text(link(p.path, p.title), f": {p.summary}"))
            if p.kind == "answers":
                home.add("h", "Filed answers")
                home.add("p", text(link(p.path, p.title), f": {p.summary}"))
            if p.path in VIEW_INDEXES:
                home.add("h", p.title)
                home.add("p", text(link(p.path, p.title), f": {p.summary}"))
    timings["pages_s"] = time.perf_counter() - t
    t = time.perf_counter()
    add_related(pages, settings, wiki_dir, extra_texts)
    timings["related_s"] = time.perf_counter() - t
    if settings.narrative_url:
        t = time.perf_counter()
        stats.update(narrative.add_narratives(pages, settings, wiki_dir, post))
        timings["narrative_s"] = time.perf_counter() - t
    add_backlinks(pages)
    return pages


def build(ws: Workspace, *, embeddings: bool = True, force: bool = False,
          settings: WikiSettings | None = None, post: Post | None = None,
          compile_concepts: bool = True) -> BuildReport:
    """Compile the stale concept pages (unless `compile_concepts` is false: the site then
    shows them as they are, with their state), then render (module contract)."""
    t0 = time.perf_counter()
    settings = settings or WikiSettings.from_config(ws.config.settings.wiki, embeddings)
    wiki_dir, site_dir = Path(ws.home) / "wiki", Path(ws.home) / "site"
    timings: dict[str, float] = {}
    concepts_compiled = compile_stale(ws, wiki_dir, post) if compile_concepts else 0
    timings["compile_s"] = time.perf_counter() - t0
    with open_index(ws) as s:
        t = time.perf_counter()
        position = s.caught_up.position if s.caught_up else 0
        state_path = wiki_dir / STATE
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        if (not force and state.get("position") == position
                and state.get("settings") == settings.key() and (site_dir / "index.html").exists()
                and state.get("concepts") == catalog_digest(wiki_dir)):
            return BuildReport(position, state.get("pages", 0), fresh=True,
                               seconds=time.perf_counter() - t0, wiki_dir=str(wiki_dir),
                               site_dir=str(site_dir))
        snap = load(s.con)
        endpoints = endpoints_page(s.con, snap.position)
        graph_pos = trace_cache.graph_position(s.con)
        concepts = site_pages(s.con, wiki_dir)  # compiled concept pages, state as of now
        # Warm the cache for `forge retrieve` / the served search with the same build.
        corpus = [d.text for d in corpus_docs(s.con)] if settings.embeddings else []
        timings["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        view_plots = PlotCache(wiki_dir / VIEW_PLOTS)
        views = (compare_pages(s.con, ws.artifacts.get, snap.position, view_plots,
                               wiki_dir / COMPARE_CACHE)
                 + history_pages(s.con, view_plots))
        view_plots.save()
        timings["views_s"] = time.perf_counter() - t
    report = BuildReport(snap.position, wiki_dir=str(wiki_dir), site_dir=str(site_dir),
                         concepts=concepts_compiled)
    known_tasks = {t["task_id"] for t in snap.tasks}
    graphs = graph_pages(ws.ledger, snap.position, known_tasks)
    t = time.perf_counter()
    in_flight = concurrency_page(ws.ledger, snap.position, known_tasks)
    timings["in_flight_s"] = time.perf_counter() - t
    if in_flight is not None:
        graphs.append(in_flight)
    if endpoints is not None:
        graphs.append(endpoints)
    graphs += concepts
    graphs += views
    graphs += answer_pages(wiki_dir)  # filed by forge wiki ask --file
    t = time.perf_counter()
    snap.traces, report.traced = trace_cache.traces(ws, snap, wiki_dir, graph_pos)
    snap.previews = read_previews(snap.traces)
    seen_at: dict[str, int] = {}  # an artifact page reflects the tasks that name it
    for c in snap.traces.values():
        at = snap.task_positions.get(c["task"]["task_id"], 0)
        for a in c.get("artifacts") or []:
            seen_at[a["digest"]] = max(seen_at.get(a["digest"], 0), at)
    graphs += [artifact_page(p, seen_at.get(p.digest, snap.position))
               for p in snap.previews.values()]
    timings["traces_s"] = time.perf_counter() - t
    pages = build_pages(snap, settings, wiki_dir, timings, report.narrative, corpus, graphs,
                        post)
    t = time.perf_counter()
    keep_md, keep_html = set(), set()
    known = {p.path for p in pages} | {"search"}  # the site links to these pages only
    rendered = Rendered(wiki_dir / RENDERED, known)
    for p in pages:
        md, html = wiki_dir / f"{p.path}.md", site_dir / f"{p.path}.html"
        keep_md.add(md)
        keep_html.add(html)
        source = rendered.source(p)
        if rendered.unchanged(p, source, (md, html)):
            report.unchanged += 1
            continue
        texts = (to_markdown(p), to_html(p, NAV, known))
        changed = write_if_changed(md, texts[0])
        changed = write_if_changed(html, texts[1]) or changed
        rendered.record(p, source, texts)
        report.written += changed
        report.unchanged += not changed
    rendered.save()
    report.removed = _prune(wiki_dir, keep_md, ".md") + _prune(site_dir, keep_html, ".html")
    entries = search_entries(pages)
    write_if_changed(site_dir / "search.json",
           json.dumps(entries, ensure_ascii=False, separators=(",", ":")))
    write_search_index(site_dir, entries, write_if_changed)
    write_if_changed(site_dir / "search.html", search_html(NAV))
    write_if_changed(site_dir / "llms.txt", llms_txt(pages))
    if concepts:  # the journal carries the schema its concept pages were compiled by
        from .concepts.compiler import schema_text  # in the function: start-up time

        write_if_changed(wiki_dir / "SCHEMA.md", schema_text())
    timings["write_s"] = time.perf_counter() - t
    report.pages = len(pages)
    write_if_changed(wiki_dir / STATE, json.dumps({"position": snap.position, "pages": len(pages),
                                         "settings": settings.key(),
                                         "concepts": catalog_digest(wiki_dir)}, indent=1))
    report.timings = {k: round(v, 3) for k, v in timings.items()}
    report.seconds = time.perf_counter() - t0
    return report
