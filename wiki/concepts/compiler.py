"""`forge wiki compile`: concept pages across tasks, from the index.

Contracts:
- Deterministic without a model: the same index gives the same catalog and pages (tables and
  lists, every row citing its events), so the wiki is complete offline and in CI.
- With a model tier (`--tier T`, or `[models.wiki]` in forge.toml when no tier is given), the
  model writes each page's synthesis from the same evidence, told how by SCHEMA.md; every
  sentence it writes passes the citation check (claims.py) and concerns the page's concept
  (cites only the page's evidence, names the concept) or is dropped and reported. A
  failing endpoint costs one attempt per compile and is reported, never fatal; answers are
  cached by prompt (`concepts/_model.json`). The request goes through the caller's `post`
  (wiki/chat.py: cli.py passes the one outbound client: no redirect, a byte cap, a deadline);
  without one the endpoint counts as failing.
- `stale=True` recompiles only pages that are not fresh (freshness.py) and concepts without a
  page; a full compile also removes the pages of concepts the ledger no longer shows.
- Each page records the ledger position it was compiled at and the hashes of its events.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ...ledger.config import ModelSettings
from ...ledger.workspace import Workspace
from ...projections.index import open_index
from ..chat import Post, complete
from ..errors import WikiError
from ..files import write_if_changed
from ..page import to_markdown
from . import claims as claims_module
from . import evidence
from .evidence import Draft, Evidence
from .freshness import page_states
from .model import (
    CONCEPTS_DIR,
    Catalog,
    Citation,
    Claim,
    ConceptPage,
    DroppedClaim,
    SourceEvent,
    concepts_dir,
    load_catalog,
    save_catalog,
)
from .render import INDEX, catalog_page, concept_page

DEFAULT_TIER = "wiki"
MODEL_CACHE = "_model.json"
MAX_EVIDENCE = 60  # claims of the evidence shown to the model per page


@dataclass
class CompileReport:
    position: int
    pages: int = 0  # concept pages in the catalog after the compile
    compiled: list[str] = field(default_factory=list)  # slugs compiled this time
    written: int = 0  # markdown files written (changed)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)  # before the compile
    dropped: list[dict[str, str]] = field(default_factory=list)  # {page, text, reason}
    model: dict[str, Any] = field(default_factory=dict)  # tier, model, asked, cached, failed
    seconds: float = 0.0
    wiki_dir: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def schema_text() -> str:
    """SCHEMA.md as shipped in the package (what the model is given)."""
    return resources.files(__package__).joinpath("SCHEMA.md").read_text(encoding="utf-8")


def tier_settings(ws: Workspace, tier: str | None, deterministic: bool
                  ) -> tuple[str, ModelSettings] | None:
    if deterministic:
        return None
    models = ws.config.settings.models
    if tier is None:
        return (DEFAULT_TIER, models[DEFAULT_TIER]) if DEFAULT_TIER in models else None
    if tier not in models:
        raise WikiError(f"--tier {tier!r}: no [models.{tier}] in forge.toml (tiers: "
                        f"{', '.join(sorted(models)) or 'none'})")
    return tier, models[tier]


# --- deterministic ----------------------------------------------------------------------


def compile_draft(d: Draft, ev: Evidence) -> ConceptPage:
    """The deterministic page of a concept (pure): each finding a claim with its citations
    (an id the index does not hold is left out; a finding left without any is not
    published)."""
    out: list[Claim] = []
    for f in d.findings:
        cs = tuple(c for c in (ev.citation(e) for e in f.cites) if c is not None)
        if cs:
            out.append(Claim(section=f.section, text=f.text, row=f.row, citations=cs,
                             point=f.point, outcome=f.outcome))
    ids = sorted({c.event_id for cl in out for c in cl.citations},
                 key=lambda e: (ev.events[e][0], e))
    sources = tuple(SourceEvent(event_id=e, position=ev.events[e][0], type=ev.events[e][1],
                                sha256=ev.events[e][2]) for e in ids)
    points = tuple(sorted(d.points.values(), key=lambda p: p.point_hash))
    profiles = {p.service: ev.latest_revs[p.service] for p in points
                if p.service and p.service in ev.latest_revs}
    return ConceptPage(kind=d.kind, slug=d.slug, title=d.title, concept=d.concept,
                       summary=d.summary, points=points, profiles=profiles,
                       sections=tuple(d.sections), claims=tuple(out),
                       compiled_at=ev.position, sources=sources)


# --- the model's synthesis ----------------------------------------------------------------


def prompt(page: ConceptPage, schema: str) -> str:
    lines = [f"- {c.text} " + " ".join(f"[e:{x.event_id}]" for x in c.citations)
             for c in page.claims[:MAX_EVIDENCE]]
    points = [f"- {p.runtime_profile or p.point_hash}: {p.model} on {p.accelerator} "
              f"({p.engine})" for p in page.points]
    return (f"{schema}\n\n# Your task\nWrite the synthesis of the concept page "
            f"\"{page.title}\" ({page.concept}) from the evidence below: at most six "
            "sentences, one per line, each ending with the citations of the evidence it "
            "comes from as [e:<event id>]. State only figures that appear in the evidence "
            "you cite. Each sentence is about this concept and names it ("
            + ", ".join(sorted(claims_module.concept_terms(page.concept)))
            + "); cite only the evidence below.\n\n# Evidence\n" + "\n".join(lines)
            + ("\n\n# Points\n" + "\n".join(points) if points else ""))


def ask(post: Post | None, s: ModelSettings, text: str) -> str:
    """The tier's reply to `text` (through `post`; WikiError when it fails)."""
    key = os.environ.get(s.api_key_env) if s.api_key_env else None
    content = complete(post, s.url, text, model=s.model, temperature=s.temperature,
                       max_tokens=s.max_tokens, api_key=key, timeout_s=s.timeout_s)
    return content if isinstance(content, str) else ""


class Writer:
    """Asks the model tier for each page's synthesis; one failure stops asking for the rest
    of the compile (the pages stay deterministic)."""

    def __init__(self, tier: str, settings: ModelSettings, cache_path: Path,
                 post: Post | None = None) -> None:
        self.tier, self.s, self.path, self.post = tier, settings, cache_path, post
        try:
            self.cache: dict[str, str] = json.loads(cache_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.cache = {}
        self.stats: dict[str, Any] = {"tier": tier, "model": settings.model, "asked": 0,
                                      "cached": 0, "failed": 0, "error": None}
        self.broken = False

    def answer(self, text: str) -> str | None:
        key = hashlib.sha256(f"{self.s.model}\n{text}".encode()).hexdigest()
        if key in self.cache:
            self.stats["cached"] += 1
            return self.cache[key]
        if self.broken:
            return None
        try:
            out = ask(self.post, self.s, text)
        except WikiError as e:
            self.broken = True
            self.stats["failed"] += 1
            self.stats["error"] = f"{self.s.url}: {' '.join(str(e).split())[:200]}"
            return None
        self.stats["asked"] += 1
        self.cache[key] = out
        return out

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.cache, indent=1, sort_keys=True))


def with_synthesis(page: ConceptPage, answer: str, payloads: dict[str, str],
                   ev_lookup: dict[str, tuple[int, str, str]], pages: dict[str, str],
                   label: str) -> ConceptPage:
    """The page with the model's checked sentences as its synthesis and the rest dropped."""
    kept, dropped = claims_module.split(answer, payloads, claims_module.Concept(
        page.concept, frozenset(s.event_id for s in page.sources)))
    new: list[Claim] = []
    for sentence, ids in kept:
        cs = tuple(Citation(event_id=i, position=ev_lookup[i][0], type=ev_lookup[i][1],
                                     page=pages.get(i)) for i in ids)
        new.append(Claim(section="Synthesis", text=sentence, citations=cs, author="model"))
    known = {s.event_id for s in page.sources}
    extra = tuple(SourceEvent(event_id=c.event_id, position=c.position, type=c.type,
                              sha256=ev_lookup[c.event_id][2])
                  for cl in new for c in cl.citations if c.event_id not in known)
    sources = tuple(sorted({s.event_id: s for s in (*page.sources, *extra)}.values(),
                           key=lambda s: (s.position, s.event_id)))
    return page.model_copy(update={
        "claims": (*new, *page.claims), "dropped": tuple(dropped), "sources": sources,
        "author": "model" if new else "compiler", "model": label})


# --- the compile ------------------------------------------------------------------------




def compile_wiki(ws: Workspace, *, stale: bool = False, tier: str | None = None,
                 deterministic: bool = False, post: Post | None = None) -> CompileReport:
    """Compile the concept pages (module contract); `post` sends the model tier's requests
    (wiki/chat.py)."""
    t0 = time.perf_counter()
    chosen = tier_settings(ws, tier, deterministic)
    wiki_dir = Path(ws.home) / "wiki"
    cdir = concepts_dir(wiki_dir)
    old = load_catalog(wiki_dir)
    with open_index(ws) as s:
        ev = evidence.load(s.con)
    drafts = evidence.derive(ev)
    by_concept = old.by_concept()
    states = page_states(ev, old, drafts)
    rep = CompileReport(ev.position, wiki_dir=str(wiki_dir))
    for st, _ in states.values():
        rep.states[st] = rep.states.get(st, 0) + 1
    todo = [d for k, d in drafts.items()
            if not stale or k not in by_concept
            or states[by_concept[k].slug][0] != "fresh"]
    compiled = {d.slug: compile_draft(d, ev) for d in todo}
    if chosen is not None and compiled:
        compiled = _synthesize(ws, chosen, compiled, cdir, rep, ev, post)
    pages: dict[str, ConceptPage] = {}
    for slug, p in old.pages.items():
        st, why = states[slug]
        if st == "orphaned" and not stale:
            rep.removed.append(slug)
        elif slug not in compiled:
            pages[slug] = p.model_copy(update={"state": st, "reasons": why})
    pages.update(compiled)
    catalog = Catalog(position=ev.position, pages=dict(sorted(pages.items())))
    rep.compiled = sorted(compiled)
    rep.pages = len(pages)
    for slug, p in compiled.items():
        rep.dropped += [{"page": slug, "text": d.text, "reason": d.reason} for d in p.dropped]
    save_catalog(wiki_dir, catalog)
    st_now = {slug: (p.state, p.reasons) for slug, p in pages.items()}
    for slug, p in pages.items():
        was = old.pages.get(slug)
        if slug not in compiled and was is not None and (was.state, was.reasons) == (
                p.state, p.reasons) and (wiki_dir / f"{p.path}.md").exists():
            rep.unchanged += 1  # as the last compile or build wrote it (builds add backlinks)
            continue
        changed = write_if_changed(wiki_dir / f"{p.path}.md", to_markdown(concept_page(p)))
        rep.written += changed
        rep.unchanged += not changed
    for slug in rep.removed:
        (cdir / f"{slug}.md").unlink(missing_ok=True)
    write_if_changed(wiki_dir / f"{INDEX}.md", to_markdown(catalog_page(catalog, st_now)))
    write_if_changed(wiki_dir / "SCHEMA.md", schema_text())  # the wiki carries its schema
    rep.seconds = round(time.perf_counter() - t0, 3)
    return rep


def _synthesize(ws: Workspace, chosen: tuple[str, ModelSettings],
                compiled: dict[str, ConceptPage], cdir: Path, rep: CompileReport,
                ev: Evidence, post: Post | None) -> dict[str, ConceptPage]:
    tier, settings = chosen
    writer = Writer(tier, settings, cdir / MODEL_CACHE, post)
    schema = schema_text()
    answers = {slug: writer.answer(prompt(p, schema)) for slug, p in compiled.items()}
    writer.save()
    rep.model = writer.stats
    cited = sorted({i for a in answers.values() if a for i in claims_module.CITE.findall(a)})
    with open_index(ws) as s:
        payloads = evidence.payloads(s.con, cited)
        found = evidence.lookup(s.con, cited)
    out = dict(compiled)
    for slug, a in answers.items():
        if a is not None:
            out[slug] = with_synthesis(compiled[slug], a, payloads, found, ev._pages,
                                       f"{tier}:{settings.model}")
    return out


__all__ = ["CONCEPTS_DIR", "CompileReport", "DroppedClaim", "compile_wiki"]
