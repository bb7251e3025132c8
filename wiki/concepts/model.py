"""The compiled concept page as data, and where it lives on disk.

A concept page synthesizes across tasks: one per concept the ledger shows (kinds below). It
is compiled (`forge wiki compile`, wiki/concepts/compile.py) from index rows only, and every
claim on it cites the ledger events it states. The record is what the site renders, what
`forge wiki ask` reads and what `forge wiki lint` checks; the markdown file is its rendering.

On disk, under the journal (FORGE_HOME/wiki):

    concepts/_catalog.json   the Catalog (every ConceptPage, by slug): the one source of truth
    concepts/<slug>.md       each page's markdown (YAML frontmatter + blocks), for people
    concepts/index.md        the catalog page (the site's list of concepts)
    SCHEMA.md                the wiki's schema (page kinds, frontmatter, citation rules)

A slug is `page_name(f"{kind}-{value}")` (wiki.page: injective, file-system safe), so the
page path is `concepts/<slug>` and the site's file `concepts/<slug>.html`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..files import write_if_changed
from ..page import page_name

# Bump when the record's shape changes: old catalogs recompile whole (2: claims carry their
# point and outcome; 3: candidates by their human titles, ledger/titles.py).
CATALOG_VERSION = 3
CONCEPTS_DIR = "concepts"
CATALOG = "_catalog.json"

# flag: an engine flag or kernel backend at one value (a candidate's key=value) and what it
#   did where; pairing: a model × accelerator pairing; failure: a recurring failure (a gate
#   or check failing again and again, a diagnosis rule firing); direction: a rejected
#   direction (a candidate or a graph node), with how often it came back.
ConceptKind = Literal["flag", "pairing", "failure", "direction"]
KINDS: tuple[str, ...] = ("flag", "pairing", "failure", "direction")
Freshness = Literal["fresh", "stale", "orphaned"]
Author = Literal["compiler", "model"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Citation(_Frozen):
    """One ledger event a claim comes from. `page` is the journal page that shows it (a
    decision's page, else its task's or graph's page; None when no page shows it)."""

    event_id: str
    position: int
    type: str
    page: str | None = None


class Claim(_Frozen):
    """A sentence or a table row that states a result, with the events it comes from.
    `row` holds the cells when the claim is a row of its section's table (columns in the
    Section); `text` is then the row as one sentence (for search, ask and the model)."""

    section: str
    text: str
    row: tuple[str, ...] | None = None
    citations: tuple[Citation, ...] = Field(min_length=1)  # nothing uncited is published
    author: Author = "compiler"
    point: str | None = None  # the point hash the finding holds for (None: not one point)
    # what was found there: a decision's kind (accepted, rejected), a verification's verdict,
    # "measured", "failed" (a failure's occurrence); None for rows that are not a finding
    outcome: str | None = None


class Section(_Frozen):
    """A section of the page: a table (columns given) or a list (no columns)."""

    name: str
    columns: tuple[str, ...] = ()


class PointRef(_Frozen):
    """A deployment point a finding holds for, with the runtime profile revision it was
    measured on (`service`, `rev`: a newer revision of the service makes the page stale)."""

    point_hash: str
    model: str | None = None
    accelerator: str | None = None
    engine: str | None = None
    service: str | None = None
    rev: int | None = None

    @property
    def runtime_profile(self) -> str | None:
        return f"{self.service}@{self.rev}" if self.service and self.rev is not None else None


class SourceEvent(_Frozen):
    """An event the page was compiled from: `sha256` of its type and stored payload (as the
    index holds it), so a reader can tell the page still describes the same record."""

    event_id: str
    position: int
    type: str
    sha256: str


class DroppedClaim(_Frozen):
    """A generated claim that was not published, and why (uncited, unknown event id, a
    figure none of its citations contains, unparsable)."""

    text: str
    reason: str


class ConceptPage(_Frozen):
    kind: ConceptKind
    slug: str
    title: str
    concept: str  # the concept key, e.g. "flag:engine.dtype=bfloat16", "pairing:m@acc"
    summary: str = ""  # one plain line (search, the catalog page)
    points: tuple[PointRef, ...] = ()  # the deployment points its findings hold for
    # service -> its newest runtime profile revision when compiled (a newer one: stale)
    profiles: dict[str, int] = Field(default_factory=dict)
    sections: tuple[Section, ...] = ()
    claims: tuple[Claim, ...] = ()
    compiled_at: int  # the ledger (index) position it was compiled at
    sources: tuple[SourceEvent, ...] = ()  # by position
    author: Author = "compiler"
    model: str | None = None  # "<tier>:<model>" when a model wrote part of it
    dropped: tuple[DroppedClaim, ...] = ()
    state: Freshness = "fresh"  # as of compile; freshness.page_state says it as of now
    reasons: tuple[str, ...] = ()  # why it is not fresh (empty when fresh)

    @property
    def path(self) -> str:
        return concept_path(self.slug)

    def cited(self) -> set[str]:
        return {c.event_id for cl in self.claims for c in cl.citations}


class Catalog(_Frozen):
    version: int = CATALOG_VERSION
    position: int = 0  # the ledger position of the last compile
    pages: dict[str, ConceptPage] = Field(default_factory=dict)  # slug -> page

    def by_concept(self) -> dict[str, ConceptPage]:
        return {p.concept: p for p in self.pages.values()}


def concept_slug(kind: str, value: str) -> str:
    return page_name(f"{kind}-{value}")


def concept_path(slug: str) -> str:
    return f"{CONCEPTS_DIR}/{slug}"


def concepts_dir(wiki_dir: Path) -> Path:
    return Path(wiki_dir) / CONCEPTS_DIR


def load_catalog(wiki_dir: Path) -> Catalog:
    """The catalog under `wiki_dir` (FORGE_HOME/wiki); empty when none was compiled, or when it
    is of another version or damaged (a compile then rebuilds it whole)."""
    path = concepts_dir(wiki_dir) / CATALOG
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Catalog()
    if not isinstance(raw, dict) or raw.get("version") != CATALOG_VERSION:
        return Catalog()
    try:
        return Catalog.model_validate(raw)
    except ValueError:
        return Catalog()


def load_page(wiki_dir: Path, slug: str) -> ConceptPage | None:
    return load_catalog(wiki_dir).pages.get(slug)


def save_catalog(wiki_dir: Path, catalog: Catalog) -> bool:
    """Write the catalog atomically; False when the file already held it."""
    path = concepts_dir(wiki_dir) / CATALOG
    data = json.dumps(catalog.model_dump(mode="json"), sort_keys=True, indent=1,
                      ensure_ascii=False).encode("utf-8")
    return write_if_changed(path, data)
