"""A compiled concept page as a journal page (wiki.page.Page): its state on top, the model's
synthesis when there is one, each section as a table or a list with a citation link per
claim, the points its findings hold for, the claims dropped and why. Everything the record
holds (claims, reasons, point names) is plain text on the page: only forge makes links, to
the journal pages of the cited events, the points and the profiles."""

from __future__ import annotations

import hashlib
from typing import Any

from ..numbers import count
from ..page import Page, join, link, strong, text
from ..pages import point_path, profile_path
from .model import CONCEPTS_DIR, Catalog, Citation, ConceptPage, Freshness

INDEX = f"{CONCEPTS_DIR}/index"
KIND_TITLES = {"flag": "Engine flags and kernel backends", "pairing": "Model × accelerator",
               "failure": "Recurring failures", "direction": "Rejected directions"}


def cite(c: Citation) -> Any:
    label = f"e:{c.event_id[:8]}"
    return link(c.page, label) if c.page else label


def cites(cs: tuple[Citation, ...]) -> Any:
    return join(" ", [cite(c) for c in cs])


def outcomes(p: ConceptPage, point_hash: str) -> str:
    """What was found on one point, e.g. "accepted 1, rejected 2"."""
    n: dict[str, int] = {}
    for c in p.claims:
        if c.point == point_hash and c.outcome:
            n[c.outcome] = n.get(c.outcome, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(n.items())) or "-"


def sources_digest(page: ConceptPage) -> str:
    joined = "\n".join(f"{s.event_id} {s.sha256}" for s in page.sources)
    return "sha256:" + hashlib.sha256(joined.encode()).hexdigest()


def concept_page(p: ConceptPage, state: Freshness | None = None,
                 reasons: tuple[str, ...] | None = None) -> Page:
    state = state or p.state
    reasons = p.reasons if reasons is None else reasons
    page = Page(p.path, "concept", p.title, position=p.compiled_at, summary=p.summary,
                meta={"concept_kind": p.kind, "concept": p.concept, "state": state,
                      "compiled_at": p.compiled_at, "author": p.author,
                      "model": p.model, "claims": len(p.claims), "dropped": len(p.dropped),
                      "points": sorted(x.runtime_profile or x.point_hash for x in p.points),
                      "sources": len(p.sources), "sources_sha256": sources_digest(p)},
                embed=f"{p.title}. {p.summary}")
    page.add("p", text(strong(f"State: {state}"),
                       f" — compiled at ledger position {p.compiled_at} from "
                       f"{count(len(p.sources), 'event')}, by the {p.author}"
                       + (f" ({p.model})" if p.model else "") + ". ", p.summary))
    if reasons:
        page.add("list", list(reasons))
    model_claims = [c for c in p.claims if c.author == "model"]
    if model_claims:
        page.add("h", "Synthesis")
        page.add("list", [text(c.text, " ", cites(c.citations)) for c in model_claims])
    for sec in p.sections:
        rows = [c for c in p.claims if c.section == sec.name and c.author == "compiler"]
        if not rows:
            continue
        page.add("h", sec.name)
        if sec.columns:
            page.add("table", [*sec.columns, "cites"],
                     [(*(c.row or (c.text,)), cites(c.citations)) for c in rows])
        else:
            page.add("list", [text(c.text, " ", cites(c.citations)) for c in rows])
    if p.points:
        page.add("h", "Points it holds for")
        page.add("table", ["point", "model", "accelerator", "engine", "runtime profile",
                           "findings"],
                 [(link(point_path(x.point_hash), x.point_hash[:19]), x.model, x.accelerator,
                   x.engine, link(profile_path(x.runtime_profile), x.runtime_profile)
                   if x.runtime_profile else "-", outcomes(p, x.point_hash))
                  for x in p.points])
    if p.dropped:  # why, never the dropped text: nothing uncited is published
        page.add("h", "Claims dropped")
        page.add("p", f"{count(len(p.dropped), 'generated sentence')} failed the citation check "
                      f"and {'is' if len(p.dropped) == 1 else 'are'} not shown (forge wiki "
                      "compile --json lists them):")
        page.add("list", [d.reason for d in p.dropped])
    page.add("p", text("Part of ", link(INDEX, "the concept catalog"), "."))
    return page


def catalog_page(cat: Catalog, states: dict[str, tuple[Freshness, tuple[str, ...]]]) -> Page:
    page = Page(INDEX, "concepts", "Concepts", position=cat.position,
                summary=f"{count(len(cat.pages), 'concept page')} compiled across tasks",
                meta={"pages": len(cat.pages)})
    page.add("p", f"{count(len(cat.pages), 'concept page')}, compiled at ledger position "
                  f"{cat.position}. Every claim on them cites the ledger events it comes "
                  "from; the wiki's SCHEMA.md says how they are made.")
    for kind, title in KIND_TITLES.items():
        ps = sorted((p for p in cat.pages.values() if p.kind == kind), key=lambda p: p.slug)
        if not ps:
            continue
        page.add("h", title)
        page.add("table", ["concept", "state", "claims", "points", "summary"],
                 [(link(p.path, p.title), states.get(p.slug, (p.state, ()))[0],
                   len(p.claims), len(p.points), p.summary) for p in ps])
    return page
