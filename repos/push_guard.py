"""The push guard: which refs are protected, and the check every push to one goes through.

- `protected(guard, remote_name, remote_url, ref)`: the reason a ref is protected, or None.
  A ref is protected when the remote's name OR its URL matches one of `[guard]
  protected_remotes` and the ref is a branch (`refs/heads/<b>`) whose name matches one of
  `protected_branches` (fnmatch, case-sensitive). Tags and other refs are not protected.
- `push_action(member, remote, ref, old, new)`: a push as an action of the human gate (kind
  `push`, target `member:remote:ref`, arguments `{"range": "old..new"}`); its approvals are
  the generic ones on the `approvals` stream (projections/approvals.py; granted by
  `forge approve ID` or `forge repos approve`, both in harness/guard/approvals.py).
- `check_push(ws, member, remote, url, updates)`: the one check, called by the pre-push hook
  and by forge's own push path. `updates` are git's pre-push lines (local ref, local sha,
  remote ref, remote sha). Each protected update needs a granted, unexpired, unused approval
  of exactly that action, for the remote's name or its URL (a zero sha for a new branch or
  a deletion; deleting a protected ref is refused like any other push). If every protected
  update has one, one `PushAllowed` per update is recorded and each approval is used
  (`ApprovalUsed`), in one save that expects the approvals stream's version read, so two
  pushes racing for one approval cannot both use it. If any has none, the push is refused
  as a whole (git aborts it): one `PushRefused` per unapproved update, and a pending
  approval request of each (`ApprovalRequested`, unless one is pending already), so that
  `forge approvals` shows it and `forge approve ID` grants it; nothing is used. An update
  whose old and new are equal changes nothing and is not checked.
- `preapproved`: approval ids forge's own push path has already used for this push (it
  checks before calling git, so the hook that git then runs must not use or refuse twice),
  each from a one-time ticket the hook took (repos/push.py `take_tickets`): an approval id
  alone, or a ticket already taken, is not preapproval. The hook lets an update through on
  that ground only when the ledger holds the used approval for exactly that update;
  anything else is checked afresh.
- `resolve_push(ws, member, remote, ref, old, new)`: the full ref and commit ids of a push
  a person names (`forge repos approve`), checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import NamedTuple

from ..ledger import events as E
from ..ledger.clock import utcnow
from ..ledger.config import GuardSettings
from ..ledger.errors import ConflictError
from ..ledger.store import Append
from ..ledger.streams import APPROVALS_STREAM, REPOS_STREAM
from ..ledger.workspace import Workspace
from ..projections.approvals import ApprovalBook, action_digest, read_approvals
from .errors import RepoError
from .git import commit_of
from .root import ROOT_NAME, MonoRepo

ZERO = "0" * 40
SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_HEADS = "refs/heads/"
GUARD_ACTOR = E.Actor.tool("push-guard")


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
    spent_before: bool = False  # forge's own push path used it already for this update
    request_id: str | None = None  # refused: the pending approval request of this push
    digest: str | None = None  # the action digest of the approval that lets it through

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


def push_action(member: str, remote: str, ref: str, old: str, new: str
                ) -> tuple[str, str, dict[str, str]]:
    """A push as the human gate names it: (kind, target, arguments)."""
    return "push", f"{member}:{remote}:{ref}", {"range": f"{old}..{new}"}


def _digests(member: str, remote: str, url: str, u: Update) -> list[str]:
    """The update's action digests: approved for the remote's name, or for its URL."""
    return [action_digest(*push_action(member, r, u.remote_ref, u.remote_sha, u.local_sha))
            for r in dict.fromkeys((remote, url))]


def _decide(ws: Workspace, book: ApprovalBook, member: str, remote: str, url: str,
            updates: Sequence[Update], preapproved: Iterable[str]) -> list[Decision]:
    guard = ws.config.settings.guard
    pre = set(preapproved)
    now = utcnow()
    out: list[Decision] = []
    taken: set[str] = set()
    for u in updates:
        if u.local_sha == u.remote_sha:
            continue  # nothing changes on the remote
        reason = protected(guard, remote, url, u.remote_ref)
        if reason is None:
            out.append(Decision(u, None))
            continue
        digests = _digests(member, remote, url, u)
        done = next((k for k in sorted(pre) if (a := book.get(k)) is not None
                     and a.used_at is not None and a.action_digest in digests), None)
        if done is not None:  # used for this very update by forge's own push path
            out.append(Decision(u, reason, done, spent_before=True))
            continue
        hit = next((a for d in digests if (a := book.usable(d, now, taken)) is not None),
                   None)
        if hit is not None:
            taken.add(hit.approval_id)
            out.append(Decision(u, reason, hit.approval_id, digest=hit.action_digest))
            continue
        asked = next((a for d in digests if (a := book.open_request(d, now)) is not None),
                     None)
        out.append(Decision(u, reason, request_id=asked.approval_id if asked else None))
    return out


def _request(book: ApprovalBook, member: str, remote: str, d: Decision
             ) -> E.ApprovalRequested:
    u = d.update
    kind, target, args = push_action(member, remote, u.remote_ref, u.remote_sha, u.local_sha)
    dg = action_digest(kind, target, args)
    return E.ApprovalRequested(
        approval_id=book.next_id(dg), kind=kind, target=target, action_digest=dg,
        arguments=args, summary=f"push {member} to {remote} {u.remote_ref} "
        f"({u.remote_sha[:12]}..{u.local_sha[:12]}): {d.reason}", actor=GUARD_ACTOR)


def check_push(ws: Workspace, member: str, remote: str, url: str,
               updates: Sequence[Update], preapproved: Iterable[str] = ()
               ) -> list[Decision]:
    """Check and record one push (see the module docstring); the decisions, one per update
    that changes something. The push may go ahead when no decision is `refused`."""
    pre = tuple(preapproved)
    for _ in range(20):
        book = read_approvals(ws.ledger)
        decisions = _decide(ws, book, member, remote, url, updates, pre)
        refused = [d for d in decisions if d.refused]
        asks: list[E.Event] = []
        if refused:
            for i, d in enumerate(refused):
                if d.request_id is None:
                    ask = _request(book, member, remote, d)
                    refused[i] = d = Decision(d.update, d.reason, request_id=ask.approval_id)
                    asks.append(ask)
            events: list[E.Event] = [
                E.PushRefused(member=member, remote=remote, ref=d.update.remote_ref,
                              old=d.update.remote_sha, new=d.update.local_sha,
                              reason=f"{d.reason}; no approval of this range (waiting: "
                                     f"{d.request_id})")
                for d in refused]
            by_update = {d.update: d for d in refused}
            decisions = [by_update.get(d.update, d) for d in decisions]
        else:
            go = [d for d in decisions if d.approval_id is not None and not d.spent_before]
            events = [E.PushAllowed(member=member, remote=remote, ref=d.update.remote_ref,
                                    old=d.update.remote_sha, new=d.update.local_sha,
                                    approval_id=str(d.approval_id)) for d in go]
            asks = [E.ApprovalUsed(approval_id=str(d.approval_id),
                                   action_digest=str(d.digest), actor=GUARD_ACTOR) for d in go]
        if not events:
            return decisions
        try:
            # The approvals stream's version read guards the use (and a request's id): two
            # pushes racing for one approval cannot both use it; the second re-reads.
            ws.ledger.save(Append(REPOS_STREAM, events),
                           Append(APPROVALS_STREAM, asks, book.version))
        except ConflictError:
            continue
        return decisions
    raise RepoError(f"push guard: the approvals stream kept moving while checking {member} "
                    f"{remote}; try again")


def refusal_line(member: str, remote: str, d: Decision) -> str:
    u = d.update
    return (f"forge guard: push of {member} to {remote} {u.remote_ref} "
            f"({u.remote_sha[:12]}..{u.local_sha[:12]}) refused: {d.reason}; waiting for "
            f"approval {d.request_id}: forge approve {d.request_id} --reason TEXT (or "
            f"`forge repos approve {member} --remote {remote} --ref {u.remote_ref} "
            f"--range {u.remote_sha}..{u.local_sha} --reason TEXT --by NAME`)")


# --- naming a push (forge repos approve) ------------------------------------------------


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


def resolve_push(ws: Workspace, member: str, remote: str, ref: str, old: str, new: str
                 ) -> tuple[str, str, str]:
    """(full ref, old sha, new sha) of a push of `member`'s `ref` on `remote` from `old` to
    `new` (revs or shas; `old` may be zeros for a new branch, `new` zeros for a deletion)."""
    mono = MonoRepo.open(ws.config.monorepo_root)
    if member != ROOT_NAME:
        mono.member(member)  # RepoError naming the members when unknown
    if not remote.strip():
        raise RepoError("approve: --remote must name a remote or URL")
    repo = member_repo(mono, member)
    r = full_ref(ref)
    o = resolve_sha(old, repo, "range start", allow_zero=True)
    n = resolve_sha(new, repo, "range end", allow_zero=True)
    if o == n:
        raise RepoError(f"range {o[:12]}..{n[:12]} is empty: nothing to push")
    return r, o, n
