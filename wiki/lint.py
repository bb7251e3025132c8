"""`forge wiki lint`: broken wiki links, orphan pages, pages without typed frontmatter, and
whether the journal is behind the ledger; with the workspace, the checks that need the whole
record (record_lint.py): contradictions, stale claims, concepts without a page.

Errors (exit 1): broken links, orphans, untyped pages, contradictions. Warnings (exit 1 only
with `strict`): stale claims, concepts without a page, concept pages whose concept the ledger
no longer shows (orphaned: `forge wiki compile` removes them), a journal behind the ledger."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ledger.workspace import Workspace
from .page import LINK, parse_frontmatter

ROOTS = {"index", "log", "SCHEMA"}  # entry points (SCHEMA.md: the wiki's schema): never orphans
DERIVED_SECTIONS = ("## Backlinks",)  # links there mirror other pages' links


@dataclass
class LintReport:
    pages: int = 0
    links: int = 0
    broken: list[dict[str, str]] = field(default_factory=list)  # {page, target}
    orphans: list[str] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    wiki_position: int | None = None
    ledger_position: int | None = None
    findings: int = 0  # accepted decisions the record checks looked at
    contradictions: list[dict[str, Any]] = field(default_factory=list)
    stale_claims: list[dict[str, Any]] = field(default_factory=list)
    missing_concepts: list[dict[str, Any]] = field(default_factory=list)
    orphaned_concepts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        return (self.ledger_position is not None
                and (self.wiki_position or 0) < self.ledger_position)

    @property
    def ok(self) -> bool:
        return not (self.broken or self.orphans or self.untyped or self.contradictions)

    @property
    def warnings(self) -> int:
        return (len(self.stale_claims) + len(self.missing_concepts)
                + len(self.orphaned_concepts) + self.stale)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "stale": self.stale, "ok": self.ok,
                "warnings": self.warnings}


_TICKS = re.compile(r"`+")


def without_code_spans(line: str) -> str:
    """`line` with its inline code spans (a run of N backticks to the next run of exactly N,
    CommonMark) blanked out: what is inside is code, not links. A backslash-escaped backtick
    opens nothing; a run without its closing run is literal text."""
    runs = list(_TICKS.finditer(line))
    out, pos, k = [], 0, 0
    while k < len(runs):
        m = runs[k]
        opener = m.group()
        start = m.start()
        if start > 0 and line[start - 1] == "\\":  # `\`` is a literal backtick
            opener, start = opener[1:], start + 1
        close = next((j for j in range(k + 1, len(runs))
                      if len(runs[j].group()) == len(opener)), None) if opener else None
        if close is None:
            k += 1
            continue
        out += [line[pos:start], " " * (runs[close].end() - start)]
        pos, k = runs[close].end(), close + 1
    return "".join(out) + line[pos:]


def forward_links(text: str, derived: bool = False) -> list[str]:
    """Wiki links in a page's body: not in the frontmatter (data), not in fenced code or an
    inline code span (verbatim), and not in derived sections unless `derived`."""
    out: list[str] = []
    skipping = False
    fence = ""
    lines = text.splitlines()
    start = 0
    if lines and lines[0] == "---":
        end = next((i for i, line in enumerate(lines[1:], 1) if line == "---"), None)
        start = end + 1 if end is not None else 0
    for line in lines[start:]:
        if fence:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = ""
            continue
        if line.startswith(("```", "~~~")):
            fence = line[:len(line) - len(line.lstrip(line[0]))]
            continue
        if line.startswith("## "):
            skipping = not derived and line.startswith(DERIVED_SECTIONS)
        if not skipping:
            out.extend(m.group(1) for m in LINK.finditer(without_code_spans(line)))
    return out


def lint_dir(wiki_dir: Path) -> LintReport:
    rep = LintReport()
    files = sorted(wiki_dir.rglob("*.md"))
    pages = {f.relative_to(wiki_dir).with_suffix("").as_posix(): f for f in files}
    incoming: dict[str, set[str]] = defaultdict(set)
    for name, f in pages.items():
        text = f.read_text(encoding="utf-8")
        if not parse_frontmatter(text).get("type"):
            rep.untyped.append(name)
        for target in forward_links(text):
            rep.links += 1
            if target not in pages:
                rep.broken.append({"page": name, "target": target})
            elif target != name:
                incoming[target].add(name)
    rep.pages = len(pages)
    rep.orphans = sorted(n for n in pages if n not in ROOTS and not incoming.get(n))
    state = wiki_dir / "_state.json"
    if state.exists():
        rep.wiki_position = json.loads(state.read_text()).get("position")
    return rep


def lint(ws: Workspace, record: bool = True) -> LintReport:
    """The journal's files, and (`record`) the checks over the whole record."""
    wiki_dir = Path(ws.home) / "wiki"
    rep = lint_dir(wiki_dir)
    rep.ledger_position = ws.ledger.max_position()
    if record:
        # In the function for start-up time: `--files-only` does not load the record's
        # checks and the concepts (~140 ms).
        from .concepts.model import load_catalog
        from .record_lint import check_record

        catalog = load_catalog(wiki_dir)
        r = check_record(ws, {p.path for p in catalog.pages.values()}, concepts_known)
        rep.findings, rep.contradictions = r.findings, r.contradictions
        rep.stale_claims, rep.missing_concepts = r.stale_claims, r.missing_concepts
        shown = set(r.known_concepts.values())
        rep.orphaned_concepts = [{"page": p.path, "concept": p.concept}
                                 for _, p in sorted(catalog.pages.items())
                                 if p.concept not in shown]
    return rep


def concepts_known(con: Any) -> dict[str, str]:
    """Concept page path -> concept key, for every concept the index shows now (what
    `forge wiki compile` would write a page for)."""
    # In the function for start-up time: the concepts' evidence, with the record's checks.
    from .concepts.evidence import derive, load
    from .concepts.model import concept_path

    return {concept_path(d.slug): d.concept for d in derive(load(con)).values()}
