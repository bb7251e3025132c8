"""Pushing under the push guard (repos/push_guard.py): the hook's entry point and forge's own path.

- `hook_check(ws, member, remote, url, text)`: what the pre-push hook runs on git's input;
  the one-line refusals (empty: the push may go ahead). Decisions are recorded by the guard.
  When the remote is one forge manages (repos/hooks.py `managed`: its pre-receive is
  forge's), the client hook defers to the receiving side and decides nothing itself.
- `receive_check(ws, member, remote, url, text)`: what the pre-receive hook of a managed
  remote runs on git's `OLD NEW REF` lines: the same check, on the receiving side (a client
  that skipped its hooks, or used `git send-pack`, meets it all the same).
- `push(ws, member, remote, refspec)`: `forge repos push`. It works out the one update the
  push makes (the local commit of SRC; the remote's current commit of DST by `git ls-remote`)
  and checks it with the guard BEFORE calling git: a refusal is recorded once (with a
  pending approval request, `forge approve ID` grants it) and git is never called. An
  allowed push uses its approval here, writes a one-time ticket of exactly that update
  (`<FORGE_HOME>/push-tickets/<sha256 of a random nonce>`: the approval, member, ref, old
  and new) and runs `git push` with `FORGE_PUSH_APPROVALS=<approval id>:<nonce>`. The hook
  that decides (the managed remote's pre-receive, else the pre-push) takes the ticket (reads
  and removes it: only one taker wins) and lets exactly that update through without
  recording again, so an approval is used once. The ticket is gone after the push (forge
  removes one no hook took): the same value replayed, or a spent approval's id, is checked
  afresh and refused. If the remote moved in between, the hook sees another update and
  checks it afresh. An approval used on a push that git then fails is used all the same:
  approve again.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..ledger.workspace import Workspace
from .errors import RepoError
from .git import commit_of, git, out, read_small
from .hooks import managed
from .push_guard import SHA, ZERO, Update, check_push, full_ref, member_repo, refusal_line
from .root import MonoRepo

PREAPPROVED_ENV = "FORGE_PUSH_APPROVALS"


def parse_updates(text: str) -> list[Update]:
    """git's pre-push input: `LOCAL_REF LOCAL_SHA REMOTE_REF REMOTE_SHA` per line."""
    ups = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4 or not (SHA.match(parts[1]) and SHA.match(parts[3])):
            raise RepoError(f"pre-push input line {i}: expected 'LOCAL_REF LOCAL_SHA "
                            f"REMOTE_REF REMOTE_SHA', got {line.strip()[:200]!r}")
        ups.append(Update(*parts))
    return ups


def _tickets(ws: Workspace) -> Path:
    return ws.home / "push-tickets"


def _ticket_path(ws: Workspace, nonce: str) -> Path:
    return _tickets(ws) / hashlib.sha256(nonce.encode()).hexdigest()


def issue_ticket(ws: Workspace, approval_id: str, member: str, up: Update) -> tuple[str, Path]:
    """A one-time ticket of exactly this update under this (used) approval: the value for
    FORGE_PUSH_APPROVALS, and the ticket's file (named by the nonce's digest, so that a
    listing of the directory does not tell the nonce)."""
    nonce = secrets.token_urlsafe(24)
    path = _ticket_path(ws, nonce)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"approval_id": approval_id, "member": member, "ref": up.remote_ref,
                   "old": up.remote_sha, "new": up.local_sha}, f)
    return f"{approval_id}:{nonce}", path


def take_tickets(ws: Workspace, value: str, member: str, updates: Sequence[Update]
                 ) -> list[str]:
    """The approval ids of the tickets `value` (FORGE_PUSH_APPROVALS) names that exist and
    match one of `updates` exactly; each ticket named is taken (removed) whatever it holds,
    and only the process whose removal succeeds may count it."""
    ids: list[str] = []
    want = {(u.remote_ref, u.remote_sha, u.local_sha) for u in updates}
    for entry in (e.strip() for e in value.split(",")):
        aid, sep, nonce = entry.partition(":")
        if not sep or not aid or not nonce or len(nonce) > 200:
            continue  # an approval id alone is no ticket: checked afresh
        path = _ticket_path(ws, nonce)
        try:
            data = json.loads(read_small(path, 4096, "push ticket"))
            os.unlink(path)  # the one taker
        except (RepoError, OSError, ValueError):
            continue
        if (isinstance(data, dict) and data.get("approval_id") == aid
                and data.get("member") == member
                and (data.get("ref"), data.get("old"), data.get("new")) in want):
            ids.append(aid)
    return ids


def _check(ws: Workspace, member: str, remote: str, url: str, updates: Sequence[Update]
           ) -> list[str]:
    pre = take_tickets(ws, os.environ.get(PREAPPROVED_ENV, ""), member, updates)
    decisions = check_push(ws, member, remote, url, updates, pre)
    return [refusal_line(member, remote, d) for d in decisions if d.refused]


def hook_check(ws: Workspace, member: str, remote: str, url: str, text: str) -> list[str]:
    """Check (and record) the push git describes in `text`; one line per refused ref. A
    managed remote's own pre-receive decides instead (module contract)."""
    updates = parse_updates(text)
    if managed(url, Path.cwd()):
        return []
    return _check(ws, member, remote, url, updates)


def parse_received(text: str) -> list[Update]:
    """git's pre-receive input: `OLD NEW REF` per line."""
    ups = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3 or not (SHA.match(parts[0]) and SHA.match(parts[1])):
            raise RepoError(f"pre-receive input line {i}: expected 'OLD NEW REF', got "
                            f"{line.strip()[:200]!r}")
        old, new, ref = parts
        ups.append(Update(ref, new, ref, old))
    return ups


def receive_check(ws: Workspace, member: str, remote: str, url: str, text: str
                  ) -> list[str]:
    """The pre-receive of a managed remote: check (and record) what git is about to accept;
    one line per refused ref (module contract)."""
    return _check(ws, member, remote, url, parse_received(text))


def _remote_url(repo: Any, member: str, remote: str) -> str:
    p = git(["remote", "get-url", "--push", "--", remote], repo, check=False)
    if p.returncode == 0:
        return p.stdout.decode().strip()
    if "/" in remote or ":" in remote:  # a URL or path given instead of a remote's name
        return remote
    raise RepoError(f"member {member}: no remote {remote!r} in {repo}")


def src_bad(src: str) -> bool:
    return src.startswith("-") or any(c in src for c in " \t\n*?[:")


def _refspec(spec: str | None, repo: Any, member: str) -> tuple[bool, str, str]:
    """(force, source rev or '' for a deletion, full destination ref)."""
    if spec is None:
        spec = "HEAD"
    force = spec.startswith("+")
    spec = spec[1:] if force else spec
    if ":" in spec:
        src, dst = spec.split(":", 1)
        if src_bad(src):
            raise RepoError(f"refspec {spec!r}: {src!r} is not a ref or commit")
        if not dst:
            raise RepoError(f"refspec {spec!r}: no destination ref")
        return force, src, full_ref(dst)
    if spec.startswith("-") or src_bad(spec):
        raise RepoError(f"refspec {spec!r} is not a ref or commit")
    p = git(["rev-parse", "--symbolic-full-name", spec], repo, check=False)
    name = p.stdout.decode().strip().splitlines()[0] if p.returncode == 0 and \
        p.stdout.strip() else ""
    if not name.startswith("refs/heads/"):
        raise RepoError(f"member {member}: {spec!r} is not a local branch (HEAD detached?): "
                        "give SRC:DST, e.g. HEAD:refs/heads/main")
    return force, spec, name


def _remote_sha(repo: Any, remote: str, ref: str) -> str:
    for line in out(["ls-remote", "--", remote, ref], repo).splitlines():
        sha, _, name = line.partition("\t")
        if name == ref:
            return sha
    return ZERO


def push(ws: Workspace, member: str, remote: str = "origin", refspec: str | None = None
         ) -> dict[str, Any]:
    """Push one ref of `member` (`.` is the root) under the guard; what was pushed."""
    mono = MonoRepo.open(ws.config.monorepo_root)
    repo = member_repo(mono, member)
    if not remote or remote.startswith("-"):
        raise RepoError(f"remote {remote!r} is not a remote name or URL")
    url = _remote_url(repo, member, remote)
    force, src, dst = _refspec(refspec, repo, member)
    new = (commit_of(src, repo) if src else ZERO) or ""
    if not new:
        raise RepoError(f"member {member}: {src!r} is not a commit in {repo}")
    old = _remote_sha(repo, remote, dst)
    up = Update(src or "(delete)", new, dst, old)
    decisions = check_push(ws, member, remote, url, [up])
    refused = [d for d in decisions if d.refused]
    if refused:
        raise RepoError(refusal_line(member, remote, refused[0]))
    d = decisions[0] if decisions else None
    result = {"member": member, "remote": remote, "url": url, "ref": dst, "old": old,
              "new": new, "protected": d.reason if d else None,
              "approval_id": d.approval_id if d else None, "pushed": d is not None}
    if d is None:
        return result  # the remote already has it
    if d.approval_id is None:  # not protected: no ticket to hand on
        git(["push", "--quiet", "--", remote,
             f"{'+' if force else ''}{new if src else ''}:{dst}"], repo)
        return result
    value, ticket = issue_ticket(ws, d.approval_id, member, up)
    try:
        git(["push", "--quiet", "--", remote,
             f"{'+' if force else ''}{new if src else ''}:{dst}"],
            repo, env={PREAPPROVED_ENV: value})
    finally:
        ticket.unlink(missing_ok=True)  # one no hook took (a remote with no hook of forge's)
    return result
