"""The concept pages on the site (`forge wiki build`): the compiled catalog's pages with their
state as of the index now, the catalog page, and the site's llms.txt."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..page import Page, md_escape
from . import evidence
from .freshness import page_states
from .model import CATALOG, concepts_dir, load_catalog
from .render import catalog_page, concept_page

LLMS = "llms.txt"


def catalog_digest(wiki_dir: Path) -> str | None:
    """What the site's concept pages are made of, besides the index (a build at an unchanged
    index position renders again after a compile)."""
    try:
        return hashlib.sha256((concepts_dir(wiki_dir) / CATALOG).read_bytes()).hexdigest()
    except OSError:
        return None


def site_pages(con: Any, wiki_dir: Path) -> list[Page]:
    """The compiled concept pages (state as of `con`'s index now) and the catalog page (also
    when a compile found no concept: the journal holds its catalog page); none when nothing
    was compiled."""
    cat = load_catalog(wiki_dir)
    if not cat.pages and not (concepts_dir(wiki_dir) / CATALOG).is_file():
        return []
    states = page_states(evidence.load(con), cat)
    pages = [concept_page(p, *states[slug]) for slug, p in cat.pages.items()]
    return [catalog_page(cat, states), *pages]


def _item(p: Page) -> str:
    summary = f": {md_escape(p.summary)}" if p.summary else ""
    return f"- [{md_escape(p.title)}]({p.path}.html){summary}"


def llms_txt(pages: Sequence[Page]) -> str:
    """The site's llms.txt (llmstxt.org): what the site is, and where a model starts reading.
    Titles and summaries are escaped (never markup); links are page paths forge made."""
    by = {p.path: p for p in pages}
    concepts = sorted((p for p in pages if p.kind == "concept"), key=lambda p: p.path)
    out = ["# infer-forge journal", "",
           "> An engineering journal of LLM inference optimization compiled from an "
           "append-only ledger. Every claim on a concept page cites the ledger events it "
           "comes from; SCHEMA.md in the journal says how pages are made.", "",
           "## Start here", ""]
    for path in ("index", "concepts/index", "log", "search"):
        if path in by:
            out.append(_item(by[path]))
    if concepts:
        out += ["", "## Concepts", ""] + [_item(p) for p in concepts]
    rest = [p for p in pages if p.kind in ("task", "graph")]
    if rest:
        out += ["", "## Optional", ""] + [_item(p) for p in sorted(rest, key=lambda p: p.path)]
    return "\n".join(out) + "\n"
