"""Per-task isolation: each task works in its own `git worktree` of each member it changes.

- The worktree of task T on member M is `<worktrees>/<T>/<M>` on branch `forge/task/<T>`,
  made from the pinned commit (the member's commit in the task's snapshot). Parallel tasks on
  one member never share a checkout; worktrees share the member's object store.
- `release` removes a task's worktrees when it exits (kept on request); the branch stays.
  Uncommitted work in a worktree is committed on the task branch first: nothing is lost.
- `holders` reads which tasks hold worktrees, from git itself (`git worktree list`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..ledger.ids import check_id
from .errors import RepoError
from .git import commit_of, git
from .root import MonoRepo

BRANCH_PREFIX = "forge/task/"


def task_branch(task_id: str) -> str:
    return BRANCH_PREFIX + check_id(task_id, "task id")


@dataclass(frozen=True)
class Worktree:
    member: str
    task_id: str
    path: Path
    branch: str
    head: str | None


def worktree_path(base: Path, task_id: str, member: str) -> Path:
    return base / check_id(task_id, "task id") / member


def ensure(mono: MonoRepo, base: Path, member: str, task_id: str,
           pinned: str | None = None) -> Worktree:
    """The task's worktree of `member`, made on first use from `pinned` (else the member's
    checked-out commit); the same worktree on every later call."""
    repo = mono.member_dir(member)
    path = worktree_path(base, task_id, member)
    branch = task_branch(task_id)
    if (path / ".git").exists():
        return Worktree(member, task_id, path, branch, commit_of("HEAD", path))
    git(["worktree", "prune"], repo)  # a worktree dir removed by hand
    path.parent.mkdir(parents=True, exist_ok=True)
    if commit_of(f"refs/heads/{branch}", repo) is not None:
        git(["worktree", "add", "-q", str(path), branch], repo)
    else:
        start = pinned or commit_of("HEAD", repo)
        if start is None or commit_of(start, repo) is None:
            raise RepoError(f"member {member}: pinned commit {start} is not in {repo}")
        git(["worktree", "add", "-q", "-b", branch, str(path), start], repo)
    return Worktree(member, task_id, path, branch, commit_of("HEAD", path))


def dirty(path: Path) -> bool:
    return bool(git(["status", "--porcelain", "--untracked-files=all"], path).stdout.strip())


def commit_all(path: Path, message: str) -> str:
    """Commit everything in the worktree (untracked included) and return HEAD's commit."""
    if dirty(path):
        git(["add", "-A"], path)
        git(["commit", "-q", "--no-verify", "-m", message], path)
    head = commit_of("HEAD", path)
    assert head is not None
    return head


def release(mono: MonoRepo, base: Path, task_id: str, *, keep: bool = False) -> list[Worktree]:
    """Remove the task's worktrees (the branch stays); `keep` leaves them. Returns them."""
    held = [w for ws in holders(mono).values() for w in ws if w.task_id == task_id]
    if keep:
        return held
    for w in held:
        if w.path.exists() and dirty(w.path):
            commit_all(w.path, f"forge: uncommitted work of task {task_id} at release")
        git(["worktree", "remove", "--force", str(w.path)], mono.member_dir(w.member))
    task_dir = base / task_id
    if task_dir.is_dir() and not any(task_dir.iterdir()):
        task_dir.rmdir()
    return held


def holders(mono: MonoRepo) -> dict[str, list[Worktree]]:
    """member -> the task worktrees git knows for it (branch forge/task/<id>)."""
    out: dict[str, list[Worktree]] = {}
    for m in mono.manifest.members:
        repo = mono.root / m.rel_path
        if not (repo / ".git").exists():
            continue
        text = git(["worktree", "list", "--porcelain"], repo).stdout.decode()
        for block in text.strip().split("\n\n"):
            kv = dict(line.partition(" ")[::2] for line in block.splitlines())
            ref = kv.get("branch", "")
            if ref.startswith("refs/heads/" + BRANCH_PREFIX):
                tid = ref[len("refs/heads/" + BRANCH_PREFIX):]
                out.setdefault(m.name, []).append(
                    Worktree(m.name, tid, Path(kv["worktree"]), ref[len("refs/heads/"):],
                             kv.get("HEAD")))
    return out
