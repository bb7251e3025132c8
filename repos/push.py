"""Pushing under the push guard (repos/guard.py): the hook's entry point and forge's own path.

- `hook_check(ws, member, remote, url, text)`: what the pre-push hook runs on git's input;
  the one-line refusals (empty: the push may go ahead). Decisions are recorded by the guard.
- `push(ws, member, remote, refspec)`: `forge repos push`. It works out the one update the
  push makes (the local commit of SRC; the remote's current commit of DST by `git ls-remote`)
  and checks it with the guard BEFORE calling git: a refusal is recorded once (with a
  pending approval request, `forge approve ID` grants it) and git is never called. An
  allowed push uses its approval here and runs `git push` with the used approval ids in
  `FORGE_PUSH_APPROVALS`; the hook git runs then finds them used for exactly that update
  and lets it through without recording again, so an approval is used once. If the remote
  moved in between, the hook sees another update and checks it afresh.
  An approval used on a push that git then fails is used all the same: approve again.
"""

from __future__ import annotations

import os
from typing import Any

from ..ledger.workspace import Workspace
from .errors import RepoError
from .git import commit_of, git, out
from .guard import SHA, ZERO, Update, check_push, full_ref, member_repo, refusal_line
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


def hook_check(ws: Workspace, member: str, remote: str, url: str, text: str) -> list[str]:
    """Check (and record) the push git describes in `text`; one line per refused ref."""
    pre = [k for k in os.environ.get(PREAPPROVED_ENV, "").split(",") if k]
    decisions = check_push(ws, member, remote, url, parse_updates(text), pre)
    return [refusal_line(member, remote, d) for d in decisions if d.refused]


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
    git(["push", "--quiet", "--", remote, f"{'+' if force else ''}{new if src else ''}:{dst}"],
        repo, env={PREAPPROVED_ENV: d.approval_id or ""})
    return result
