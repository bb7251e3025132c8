"""The push guard: which refs are protected, and the check every push to one goes through.

- `protected(guard, remote_name, remote_url, ref)`: the reason a ref is protected, or None.
  A ref is protected when the remote's name OR its URL matches one of `[guard]
  protected_remotes` and the ref is a branch (`refs/heads/<b>`) whose name matches one of
  `protected_branches` (fnmatch, case-sensitive). Tags and other refs are not protected.
- `check_push(ws, member, remote, url, updates)`: the one check, called by the pre-push hook
  and by forge's own push path. `updates` are git's pre-push lines (local ref, local sha,
  remote ref, remote sha). Each protected update needs an unspent `PushApproved` for exactly
  that member, remote (name or URL), ref and range old..new (a zero sha for a new branch or
  a deletion; deleting a protected ref is refused like any other push). If every protected
  update has one, one `PushAllowed` per update is recorded (the approval is spent); if any
  has none, the push is refused as a whole (git aborts it) and one `PushRefused` per
  unapproved update is recorded, nothing spent. An update whose old and new are equal
  changes nothing and is not checked.
- `preapproved`: approval ids forge's own push path has already spent for this push (it
  checks before calling git, so the hook that git then runs must not spend or refuse twice).
  The hook lets an update through on that ground only when the ledger holds the spent
  approval for exactly that update; anything else is checked afresh.
- `approve(ws, member, remote, ref, old, new, reason, by)`: record a person's approval of one
  push. Giving the same approval again while it is unspent returns the recorded one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import NamedTuple

from ..ledger import events as E
from ..ledger.config import GuardSettings
from ..ledger.errors import ConflictError
from ..ledger.streams import REPOS_STREAM
from ..ledger.workspace import Workspace
from ..projections.repos import RepoHistory, read_repo_history
from .errors import RepoError
from .git import commit_of
from .record import append
from .root import ROOT_NAME, MonoRepo

ZERO = "0" * 40
SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_HEADS = "refs/heads/"


class Update(NamedTuple):
    """One line of git's pre-push input."""

    local_ref: str
    local_sha: str
    remote_ref: str
    remote_sha: str


@dataclass(frozen=True)
class Decision:
    update: Update
    reason: str | None  # why the ref is protected; None: not protected
    approval_id: str | None = None  # the approval that lets it through
    spent_before: bool = False  # forge's own push path spent it already for this update

    @property
    def refused(self) -> bool:
        return self.reason is not None and self.approval_id is None


def is_zero(sha: str) -> bool:
    return set(sha) == {"0"}


def protected(guard: GuardSettings, remote_name: str, remote_url: str, ref: str
              ) -> str | None:
    """Why `ref` on this remote is protected, or None when it is not."""
    if not ref.startswith(_HEADS):
        return None
    branch = ref[len(_HEADS):]
    rp = next((p for p in guard.protected_remotes
               if fnmatchcase(remote_name, p) or fnmatchcase(remote_url, p)), None)
    bp = next((p for p in guard.protected_branches if fnmatchcase(branch, p)), None)
    if rp is None or bp is None:
        return None
    return (f"{ref} is protected ([guard] protected_branches {bp!r} on protected_remotes "
            f"{rp!r})")


def _matches(a: E.PushApproved, member: str, remote: str, url: str, u: Update) -> bool:
    return (a.member == member and a.remote in (remote, url) and a.ref == u.remote_ref
            and a.old == u.remote_sha and a.new == u.local_sha)


def _decide(ws: Workspace, h: RepoHistory, member: str, remote: str, url: str,
            updates: Sequence[Update], preapproved: Iterable[str]) -> list[Decision]:
    guard = ws.config.settings.guard
    pre = set(preapproved)
    out: list[Decision] = []
    taken: set[str] = set()
    for u in updates:
        if u.local_sha == u.remote_sha:
            continue  # nothing changes on the remote
        reason = protected(guard, remote, url, u.remote_ref)
        if reason is None:
            out.append(Decision(u, None))
            continue
        done = next((k for k in sorted(pre & h.spent) if k in h.approvals
                     and _matches(h.approvals[k], member, remote, url, u)), None)
        if done is not None:  # spent for this very update by forge's own push path
            out.append(Decision(u, reason, done, spent_before=True))
            continue
        hit = next((a.approval_id for a in h.unspent() if a.approval_id not in taken
                    and _matches(a, member, remote, url, u)), None)
        if hit is not None:
            taken.add(hit)
        out.append(Decision(u, reason, hit))
    return out


def check_push(ws: Workspace, member: str, remote: str, url: str,
               updates: Sequence[Update], preapproved: Iterable[str] = ()
               ) -> list[Decision]:
    """Check and record one push (see the module docstring); the decisions, one per update
    that changes something. The push may go ahead when no decision is `refused`."""
    pre = tuple(preapproved)
    for _ in range(20):
        h = read_repo_history(ws.ledger)
        decisions = _decide(ws, h, member, remote, url, updates, pre)
        refused = [d for d in decisions if d.refused]
        if refused:
            events: list[E.Event] = [
                E.PushRefused(member=member, remote=remote, ref=d.update.remote_ref,
                              old=d.update.remote_sha, new=d.update.local_sha,
                              reason=f"{d.reason}; no unspent approval for this range")
                for d in refused]
        else:
            events = [E.PushAllowed(member=member, remote=remote, ref=d.update.remote_ref,
                                    old=d.update.remote_sha, new=d.update.local_sha,
                                    approval_id=d.approval_id)
                      for d in decisions if d.approval_id is not None
                      and not d.spent_before]
        if not events:
            return decisions
        try:
            # The version read guards the spend: two pushes racing for one approval cannot
            # both record it (the second re-reads and finds it spent).
            ws.ledger.append(REPOS_STREAM, events, expected_version=h.version)
        except ConflictError:
            continue
        return decisions
    raise RepoError(f"push guard: the repos stream kept moving while checking {member} "
                    f"{remote}; try again")


def refusal_line(member: str, remote: str, d: Decision) -> str:
    u = d.update
    return (f"forge guard: push of {member} to {remote} {u.remote_ref} "
            f"({u.remote_sha[:12]}..{u.local_sha[:12]}) refused: {d.reason}; approve it with "
            f"`forge repos approve {member} --remote {remote} --ref {u.remote_ref} "
            f"--range {u.remote_sha}..{u.local_sha} --reason TEXT --by NAME`")


# --- approvals ---------------------------------------------------------------------------


def member_repo(mono: MonoRepo, member: str) -> Path:
    """The checkout of `member` (the root itself is member `.`)."""
    return mono.root if member == ROOT_NAME else mono.member_dir(member)


def full_ref(ref: str) -> str:
    """`main` -> `refs/heads/main`; a ref already under refs/ is kept."""
    ref = ref.strip()
    if not ref or any(c in ref for c in " \t\n~^:?*[\\") or ".." in ref:
        raise RepoError(f"ref {ref!r} is not a valid ref name")
    return ref if ref.startswith("refs/") else _HEADS + ref


def resolve_sha(rev: str, repo: Path, what: str, allow_zero: bool) -> str:
    """A commit id for `rev`: a full sha as given (the remote's old commit may not be
    here), all zeros where allowed, else the commit `rev` names in `repo`."""
    v = rev.strip()
    if SHA.match(v.lower()):
        if is_zero(v) and not allow_zero:
            raise RepoError(f"{what} {rev!r}: a zero sha is not allowed here")
        return v.lower()
    sha = commit_of(v, repo) if v and not v.startswith("-") else None
    if sha is None:
        raise RepoError(f"{what} {rev!r} is not a commit in {repo}")
    return sha


def approve(ws: Workspace, member: str, remote: str, ref: str, old: str, new: str,
            reason: str, by: str) -> tuple[E.PushApproved, bool]:
    """Record the approval of pushing `member`'s `ref` on `remote` from `old` to `new` (revs
    or shas; `old` may be zeros for a new branch, `new` zeros for a deletion); (approval,
    created). An unspent approval of the same push is returned as it is (created False)."""
    mono = MonoRepo.open(ws.config.monorepo_root)
    if member != ROOT_NAME:
        mono.member(member)  # RepoError naming the members when unknown
    if not reason.strip():
        raise RepoError("approve: --reason must say why the push may go ahead")
    if not by.strip():
        raise RepoError("approve: --by must name the person approving")
    if not remote.strip():
        raise RepoError("approve: --remote must name a remote or URL")
    repo = member_repo(mono, member)
    r = full_ref(ref)
    o = resolve_sha(old, repo, "range start", allow_zero=True)
    n = resolve_sha(new, repo, "range end", allow_zero=True)
    if o == n:
        raise RepoError(f"range {o[:12]}..{n[:12]} is empty: nothing to push")
    h = read_repo_history(ws.ledger)
    key = (member, remote, r, o, n)
    same = [a for a in h.approvals.values()
            if (a.member, a.remote, a.ref, a.old, a.new) == key]
    for a in same:
        if a.approval_id not in h.spent:
            return a, False
    digest = hashlib.sha256("\0".join((*key, str(len(same)))).encode()).hexdigest()
    ev = E.PushApproved(approval_id=f"appr-{digest[:12]}", member=member, remote=remote,
                        ref=r, old=o, new=n, reason=reason.strip(),
                        actor=E.Actor.human(by.strip()))
    append(ws, [ev], command_id=f"push-approval:{ev.approval_id}")
    return ev, True
