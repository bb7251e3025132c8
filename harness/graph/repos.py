"""A graph's shared-repo nodes as MonoRepo members.

A repo node with `member: NAME` is a git worktree of that member at the node's path under the
graph's work dir, on branch `forge/graph/<graph>/<node>`, made from the member's commit in the
snapshot the run records (`GraphRunStarted.repo_snapshot`). The pinned commit is also the
worktree's own ref `refs/worktree/forge-pin`, so node work can return to it. A worktree made
by an earlier run is kept as it is (a resumed run continues on it). A repo node without
`member` stays a bare folder. Git runs in a node's worktree only located (repos/worktrees.py
`locate`: forge's admin directory, neutralised config).
"""

from __future__ import annotations

from pathlib import Path

from ...ledger.workspace import Workspace
from ...projections.graph import GraphView
from ...repos import commands as repo_commands
from ...repos.errors import RepoError
from ...repos.git import commit_of, git
from ...repos.worktrees import locate
from ..errors import HarnessError
from .work import repo_dir

PIN_REF = "refs/worktree/forge-pin"


def graph_branch(graph_id: str, node: str) -> str:
    return f"forge/graph/{graph_id}/{node}"


def member_nodes(ws: Workspace, graph_id: str, view: GraphView) -> list[tuple[str, str, Path]]:
    """(node, member, directory) of the member repo nodes, checked before anything is
    recorded: the workspace has a MonoRepo with that member, the directory is free or ours."""
    nodes = [(n.id, n.spec.member, repo_dir(ws, graph_id, n.id, n.spec.path))
             for n in view.nodes.values() if n.kind == "repo" and n.spec.member]
    if not nodes:
        return []
    try:
        mono = repo_commands.open_monorepo(ws)
    except RepoError as e:
        raise HarnessError(f"graph {graph_id!r}: repo nodes name MonoRepo members: {e}"
                           ) from None
    for node, member, d in nodes:
        try:
            mono.member(str(member))
            if d.exists() and any(d.iterdir()) and not (d / ".git").exists():
                raise RepoError(f"{d} exists and is not a worktree of member {member}")
        except RepoError as e:
            raise HarnessError(f"graph {graph_id!r}: repo node {node}: {e}") from None
    return [(n, m, d) for n, m, d in nodes if m is not None]


def pin_members(ws: Workspace, graph_id: str, nodes: list[tuple[str, str, Path]]
                ) -> str | None:
    """Record the MonoRepo's state and make each member node's worktree (module contract)."""
    if not nodes:
        return None
    mono = repo_commands.open_monorepo(ws)
    snap = repo_commands.take_snapshot(ws, f"graph {graph_id} run", mono)
    commits = {m.name: m.commit for m in snap.members}
    for node, member, d in nodes:
        if (d / ".git").exists():
            continue
        repo = mono.member_dir(member)
        branch = graph_branch(graph_id, node)
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            if commit_of(f"refs/heads/{branch}", repo) is not None:
                git(["worktree", "add", "-q", str(d), branch], repo)
            else:
                git(["worktree", "add", "-q", "-b", branch, str(d), str(commits[member])], repo)
            git(["update-ref", PIN_REF, str(commits[member])], locate(repo, d))
        except RepoError as e:
            raise HarnessError(f"graph {graph_id!r}: repo node {node}: {e}") from None
    return snap.snapshot_id
