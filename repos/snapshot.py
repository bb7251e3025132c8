"""Snapshots of a MonoRepo and their restore.

`take(mono, store)` records, for the root and every member (in parallel, one
`git status --porcelain=v2` each): the origin URL, the branch, the commit, the uncommitted
diff against HEAD (`git diff --binary HEAD`, kept verbatim as an artifact, only read when the
tree is dirty) and the untracked, not ignored, files (each an artifact). The snapshot id is the
digest of that list: one state, one id.

`restore(mono, store, members)` brings every repository back to exactly that state: reset to
the commit (the branch is moved back to it when it moved on; its old tip is kept under
`refs/forge/kept/<commit>`; detached when the snapshot was), remove what is untracked, apply
the diff (to the index too: the diff is against HEAD, staged and unstaged alike, so changes
come back staged), write the untracked files. It then takes the state again and
fails, naming the member, unless it has the same id (byte-exact). The root's diff leaves
submodules out: each member carries its own state.

A member's state may be taken from a task's worktree (a `git.Tree`, `member_state`): git runs
there as repos/git.py says (forge's admin directory, neutralised config), and its untracked
files, written by the task's calls, are read without following a link, a regular file at a
time, and refused (one line naming the file) past `MAX_UNTRACKED`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..ledger.artifacts import ArtifactStore
from ..ledger.clock import digest
from ..ledger.payloads import MemberState, UntrackedFile
from .errors import RepoError
from .git import Tree, commit_of, git, is_ancestor
from .root import ROOT_NAME, MonoRepo, origin_url

MAX_UNTRACKED = 256 << 20  # bytes of one untracked file a snapshot stores (read whole)


def _status(repo: Path | Tree, is_root: bool) -> tuple[str | None, str | None, bool, list[str]]:
    """(commit, branch, has changes to tracked files, untracked paths) in one git call."""
    args = ["status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all"]
    if is_root or isinstance(repo, Tree):  # a task's nested repository: the call's config
        args.append("--ignore-submodules=all")
    fields = git(args, repo).stdout.decode("utf-8", "surrogateescape").split("\0")
    commit = branch = None
    changed = False
    untracked: list[str] = []
    i = 0
    while i < len(fields):
        f = fields[i]
        if f.startswith("# branch.oid "):
            oid = f[len("# branch.oid "):]
            commit = None if oid == "(initial)" else oid
        elif f.startswith("# branch.head "):
            head = f[len("# branch.head "):]
            branch = None if head == "(detached)" else head
        elif f.startswith("? "):
            untracked.append(f[2:])
        elif f[:2] in ("1 ", "u "):
            changed = True
        elif f.startswith("2 "):
            changed = True
            i += 1  # a rename's original path follows as its own field
        i += 1
    return commit, branch, changed, sorted(untracked)


def _untracked(store: ArtifactStore, p: Path) -> str | None:
    """The digest of the regular file `p` (never followed through a link, never a FIFO);
    None when it is no regular file (any more); refused past MAX_UNTRACKED bytes."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(MAX_UNTRACKED + 1)  # bounded even when the file grows meanwhile
    if len(data) > MAX_UNTRACKED:
        raise RepoError(f"untracked file {p}: over the snapshot's limit of {MAX_UNTRACKED} "
                        "bytes (remove it or add it to .gitignore)")
    return store.put(data, verbatim=True)


def member_state(name: str, rel: str, repo: Path | Tree, store: ArtifactStore
                 ) -> MemberState:
    """One repository's state; `repo` a `Tree` for a task's worktree (module contract)."""
    work = repo.work if isinstance(repo, Tree) else repo
    if not isinstance(repo, Tree) and not (repo / ".git").exists():
        raise RepoError(f"member {name}: {repo} is not checked out (run `forge repos init` "
                        "or `git submodule update --init`)")
    commit, branch, changed, untracked = _status(repo, name == ROOT_NAME)
    diff_digest = None
    if changed and commit is not None:
        args = ["diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "HEAD"]
        if name == ROOT_NAME or isinstance(repo, Tree):
            args.append("--ignore-submodules=all")
        diff = git(args, repo).stdout
        diff_digest = store.put(diff, verbatim=True) if diff else None
    files = []
    for path in untracked:
        p = work / path
        if p.is_symlink():
            data = os.readlink(p).encode("utf-8", "surrogateescape")  # the link's target
            files.append(UntrackedFile(path=path, digest=store.put(data, verbatim=True),
                                       symlink=True))
            continue
        d = _untracked(store, p)
        if d is None:
            continue
        files.append(UntrackedFile(path=path, digest=d, executable=os.access(p, os.X_OK)))
    return MemberState(name=name, path=rel, url=origin_url(repo), branch=branch, commit=commit,
                       diff_digest=diff_digest, untracked=files)


def snapshot_id(members: Sequence[MemberState]) -> str:
    return "snap-" + digest([m.model_dump(mode="json") for m in members]).split(":")[-1][:24]


def take(mono: MonoRepo, store: ArtifactStore) -> tuple[str, list[MemberState]]:
    """(snapshot id, member states): the root first, then the members in manifest order."""
    repos = mono.repos()
    with ThreadPoolExecutor(max_workers=min(8, len(repos))) as pool:
        states = list(pool.map(lambda r: member_state(r[0], r[1], r[2], store), repos))
    return snapshot_id(states), states


def _checkout(repo: Path, st: MemberState) -> None:
    if st.commit is None:
        raise RepoError(f"member {st.name}: the snapshot has no commit to restore")
    if commit_of(st.commit, repo) is None:  # not here: fetch it from the member's remote
        git(["fetch", "-q", "origin"], repo, check=False)
        if commit_of(st.commit, repo) is None:
            raise RepoError(f"member {st.name}: commit {st.commit[:12]} is neither in "
                            f"{repo} nor on its origin")
    git(["reset", "-q", "--hard"], repo)
    git(["clean", "-q", "-fd"], repo)  # untracked files go; ignored ones (builds) stay
    if st.branch is None:
        git(["checkout", "-q", "-f", "--detach", st.commit], repo)
        return
    # The branch is part of the state: it points at the snapshot's commit again (left
    # detached, the check after the restore could never match). A tip the branch leaves
    # behind stays reachable under refs/forge/kept/, so the state before stays restorable.
    tip = commit_of(f"refs/heads/{st.branch}", repo)
    if tip is not None and tip != st.commit and not is_ancestor(tip, st.commit, repo):
        git(["update-ref", f"refs/forge/kept/{tip}", tip], repo)
    git(["checkout", "-q", "-f", "-B", st.branch, st.commit], repo)


def _restore_one(repo: Path, st: MemberState, store: ArtifactStore) -> None:
    _checkout(repo, st)
    if st.diff_digest is not None:
        # --index: a new file of the diff (a staged one) is tracked again, not untracked.
        git(["apply", "--index", "--binary", "--whitespace=nowarn", "-"], repo,
            input=store.get(st.diff_digest))
    for f in st.untracked:
        p = repo / f.path
        if ".." in Path(f.path).parts or Path(f.path).is_absolute():
            raise RepoError(f"member {st.name}: untracked path {f.path!r} leaves the tree")
        p.parent.mkdir(parents=True, exist_ok=True)
        if f.symlink:
            p.unlink(missing_ok=True)
            os.symlink(store.get(f.digest).decode("utf-8", "surrogateescape"), p)
            continue
        p.write_bytes(store.get(f.digest))
        if f.executable:
            p.chmod(p.stat().st_mode | 0o111)


def restore(mono: MonoRepo, store: ArtifactStore, members: Sequence[MemberState]) -> str:
    """Bring the root and its members to `members` (module contract); the id restored."""
    by_name = {m.name: m for m in members}
    known = {name for name, _, _ in mono.repos()}
    extra = sorted(set(by_name) - known)
    if extra:
        raise RepoError(f"the snapshot names members this root does not have: {extra}")
    for name, _, _ in mono.repos():
        if name not in by_name:
            raise RepoError(f"the snapshot has no state for member {name}")
    for m in members:  # every artifact first: fail before anything is touched
        for d in ([m.diff_digest] if m.diff_digest else []) + [f.digest for f in m.untracked]:
            if not store.exists(d):
                raise RepoError(f"member {m.name}: artifact {d} of the snapshot is missing")
    _restore_one(mono.root, by_name[ROOT_NAME], store)
    rest = [(d, by_name[n]) for n, _, d in mono.repos() if n != ROOT_NAME]
    if rest:
        with ThreadPoolExecutor(max_workers=min(8, len(rest))) as pool:
            list(pool.map(lambda r: _restore_one(r[0], r[1], store), rest))
    want = snapshot_id(members)
    got_id, got = take(mono, store)
    if got_id != want:
        diff = [a.name for a, b in zip(members, got, strict=False) if a != b]
        raise RepoError(f"restore of {want} ended in {got_id}: members {diff} differ")
    return want
