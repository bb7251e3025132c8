"""Per-task isolation: each task works in its own `git worktree` of each member it changes.

- The worktree of task T on member M is `<worktrees>/<T>/<M>` on branch `forge/task/<T>`,
  made from the pinned commit (the member's commit in the task's snapshot). Parallel tasks on
  one member never share a checkout; worktrees share the member's object store.
- `release` removes a task's worktrees when it exits (kept on request); the branch stays.
  Uncommitted work in a worktree is committed on the task branch first: nothing is lost.
- `holders` reads which tasks hold worktrees, from git itself (`git worktree list`).
- `locate(repo, path)`: the worktree as a `git.Tree` forge runs git in (repos/git.py): its
  admin directory is the one under the member's own `<common>/worktrees/` whose `gitdir`
  names `path/.git`, and `path/.git` (read without following a link, bounded) names it back.
  A worktree whose `.git` file a call rewrote (to a repository with its own config, say) or
  that is a link is refused with one line naming it; git never runs there. `ensure` (and
  `release`, before it commits) also refuses a worktree whose HEAD a call moved off its task
  branch (forge would commit or reset whatever ref HEAD names). Every git run by
  forge in a task worktree (`ensure`, `dirty`, `commit_all`, `release`, the snapshot, the
  loop's code candidates, sync) goes through a located `Tree`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..ledger.ids import check_id
from .errors import RepoError
from .git import GitError, Tree, commit_of, git, out, read_small
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
    tree: Tree | None = None  # located (`locate`): what forge runs git in


def common_dir(repo: Path) -> Path:
    """The common git directory of the member checked out at `repo` (forge's own checkout,
    not a task worktree)."""
    return Path(out(["rev-parse", "--path-format=absolute", "--git-common-dir"], repo)
                ).resolve()


def _gitdir_line(data: bytes, prefix: str, f: Path) -> str:
    text = data.decode("utf-8", "replace").strip()
    if prefix:
        if not text.startswith(prefix):
            raise RepoError(f"{f}: not a `{prefix} PATH` line")
        text = text[len(prefix):].strip()
    return text


def locate(repo: Path, path: Path) -> Tree:
    """The task worktree at `path` of the member checked out at `repo`, as forge runs git in
    it (module contract). RepoError, one line naming the worktree, when it cannot be
    trusted."""
    work = Path(os.path.abspath(path))
    if work.is_symlink() or not work.is_dir():
        raise RepoError(f"worktree {work}: not a directory (or a link): refusing to run git "
                        "there")
    real = Path(os.path.realpath(work))
    common = common_dir(repo)
    admins = common / "worktrees"
    dot_git = real / ".git"
    found: list[Path] = []
    for d in sorted(admins.iterdir()) if admins.is_dir() else ():
        g = d / "gitdir"
        if d.is_symlink() or not os.path.lexists(g):
            continue
        try:
            named = _gitdir_line(read_small(g, what="gitdir file"), "", g)
        except RepoError:
            continue  # another worktree's admin; not this one's business here
        if os.path.normpath(os.path.join(d, named)) == str(dot_git):
            found.append(d)
    if len(found) != 1:
        raise RepoError(f"worktree {work}: {'no' if not found else len(found)} admin "
                        f"directories under {admins} name it: refusing to run git there")
    admin = found[0]
    try:
        named = _gitdir_line(read_small(dot_git, what="worktree .git file"), "gitdir:", dot_git)
    except RepoError as e:
        raise RepoError(f"worktree {work}: {e}; refusing to run git there") from None
    if os.path.realpath(os.path.join(real, named)) != str(admin.resolve()):
        raise RepoError(f"worktree {work}: its .git file names {named[:200]!r}, not forge's "
                        f"admin directory {admin} (rewritten?): refusing to run git there")
    return Tree(real, admin.resolve(), common)


def on_branch(tree: Tree, branch: str) -> Tree:
    """`tree` when its HEAD is `branch` (a task's own); else RepoError: forge commits and
    resets there, and a HEAD a call pointed elsewhere (`main`, a `refs/forge/accepted/` ref)
    would have forge move that ref."""
    p = git(["symbolic-ref", "-q", "HEAD"], tree, check=False)
    head = p.stdout.decode("utf-8", "replace").strip()
    if head != "refs/heads/" + branch:
        raise RepoError(f"worktree {tree.work}: HEAD is {head[:200] or 'detached'}, not its "
                        f"task branch {branch}: refusing to commit or reset there (check out "
                        f"{branch} again)")
    return tree


def worktree_path(base: Path, task_id: str, member: str) -> Path:
    return base / check_id(task_id, "task id") / member


def ensure(mono: MonoRepo, base: Path, member: str, task_id: str,
           pinned: str | None = None) -> Worktree:
    """The task's worktree of `member`, made on first use from `pinned` (else the member's
    checked-out commit); the same worktree on every later call."""
    repo = mono.member_dir(member)
    path = worktree_path(base, task_id, member)
    branch = task_branch(task_id)
    if os.path.lexists(path / ".git"):
        tree = on_branch(locate(repo, path), branch)
        return Worktree(member, task_id, path, branch, commit_of("HEAD", tree), tree)
    git(["worktree", "prune"], repo)  # a worktree dir removed by hand
    path.parent.mkdir(parents=True, exist_ok=True)
    if commit_of(f"refs/heads/{branch}", repo) is not None:
        git(["worktree", "add", "-q", str(path), branch], repo)
    else:
        start = pinned or commit_of("HEAD", repo)
        if start is None or commit_of(start, repo) is None:
            raise RepoError(f"member {member}: pinned commit {start} is not in {repo}")
        git(["worktree", "add", "-q", "-b", branch, str(path), start], repo)
    tree = locate(repo, path)
    return Worktree(member, task_id, path, branch, commit_of("HEAD", tree), tree)


def dirty(tree: Tree) -> bool:
    # never into a nested repository (a gitlink a call made): its config is the call's
    return bool(git(["status", "--porcelain", "--untracked-files=all",
                     "--ignore-submodules=all"], tree).stdout.strip())


def commit_all(tree: Tree, message: str) -> str:
    """Commit everything in the worktree (untracked included) and return HEAD's commit."""
    if dirty(tree):
        git(["add", "-A"], tree)
        git(["commit", "-q", "--no-verify", "-m", message], tree)
    head = commit_of("HEAD", tree)
    assert head is not None
    return head


def release(mono: MonoRepo, base: Path, task_id: str, *, keep: bool = False) -> list[Worktree]:
    """Remove the task's worktrees (the branch stays); `keep` leaves them. Returns them."""
    held = [w for ws in holders(mono).values() for w in ws if w.task_id == task_id]
    if keep:
        return held
    for w in held:
        repo = mono.member_dir(w.member)
        mine = worktree_path(base, task_id, w.member)
        if os.path.realpath(w.path) != os.path.realpath(mine):
            # Where git's admin files say the worktree is (a call may have rewritten them):
            # forge removes only its own path.
            raise RepoError(f"task {task_id}: member {w.member}'s worktree is registered at "
                            f"{w.path}, not at {mine}: refusing to release it")
        if not w.path.exists():
            git(["worktree", "prune"], repo)
            continue
        tree = locate(repo, w.path)
        if dirty(tree):
            on_branch(tree, task_branch(task_id))
            commit_all(tree, f"forge: uncommitted work of task {task_id} at release")
        try:
            git(["worktree", "remove", "--force", str(w.path)], repo)
        except GitError:  # git's own checks of the tree failed: the work is committed above
            shutil.rmtree(w.path)
            git(["worktree", "prune"], repo)
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
