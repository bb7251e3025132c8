"""Freshness of compiled concept pages, against the index now:

- `orphaned`: the ledger no longer shows the concept (evidence.derive gives no draft for it);
- `stale`: events about its concept arrived since it was compiled (the draft's sources hold
  ids the page was not compiled from), or a service of one of its points has a newer runtime
  profile revision than the newest one when it was compiled;
- `fresh`: otherwise.
"""

from __future__ import annotations

from pathlib import Path

from ...ledger.workspace import Workspace
from ...projections.index import open_index
from . import evidence
from .evidence import Draft, Evidence, derive
from .model import Catalog, ConceptPage, Freshness, load_catalog

State = tuple[Freshness, tuple[str, ...]]


def page_state(page: ConceptPage, draft: Draft | None, ev: Evidence) -> State:
    if draft is None:
        return "orphaned", (f"the ledger at position {ev.position} no longer shows "
                            f"{page.concept}",)
    reasons: list[str] = []
    new = draft.sources() - {s.event_id for s in page.sources}
    if new:
        first = min(ev.events[e][0] for e in new if e in ev.events) if any(
            e in ev.events for e in new) else ev.position
        reasons.append(f"{len(new)} new event(s) about {page.concept} since position "
                       f"{page.compiled_at} (the first at {first})")
    services = {p.service for p in page.points if p.service} | set(page.profiles)
    for svc in sorted(services):
        now = ev.latest_revs.get(svc)
        seen = page.profiles.get(svc)
        if seen is None:
            seen = max((p.rev or 0 for p in page.points if p.service == svc), default=0)
        if now is not None and now > seen:
            reasons.append(f"runtime profile {svc}@{now} is newer than {svc}@{seen}, "
                           "which the page was compiled against")
    return ("stale" if reasons else "fresh"), tuple(reasons)


def page_states(ev: Evidence, catalog: Catalog,
                drafts: dict[str, Draft] | None = None) -> dict[str, State]:
    """Each catalog page's state (by slug) against `ev`."""
    drafts = derive(ev) if drafts is None else drafts
    return {slug: page_state(p, drafts.get(p.concept), ev)
            for slug, p in sorted(catalog.pages.items())}


def states_for(ws: Workspace) -> tuple[Catalog, dict[str, State]]:
    """The workspace's catalog and its pages' states now (opens the index, catching up)."""
    catalog = load_catalog(Path(ws.home) / "wiki")
    with open_index(ws) as s:
        ev = evidence.load(s.con)
    return catalog, page_states(ev, catalog)
