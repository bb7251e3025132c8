"""Reads of the `repos` stream: the MonoRepo's snapshots, pushes refused and allowed, syncs.

One pass over the stream folds what the callers need: snapshots by id, the refusals, the
allowed pushes and syncs in order. Undecodable events are left out (`forge check` reports
them). A push's approval lives on the `approvals` stream (projections/approvals.py);
`PushApproved` events of older ledgers are not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ledger import events as E
from ..ledger.store import Ledger
from ..ledger.streams import REPOS_STREAM
from .errors import ProjectionError


@dataclass
class RepoHistory:
    version: int = 0
    root: str | None = None
    snapshots: dict[str, E.RepoSnapshotted] = field(default_factory=dict)
    allowed: list[E.PushAllowed] = field(default_factory=list)  # each used an approval
    refusals: list[E.PushRefused] = field(default_factory=list)
    syncs: list[E.RepoSynced] = field(default_factory=list)
    restores: list[E.RepoRestored] = field(default_factory=list)


def read_repo_history(ledger: Ledger) -> RepoHistory:
    h = RepoHistory()
    for rec in ledger.stream(REPOS_STREAM, on_error=lambda _u: None):
        ev = rec.event
        h.version = rec.version
        if isinstance(ev, E.MonoRepoInitialized):
            h.root = ev.root
        elif isinstance(ev, E.RepoSnapshotted):
            h.snapshots[ev.snapshot_id] = ev
        elif isinstance(ev, E.PushAllowed):
            h.allowed.append(ev)
        elif isinstance(ev, E.PushRefused):
            h.refusals.append(ev)
        elif isinstance(ev, E.RepoSynced):
            h.syncs.append(ev)
        elif isinstance(ev, E.RepoRestored):
            h.restores.append(ev)
    return h


def find_snapshot(ledger: Ledger, snapshot_id: str) -> E.RepoSnapshotted:
    """The recorded snapshot with this id (or a unique prefix of at least 8 characters)."""
    snaps = read_repo_history(ledger).snapshots
    if snapshot_id in snaps:
        return snaps[snapshot_id]
    hits = [s for k, s in snaps.items() if len(snapshot_id) >= 8 and k.startswith(snapshot_id)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ProjectionError(f"snapshot {snapshot_id!r} is ambiguous: "
                              f"{', '.join(sorted(s.snapshot_id for s in hits))}")
    raise ProjectionError(f"no snapshot {snapshot_id!r} in the ledger (forge repos snapshot "
                          "records one)")
