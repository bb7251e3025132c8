"""The MonoRepo operations the CLI and the harness call, on a workspace.

- `init(ws, manifest)`: create or adopt the root at `[repos] root` (recorded), and install
  the push guard's pre-push hooks (repos/hooks.py).
- `snapshot(ws, reason)`: take and record the root's state; its id.
- `restore(ws, snapshot_id)`: record the current state, then bring the root back to the
  recorded one (byte-exact, checked).
- `status(ws)`: members, pins, dirty state, which tasks hold worktrees.
- `sync(ws, member)`: fetch, bring branches onto their upstream, record the outcomes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..ledger import events as E
from ..ledger.workspace import Workspace
from ..projections.errors import ProjectionError
from ..projections.repos import find_snapshot
from . import snapshot as snap
from . import worktrees
from .errors import RepoError
from .git import Tree
from .hooks import install_hooks
from .record import append, record_snapshot
from .root import MonoRepo, init_root
from .sync import sync as sync_members

Progress = Callable[[str], None]


def root_of(ws: Workspace) -> Path:
    return ws.config.monorepo_root


def open_monorepo(ws: Workspace) -> MonoRepo:
    return MonoRepo.open(root_of(ws))


def maybe_monorepo(ws: Workspace) -> MonoRepo | None:
    """The workspace's MonoRepo, or None when it has none (`forge repos init` not run)."""
    root = root_of(ws)
    if not (root / "forge-repos.yaml").is_file():
        return None
    return MonoRepo.open(root)


def worktree_base(ws: Workspace) -> Path:
    return ws.home / "worktrees"


def init(ws: Workspace, manifest: str | Path, progress: Progress | None = None
         ) -> dict[str, Any]:
    mono, adopted = init_root(manifest, root_of(ws), progress)
    install_hooks(mono, ws.home)
    text = (mono.root / "forge-repos.yaml").read_bytes()
    append(ws, [E.MonoRepoInitialized(root=str(mono.root),
                                      manifest_digest=ws.artifacts.put(text, verbatim=True),
                                      members=[m.name for m in mono.manifest.members],
                                      adopted=adopted)])
    sid = snapshot(ws, "init", mono=mono)
    return {"root": str(mono.root), "adopted": adopted, "snapshot_id": sid,
            "members": [{"name": m.name, "path": m.rel_path, "group": m.group,
                         "url": m.url, "branch": m.branch} for m in mono.manifest.members]}


def take_snapshot(ws: Workspace, reason: str, mono: MonoRepo | None = None, *,
                  overrides: dict[str, Tree] | None = None) -> E.RepoSnapshotted:
    """Take and record the root's state. `overrides` (member -> a task's worktree of it,
    located: repos/worktrees.py `locate`) records that tree's state in the member's place:
    what a task ran on."""
    mono = mono or open_monorepo(ws)
    sid, members = snap.take(mono, ws.artifacts)
    if overrides:
        # Detached: restoring it puts the member checkout on that commit, and never takes a
        # task's branch (checked out in the task's worktree) into the root.
        members = [snap.member_state(m.name, m.path, overrides[m.name], ws.artifacts)
                   .model_copy(update={"branch": None})
                   if m.name in overrides else m for m in members]
        sid = snap.snapshot_id(members)
    ev = E.RepoSnapshotted(snapshot_id=sid, root=str(mono.root), members=members,
                           reason=reason)
    record_snapshot(ws, ev)
    return ev


def snapshot(ws: Workspace, reason: str = "forge repos snapshot",
             mono: MonoRepo | None = None) -> str:
    return take_snapshot(ws, reason, mono).snapshot_id


def restore(ws: Workspace, snapshot_id: str) -> dict[str, Any]:
    mono = open_monorepo(ws)
    try:
        target = find_snapshot(ws.ledger, snapshot_id)
    except ProjectionError as e:
        raise RepoError(str(e)) from None
    before = snapshot(ws, f"before restore of {target.snapshot_id}", mono)
    sid = snap.restore(mono, ws.artifacts, target.members)
    append(ws, [E.RepoRestored(snapshot_id=sid, root=str(mono.root),
                               previous_snapshot_id=before)])
    return {"snapshot_id": sid, "previous_snapshot_id": before, "root": str(mono.root)}


def status(ws: Workspace) -> dict[str, Any]:
    mono = open_monorepo(ws)
    sid, members = snap.take(mono, ws.artifacts)
    held = worktrees.holders(mono)
    rows = []
    for m in members:
        man = None if m.name == "." else mono.member(m.name)
        rows.append({
            "name": m.name, "path": m.path, "group": man.group if man else "workspace",
            "url": m.url, "branch": m.branch, "commit": m.commit, "dirty": m.dirty,
            "changed": m.diff_digest is not None, "untracked": len(m.untracked),
            "worktrees": [{"task_id": w.task_id, "path": str(w.path), "branch": w.branch,
                           "head": w.head} for w in held.get(m.name, [])]})
    return {"root": str(mono.root), "snapshot_id": sid, "members": rows}


def sync(ws: Workspace, member: str | None = None, progress: Progress | None = None, *,
         branch: str | None = None) -> list[E.RepoSynced]:
    """`forge repos sync`: fetch and bring the members' branches onto their upstream
    (repos/sync.py), and record one RepoSynced per branch (conflicts and failures too);
    `branch`: that task branch alone."""
    events = sync_members(open_monorepo(ws), member, progress, branch=branch)
    if events:
        append(ws, events)
    return events
