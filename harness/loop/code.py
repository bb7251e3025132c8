"""Code candidates: a task that changes MonoRepo members (`code:` in the task file).

- `resolve`: before a block starts, each `code.<member>` of the candidate becomes the full
  commit id it names, in the task's own worktree of that member (repos/worktrees.py):
  a commit or ref as is (a branch only the member's `origin` has: `origin/<branch>`);
  `worktree` commits the worktree's current state on the task branch;
  `patch:<file>` applies the patch (relative to the task file) and commits it; `upstream`
  brings the task branch onto the member's upstream (repos/sync.py; an upstream-sync task's
  candidate: a conflict refuses the candidate with the files, recorded, tree untouched).
  What the block records is that commit id, so a candidate is exactly re-runnable.
- `prepare`: before a block is measured, every changed member's worktree is put on the
  block's commit (its pinned commit for a block without `code.<member>`, the baseline), built
  (harness/tool_calls/build.py, cached) and handed to the evaluator as `FORGE_WORKTREE_<MEMBER>`
  and `FORGE_WORKTREES` (JSON). A member with a `deploy:` recipe is also built into a
  deployable (harness/engines/commit_build.py: an environment or an image of that commit,
  cached by its inputs), each venv build layered on the one before it and the first on the
  profile's Python; `Prepared.builds` hands them to the evaluator (the engine evaluator
  launches from them), `FORGE_BUILDS` (JSON) to a command. A failed build is a failed run,
  as data.
- `keep_refs`: a decided block's commits stay findable: `refs/forge/accepted/<task>/<block>`
  or `refs/forge/rejected/<task>/<block>` in the member, named in the decision's evidence.
- `snapshot`: the MonoRepo's state as this task sees it (the task's worktrees in place of
  the members they change), recorded; its id goes into measurement, tool-call and
  verification events (`input_digests.repo_snapshot`).
- `release`: the task's worktrees go when it exits (`code.keep_worktrees` keeps them).

Every git run here in a task's worktree (which the task's calls may have written: its `.git`
file, its admin directory, its files) runs on the located `git.Tree` (repos/worktrees.py
`locate`): forge's admin directory and neutralised config, or a one-line refusal. A patch
file is read once, at most `MAX_PATCH_BYTES`, and handed to git on stdin.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...ledger import events as E
from ...ledger.payloads import Digest
from ...ledger.specs import CODE_PREFIX
from ...ledger.workspace import Workspace
from ...projections.errors import ProjectionError
from ...projections.repos import find_snapshot
from ...repos import commands as repo_commands
from ...repos import worktrees
from ...repos.errors import RepoError
from ...repos.git import Tree, commit_of, commit_or_origin, git, read_small
from ...repos.root import MonoRepo
from ..errors import HarnessError
from ..task import LOOP_ACTOR, LoadedTask, Progress

if TYPE_CHECKING:
    from ..engines.commit_build import Deployable

WORKTREE_TOKEN = "worktree"
UPSTREAM_TOKEN = "upstream"
PATCH_PREFIX = "patch:"
MAX_PATCH_BYTES = 64 << 20  # a `patch:<file>` candidate is read whole


def code_members(lt: LoadedTask) -> list[str]:
    return list(lt.task.code.members) if lt.task.code else []


def task_monorepo(ws: Workspace, lt: LoadedTask) -> MonoRepo:
    try:
        mono = repo_commands.open_monorepo(ws)
    except RepoError as e:
        raise HarnessError(f"task {lt.task_id} changes code of {code_members(lt)}: {e}") from None
    for m in code_members(lt):
        try:
            mono.member(m)
        except RepoError as e:
            raise HarnessError(f"task {lt.task_id}: code.members: {e}") from None
    return mono


def member_commit(mono: MonoRepo, member: str, ref: str, what: str) -> str:
    """The commit `ref` names in the member's checkout: a commit, branch or tag there, else
    the branch of that name on its `origin` (a pushed PR branch). HarnessError starting with
    `what` when it names none."""
    where = mono.member_dir(member)
    try:
        sha = commit_or_origin(ref, where)
    except RepoError as e:
        raise HarnessError(f"{what}: {e}") from None
    if sha is None:
        raise HarnessError(f"{what} is not a commit, branch or tag of member {member} (nor "
                           f"origin/{ref}) in {where}")
    return sha


def pinned(ws: Workspace, lt: LoadedTask, mono: MonoRepo) -> dict[str, str]:
    """member -> the commit the task pinned when it was defined: its `code.base`, else the
    member's commit in its snapshot."""
    out: dict[str, str] = {}
    if lt.repo_snapshot:
        try:
            snap = find_snapshot(ws.ledger, lt.repo_snapshot)
        except ProjectionError as e:
            raise HarnessError(f"task {lt.task_id}: {e}") from None
        out = {m.name: m.commit for m in snap.members if m.commit}
    if lt.task.code is not None:
        out.update(lt.task.code.base)  # resolved to commits when the task was defined
    for m in code_members(lt):
        if m not in out:
            head = commit_of("HEAD", mono.member_dir(m))
            if head is None:
                raise HarnessError(f"task {lt.task_id}: member {m} has no commit")
            out[m] = head
    return out


def _worktree(ws: Workspace, lt: LoadedTask, mono: MonoRepo, member: str,
              pins: dict[str, str]) -> worktrees.Worktree:
    """The task's worktree of `member`, made from its pin (`pinned`, read once per step),
    located (git runs in it as repos/worktrees.py `locate` says)."""
    try:
        return worktrees.ensure(mono, repo_commands.worktree_base(ws), member, lt.task_id,
                                pins[member])
    except RepoError as e:
        raise HarnessError(f"task {lt.task_id}: member {member}: {e}") from None


def resolve(ws: Workspace, lt: LoadedTask, candidate: dict[str, Any]) -> dict[str, Any]:
    """The candidate with each `code.<member>` as a full commit id (module contract).
    Raises HarnessError naming the key and value when one names no commit."""
    keys = [k for k in candidate if k.startswith(CODE_PREFIX)]
    if not keys:
        return candidate
    mono = task_monorepo(ws, lt)
    pins = pinned(ws, lt, mono)
    out = dict(candidate)
    for k in sorted(keys):
        member, value = k[len(CODE_PREFIX):], candidate[k]
        if member not in code_members(lt):
            continue  # out of scope: the block records the refusal (decision.out_of_scope)
        if not isinstance(value, str) or not value:
            raise HarnessError(f"task {lt.task_id}: {k}={json.dumps(value)}: give a commit, "
                               f"`{WORKTREE_TOKEN}` or `{PATCH_PREFIX}<file>`")
        try:
            tree = _worktree(ws, lt, mono, member, pins).tree
            assert tree is not None
            if value == WORKTREE_TOKEN:
                sha: str | None = worktrees.commit_all(
                    tree, f"forge: task {lt.task_id} candidate (worktree state)")
            elif value == UPSTREAM_TOKEN:
                sha = _onto_upstream(ws, lt, member, tree)
            elif value.startswith(PATCH_PREFIX):
                sha = _apply_patch(lt, tree, value[len(PATCH_PREFIX):])
            else:
                sha = commit_or_origin(value, tree)
        except RepoError as e:
            raise HarnessError(f"task {lt.task_id}: {k}={json.dumps(value)}: {e}") from None
        if sha is None:
            raise HarnessError(f"task {lt.task_id}: {k}={json.dumps(value)} is not a commit "
                               f"of member {member}")
        out[k] = sha
    return out


def _onto_upstream(ws: Workspace, lt: LoadedTask, member: str, wt: Tree) -> str:
    """The task branch brought onto the member's upstream (fetch, fast-forward or rebase;
    recorded as RepoSynced); a conflict or failure is the candidate's refusal, as data."""
    if worktrees.dirty(wt):
        worktrees.commit_all(wt, f"forge: task {lt.task_id}: work before upstream sync")
    events = repo_commands.sync(ws, member, branch=worktrees.task_branch(lt.task_id))
    for ev in events:
        if ev.outcome == "conflict":
            raise HarnessError(f"upstream sync of {member}: conflict in "
                               f"{', '.join(c.path for c in ev.conflicts)} (recorded; the "
                               "task branch is left as it was)")
        if ev.outcome == "failed":
            raise HarnessError(f"upstream sync of {member}: {ev.error}")
    head = commit_of("HEAD", wt)
    assert head is not None
    return head


def _apply_patch(lt: LoadedTask, wt: Tree, rel: str) -> str:
    base = lt.base_dir or Path.cwd()
    p = (base / rel).resolve()
    if not p.is_file():
        raise HarnessError(f"task {lt.task_id}: patch file {p} does not exist")
    # Read once, bounded (it may live where a call wrote it); git applies what was read.
    patch = read_small(p, MAX_PATCH_BYTES, "patch file")
    if worktrees.dirty(wt):
        worktrees.commit_all(wt, f"forge: task {lt.task_id}: work before patch {p.name}")
    git(["apply", "--index", "--whitespace=nowarn", "-"], wt, input=patch)
    git(["commit", "-q", "--no-verify", "-m", f"forge: task {lt.task_id}: patch {p.name}"], wt)
    head = commit_of("HEAD", wt)
    assert head is not None
    return head


@dataclass
class Prepared:
    env: dict[str, str] = field(default_factory=dict)
    events: list[E.Event] = field(default_factory=list)  # the builds, as tool calls
    failure: str | None = None
    builds: dict[str, Deployable] = field(default_factory=dict)  # member -> its deployable


def base_python(lt: LoadedTask) -> str:
    """The interpreter a deployable build is layered on: the profile's `python`, else forge's."""
    cfg = lt.profile.config if lt.profile is not None else {}
    py = cfg.get("python")
    return str(py) if isinstance(py, str) and py else sys.executable


def _env_name(member: str) -> str:
    return "FORGE_WORKTREE_" + re.sub(r"[^A-Z0-9]", "_", member.upper())


def worktree_env(ws: Workspace, lt: LoadedTask) -> dict[str, str]:
    """FORGE_WORKTREE_<MEMBER> and FORGE_WORKTREES for the task's worktrees (made if new)."""
    mono = task_monorepo(ws, lt)
    pins = pinned(ws, lt, mono)
    paths = {m: str(_worktree(ws, lt, mono, m, pins).path) for m in code_members(lt)}
    return {**{_env_name(m): p for m, p in paths.items()},
            "FORGE_WORKTREES": json.dumps(paths, sort_keys=True)}


def prepare(ws: Workspace, lt: LoadedTask, block_id: str, candidate: dict[str, Any],
            progress: Progress) -> Prepared:
    """Put each changed member's worktree on the block's commit and build it (contract)."""
    out = Prepared()
    if not code_members(lt):
        return out
    # In the function for start-up time: the build tool (~30 ms, its supervisor and cache)
    # loads for a task with code members only; every loop module imports this one.
    from ..tool_calls.build import build

    mono = task_monorepo(ws, lt)
    pins = pinned(ws, lt, mono)
    paths: dict[str, str] = {}
    for m in code_members(lt):
        sha = candidate.get(CODE_PREFIX + m) or pins[m]
        wt = _worktree(ws, lt, mono, m, pins)
        tree = wt.tree
        assert tree is not None
        if worktrees.dirty(tree):  # an executor's unrecorded edits: kept on a ref
            wip = worktrees.commit_all(tree, f"forge: task {lt.task_id}: uncommitted work "
                                       f"before {block_id}")
            git(["update-ref", f"refs/forge/wip/{lt.task_id}/{block_id}/{m}", wip], tree)
        git(["reset", "-q", "--hard", sha], tree)
        paths[m] = str(wt.path)
        out.env[_env_name(m)] = str(wt.path)
        if lt.task.code and lt.task.code.build and mono.member(m).build is not None:
            progress(f"build {m} at {sha[:12]}")
            res = build(ws, mono, m, wt.path, progress=progress, task=lt.task_id,
                        sandbox=lt.task.sandbox)
            ev = res.tool_event
            out.events.append(ev.model_copy(update={
                "task_id": lt.task_id, "block_id": block_id, "actor": LOOP_ACTOR,
                "input_digests": {**lt.digests, **ev.input_digests}}))
            if not res.success and out.failure is None:
                out.failure = f"build of member {m} at {sha[:12]} failed: {res.error}"
    out.env["FORGE_WORKTREES"] = json.dumps(paths, sort_keys=True)
    if out.failure is None and lt.task.code and lt.task.code.build:
        _deployables(ws, lt, mono, pins, candidate, block_id, out, progress)
    return out


def _deployables(ws: Workspace, lt: LoadedTask, mono: MonoRepo, pins: dict[str, str],
                 candidate: dict[str, Any], block_id: str, out: Prepared,
                 progress: Progress) -> None:
    """Each member with a `deploy:` recipe built at the block's commit (module contract)."""
    members = [m for m in code_members(lt) if mono.member(m).deploy is not None]
    if not members:
        return
    # In the function for start-up time, as the build tool above.
    from ..engines import commit_build

    python = base_python(lt)
    for m in members:
        sha = candidate.get(CODE_PREFIX + m) or pins[m]
        b = commit_build.build(ws, mono, m, sha, base_python=python, task=lt.task_id,
                               sandbox=lt.task.sandbox, say=progress)
        if b.event is not None:
            out.events.append(b.event.model_copy(update={
                "task_id": lt.task_id, "block_id": block_id, "actor": LOOP_ACTOR,
                "input_digests": {**lt.digests, **b.event.input_digests}}))
        if not b.success:
            out.failure = b.error or f"build of {m}@{sha[:12]} failed"
            return
        progress(f"{m}@{sha[:12]}: {'cached build' if b.cached else 'built'} "
                 f"{b.module} {b.version or '(no version)'}")
        out.builds[m] = b
        if b.kind == "venv" and b.python:
            python = b.python  # the next member's environment sees this one
    layered = commit_build.check_layered(list(out.builds.values()))
    if layered is not None:
        out.failure = layered
    out.env["FORGE_BUILDS"] = json.dumps({m: {**b.record(), "python": b.python}
                                          for m, b in out.builds.items()}, sort_keys=True)


def keep_refs(ws: Workspace, lt: LoadedTask, block_id: str, candidate: dict[str, Any],
              events: list[E.Event]) -> list[E.Event]:
    """Name each decided commit on a ref (module contract); the events with that evidence."""
    code = {k[len(CODE_PREFIX):]: v for k, v in candidate.items() if k.startswith(CODE_PREFIX)}
    if not code:
        return events
    mono = task_monorepo(ws, lt)
    out: list[E.Event] = []
    for ev in events:
        if not isinstance(ev, E.DeliverableAccepted | E.DirectionRejected):
            out.append(ev)
            continue
        kind = "accepted" if isinstance(ev, E.DeliverableAccepted) else "rejected"
        refs = []
        for m, sha in sorted(code.items()):
            ref = f"refs/forge/{kind}/{lt.task_id}/{block_id}/{m}"
            git(["update-ref", ref, sha], mono.member_dir(m))
            refs.append(f"commit:{m}@{sha} {ref}")
        out.append(ev.model_copy(update={"evidence": [*ev.evidence, *refs]}))
    return out


def snapshot(ws: Workspace, lt: LoadedTask | None, reason: str) -> str | None:
    """Record the MonoRepo's state as the task sees it; its id (None: no MonoRepo)."""
    mono = repo_commands.maybe_monorepo(ws)
    if mono is None:
        return None
    overrides: dict[str, Tree] = {}
    try:
        if lt is not None:
            # forge's own path of each worktree, never one git's admin files name
            base = repo_commands.worktree_base(ws)
            for m in code_members(lt):
                path = worktrees.worktree_path(base, lt.task_id, m)
                if os.path.lexists(path):
                    overrides[m] = worktrees.locate(mono.member_dir(m), path)
        return repo_commands.take_snapshot(ws, reason, mono, overrides=overrides).snapshot_id
    except RepoError as e:
        raise HarnessError(f"repo snapshot ({reason}): {e}") from None


def with_snapshot(events: list[E.Event], snapshot_id: str | None) -> list[E.Event]:
    """The events, each naming the snapshot it ran on (when there is one)."""
    if snapshot_id is None:
        return events
    return [ev.model_copy(update={"input_digests": {**ev.input_digests,
                                                    Digest.REPO_SNAPSHOT: snapshot_id}})
            if isinstance(ev, E.ToolInvoked | E.MeasurementRecorded | E.VerificationRecorded)
            else ev for ev in events]


def release(ws: Workspace, lt: LoadedTask) -> None:
    """Remove the task's worktrees now that it exited (kept on request)."""
    if not code_members(lt):
        return
    mono = repo_commands.maybe_monorepo(ws)
    if mono is None:
        return
    keep = bool(lt.task.code and lt.task.code.keep_worktrees)
    try:
        worktrees.release(mono, repo_commands.worktree_base(ws), lt.task_id, keep=keep)
    except RepoError as e:
        raise HarnessError(f"task {lt.task_id}: release of its worktrees: {e}") from None
