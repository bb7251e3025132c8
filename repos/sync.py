"""`forge repos sync`: bring each member's branches onto their upstream, never half-way.

For each member (or the one named) `git fetch origin`, then, with upstream
`origin/<manifest branch>`:

- the member checkout's own branch, when it is the manifest branch, is fast-forwarded only. A
  branch that diverged is reported `failed` and left alone: a user's branch in the shared
  checkout is never rewritten.
- every task branch (`forge/task/*`, repos/worktrees.py) is `up-to-date` (upstream is in it),
  fast-forwarded (it is in upstream), or rebased onto upstream. The rebase runs in a temporary
  detached worktree that is always removed, so a task's own worktree is never half-rebased.
  The branch ref moves only when the rebase succeeded (compare-and-swap on the old commit); a
  clean task worktree holding the branch moves with it, a dirty one is left as it is and the
  branch is not moved (`failed`).
- a rebase that stops on conflicts is aborted: the branch and every tree stay exactly as they
  were, and the conflicted files with their conflict-marker hunks come back as data
  (`conflict`).

A member whose fetch fails (remote unreachable) is reported `failed` with git's one line; the
other members are still synced. `sync` only does git work and returns the facts; the caller
records them (repos/commands.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from ..ledger import events as E
from ..ledger.payloads import SyncConflict
from .errors import RepoError
from .git import commit_of, git, is_ancestor, out
from .manifest import Member
from .root import MonoRepo, current_branch
from .worktrees import BRANCH_PREFIX, Worktree, dirty, holders, locate, on_branch

Progress = Callable[[str], None]

MAX_FILES = 100  # conflicted files reported per branch
MAX_HUNKS = 20  # hunks reported per file
MAX_HUNK_BYTES = 4096  # each hunk's text is cut to this
MAX_SCAN_BYTES = 16 << 20  # of a conflicted file, searched for hunks

# The temporary rebase is forge's own machinery: the user's hooks do not run in it, rerere
# does not resolve conflicts behind the report's back, and no other branch is moved along.
_REBASE_CONFIG = ("-c", f"core.hooksPath={os.devnull}", "-c", "rerere.enabled=false",
                  "-c", "rebase.updateRefs=false", "-c", "rebase.autoStash=false")


def sync(mono: MonoRepo, member: str | None = None, progress: Progress | None = None, *,
         branch: str | None = None) -> list[E.RepoSynced]:
    """Fetch and bring on every member's branches (or only `member`'s); one event each.
    `branch` (a task branch) brings on that branch alone: an upstream-sync candidate of one
    task moves no other task's branch and not the member checkout."""
    say = progress or (lambda _s: None)
    members = [mono.member(member)] if member is not None else list(mono.manifest.members)
    held = holders(mono)
    events: list[E.RepoSynced] = []
    for m in members:
        events.extend(_sync_member(mono, m, held.get(m.name, []), say, branch))
    return events


def _sync_member(mono: MonoRepo, m: Member, held: list[Worktree], say: Progress,
                 only: str | None = None) -> list[E.RepoSynced]:
    repo = mono.root / m.rel_path
    upstream = f"origin/{m.branch}"

    def failed(branch: str, error: str, old: str | None = None) -> E.RepoSynced:
        say(f"member {m.name}: {branch}: failed: {error}")
        return E.RepoSynced(member=m.name, branch=branch, upstream=upstream,
                            outcome="failed", old=old, error=error)

    if not (repo / ".git").exists():
        return [failed(m.branch, f"{repo} is not checked out (run `forge repos init`)")]
    say(f"member {m.name}: fetching origin")
    try:
        git(["fetch", "-q", "origin"], repo)
    except RepoError as e:
        return [failed(m.branch, f"fetch: {e}")]
    up = commit_of(f"refs/remotes/{upstream}", repo)
    if up is None:
        return [failed(m.branch, f"{upstream} does not exist after fetching origin")]

    events: list[E.RepoSynced] = []
    if only is None and current_branch(repo) == m.branch:
        events.append(_fast_forward_checkout(m.name, repo, m.branch, upstream, up, say))
    by_branch = {w.branch: w for w in held}
    for branch in _task_branches(repo):
        if only is not None and branch != only:
            continue
        events.append(_sync_task_branch(m.name, repo, branch, upstream, up,
                                        by_branch.get(branch), say))
    return events


def _task_branches(repo: Path) -> list[str]:
    text = out(["for-each-ref", "--format=%(refname)", "refs/heads/" + BRANCH_PREFIX], repo)
    return [r[len("refs/heads/"):] for r in text.splitlines() if r]


def _fast_forward_checkout(member: str, repo: Path, branch: str, upstream: str, up: str,
                           say: Progress) -> E.RepoSynced:
    """The member checkout's own branch: fast-forward only; a diverged one is left alone."""
    old = commit_of("HEAD", repo)
    ev = dict(member=member, branch=branch, upstream=upstream, old=old)
    if old is None or is_ancestor(up, old, repo):
        say(f"member {member}: {branch}: up-to-date")
        return E.RepoSynced(**ev, outcome="up-to-date", new=old)
    if not is_ancestor(old, up, repo):
        error = (f"diverged: {branch} in {repo} has commits that are not on {upstream}; "
                 "rebase by hand")
        say(f"member {member}: {branch}: failed: {error}")
        return E.RepoSynced(**ev, outcome="failed", error=error)
    # --ff-only refuses before touching anything when local changes are in the way.
    p = git(["merge", "--ff-only", "-q", up], repo, check=False)
    if p.returncode != 0:
        error = f"fast-forward refused: {_last_line(p.stderr)}"
        say(f"member {member}: {branch}: failed: {error}")
        return E.RepoSynced(**ev, outcome="failed", error=error)
    say(f"member {member}: {branch}: fast-forward {old[:12]}..{up[:12]}")
    return E.RepoSynced(**ev, outcome="fast-forward", new=up)


def _sync_task_branch(member: str, repo: Path, branch: str, upstream: str, up: str,
                      holder: Worktree | None, say: Progress) -> E.RepoSynced:
    old = commit_of(f"refs/heads/{branch}", repo)
    assert old is not None  # listed by for-each-ref just now
    ev = dict(member=member, branch=branch, upstream=upstream, old=old)

    def failed(error: str) -> E.RepoSynced:
        say(f"member {member}: {branch}: failed: {error}")
        return E.RepoSynced(**ev, outcome="failed", error=error)

    if is_ancestor(up, old, repo):
        say(f"member {member}: {branch}: up-to-date")
        return E.RepoSynced(**ev, outcome="up-to-date", new=old)
    outcome: Literal["fast-forward", "rebased"] = "fast-forward"
    new = up
    if not is_ancestor(old, up, repo):
        try:
            rebased, conflicts = _rebase(repo, old, up)
        except RepoError as e:
            return failed(f"rebase: {e}")
        if rebased is None:
            say(f"member {member}: {branch}: conflict in "
                f"{', '.join(c.path for c in conflicts)} (left as it was)")
            return E.RepoSynced(**ev, outcome="conflict", conflicts=conflicts)
        outcome, new = "rebased", rebased
    try:
        _move(repo, branch, old, new, holder)
    except RepoError as e:
        return failed(str(e))
    say(f"member {member}: {branch}: {outcome} {old[:12]}..{new[:12]}")
    return E.RepoSynced(**ev, outcome=outcome, new=new)


def _move(repo: Path, branch: str, old: str, new: str, holder: Worktree | None) -> None:
    """Move `branch` from `old` to `new`; a worktree holding it moves too, if it is clean."""
    if holder is None or not holder.path.exists():
        # compare-and-swap: a branch moved meanwhile is not overwritten
        git(["update-ref", "-m", f"forge repos sync: onto {new}", f"refs/heads/{branch}",
             new, old], repo)
        return
    # a task's worktree: git runs there as forge made it, on the branch it holds
    wt = on_branch(locate(repo, holder.path), branch)
    if dirty(wt):
        raise RepoError(f"task worktree {wt} has uncommitted changes: {branch} not moved "
                        "(commit or release them, then sync again)")
    if commit_of("HEAD", wt) != old:
        raise RepoError(f"task worktree {wt} moved while syncing: {branch} not moved")
    # reset --keep moves the branch checked out there and its files together
    git(["reset", "-q", "--keep", new], wt)


def _rebase(repo: Path, old: str, up: str) -> tuple[str | None, list[SyncConflict]]:
    """Rebase `old` onto `up` in a temporary detached worktree, always removed again.
    (new commit, []) on success; (None, conflicts) when it stopped on conflicts."""
    tmp = Path(tempfile.mkdtemp(prefix="forge-sync-"))
    wt = tmp / "wt"
    try:
        git([*_REBASE_CONFIG, "worktree", "add", "-q", "--detach", str(wt), old], repo)
        p = git([*_REBASE_CONFIG, "rebase", "-q", "--no-verify", up], wt, check=False)
        if p.returncode == 0:
            new = commit_of("HEAD", wt)
            assert new is not None
            return new, []
        files = _conflicted(wt)
        if not files:
            git(["rebase", "--abort"], wt, check=False)
            raise RepoError(_last_line(p.stderr))
        conflicts = [SyncConflict(path=f, hunks=_hunks(wt / f)) for f in files[:MAX_FILES]]
        git(["rebase", "--abort"], wt)
        return None, conflicts
    finally:
        if wt.exists():
            git(["worktree", "remove", "--force", "--force", str(wt)], repo, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        git(["worktree", "prune"], repo, check=False)


def _conflicted(wt: Path) -> list[str]:
    raw = git(["diff", "--name-only", "-z", "--diff-filter=U"], wt).stdout
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


def _hunks(path: Path) -> list[str]:
    """The conflict-marker regions of the file (`<<<<<<<` … `>>>>>>>`), bounded in number and
    size. A binary file, or one deleted on a side, has none. The file is the task's (its
    commits): never followed through a link, and only its first MAX_SCAN_BYTES are read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return []
        data = f.read(MAX_SCAN_BYTES)
    if b"\0" in data[:8192]:
        return []
    hunks: list[str] = []
    current: list[str] | None = None
    for line in data.decode("utf-8", "replace").splitlines(keepends=True):
        if current is None and line.startswith("<<<<<<< "):
            current = [line]
        elif current is not None:
            current.append(line)
            if line.startswith(">>>>>>> "):
                hunks.append(_cut("".join(current)))
                current = None
                if len(hunks) >= MAX_HUNKS:
                    break
    return hunks


def _cut(text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= MAX_HUNK_BYTES:
        return text
    return raw[:MAX_HUNK_BYTES].decode("utf-8", "ignore") + "\n… (cut)\n"


def _last_line(stderr: bytes) -> str:
    text = stderr.decode("utf-8", "replace")
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "failed")
