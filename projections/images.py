"""Images pinned at first use: which digest each `digest: resolve` image name was resolved to.

Contract: `resolved_image(ledger, name)` is the first `ImageResolved` for `name` on the
`workspace` stream (the one a resolution appends once per name), or None.
"""

from __future__ import annotations

from ..ledger import events as E
from ..ledger.store import Ledger
from ..ledger.streams import WORKSPACE_STREAM


def resolved_image(ledger: Ledger, name: str) -> E.ImageResolved | None:
    for r in ledger.stream(WORKSPACE_STREAM):
        if isinstance(r.event, E.ImageResolved) and r.event.name == name:
            return r.event
    return None
