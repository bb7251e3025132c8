"""The one writer of the `repos` stream (ledger/streams.py).

Appends carry deterministic command ids where the fact has one identity: a snapshot is saved
once per id (`repo-snapshot:<id>`), an approval once per approval id; a refusal or a sync is
a new fact each time.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ledger import events as E
from ..ledger.store import SaveResult
from ..ledger.streams import REPOS_STREAM
from ..ledger.workspace import Workspace


def append(ws: Workspace, events: Sequence[E.Event], command_id: str | None = None
           ) -> SaveResult:
    return ws.ledger.append(REPOS_STREAM, list(events), command_id=command_id)


def record_snapshot(ws: Workspace, ev: E.RepoSnapshotted) -> None:
    append(ws, [ev], command_id=f"repo-snapshot:{ev.snapshot_id}")
