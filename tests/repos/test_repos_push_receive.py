"""The push guard on the receiving side (issue 27, item 9): a client hook is advice, so the
bare remotes forge manages (local `origin`s of the root and members) carry forge's
`pre-receive`, and the shortcut forge's own push hands its hooks is a one-time ticket. Real
git pushes into real bare repositories in tmp_path; the hooks run the real CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import APPROVALS_STREAM, REPOS_STREAM
from infer_forge.repos.git import git, git_path, out
from infer_forge.repos.hooks import MARK, RECEIVE, refresh_hooks

from tests.conftest import run_forge
from tests.helpers.gitrepos import alpha_monorepo


@pytest.fixture
def mono(tmp_path, workspace):
    return alpha_monorepo(tmp_path, workspace, {"README.md": "alpha\n"})


def _bare(tmp_path: Path) -> Path:
    return tmp_path / "remotes" / "alpha.git"


def _main(bare: Path) -> str:
    return out(["rev-parse", "refs/heads/main"], bare)


def _commit(repo: Path, name: str) -> str:
    (repo / name).write_text(f"{name}\n")
    git(["add", "--", name], repo)
    git(["commit", "-q", "-m", f"add {name}"], repo)
    return out(["rev-parse", "HEAD"], repo)


def _events(ws, kind: type[E.Event]) -> list:
    stream = APPROVALS_STREAM if kind.TYPE.startswith("Approval") else REPOS_STREAM
    return [r.event for r in ws.ledger.stream(stream) if isinstance(r.event, kind)]


def _approve(before: str, new: str) -> dict:
    r = run_forge("repos", "approve", "alpha", "--ref", "main", "--range", f"{before}..{new}",
                  "--reason", "release", "--by", "ana", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


BYPASSES = {
    "no-verify": lambda member, bare: ["push", "-q", "--no-verify", "origin", "HEAD:main"],
    "hooksPath": lambda member, bare: ["-c", f"core.hooksPath={os.devnull}", "push", "-q",
                                       "origin", "HEAD:main"],
    "send-pack": lambda member, bare: ["send-pack", str(bare), "HEAD:refs/heads/main"],
}


def test_init_installs_the_receiving_hook_in_managed_remotes_only(tmp_path, workspace, mono):
    hook = git_path("hooks", _bare(tmp_path)) / RECEIVE
    assert MARK in hook.read_text() and hook.stat().st_mode & 0o111
    rows = {r["member"]: r for r in refresh_hooks(workspace)}
    assert rows["alpha"]["receive_hook"] == str(hook)
    assert rows["."]["receive_hook"] is None  # the root has no origin here


@pytest.mark.parametrize("how", sorted(BYPASSES))
def test_a_push_that_skips_the_client_hook_is_refused_and_recorded(tmp_path, workspace, mono,
                                                                   how):
    bare, member = _bare(tmp_path), mono.member_dir("alpha")
    before = _main(bare)
    new = _commit(member, "a.txt")
    p = git(BYPASSES[how](member, bare), member, check=False)
    assert p.returncode != 0
    assert "forge guard: push of alpha to origin refs/heads/main" in p.stderr.decode()
    assert _main(bare) == before
    [r] = _events(workspace, E.PushRefused)
    assert (r.member, r.ref, r.old, r.new) == ("alpha", "refs/heads/main", before, new)
    [ask] = _events(workspace, E.ApprovalRequested)  # forge approvals shows it
    assert ask.arguments == {"range": f"{before}..{new}"}


def test_an_approved_push_goes_through_exactly_once(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), mono.member_dir("alpha")
    before = _main(bare)
    new = _commit(member, "b.txt")
    a = _approve(before, new)
    # The receiving side decides even when the client skips its hook: used there, once.
    p = git(["push", "-q", "--no-verify", "origin", "HEAD:main"], member, check=False)
    assert p.returncode == 0, p.stderr
    assert _main(bare) == new
    assert [e.approval_id for e in _events(workspace, E.PushAllowed)] == [a["approval_id"]]
    assert [e.approval_id for e in _events(workspace, E.ApprovalUsed)] == [a["approval_id"]]
    git(["update-ref", "refs/heads/main", before], bare)  # the remote back: the same range
    assert git(["push", "-q", "origin", "HEAD:main"], member, check=False).returncode != 0
    assert _main(bare) == before
    assert len(_events(workspace, E.PushRefused)) == 1
    assert len(_events(workspace, E.PushAllowed)) == 1


CAPTURE = """#!/bin/sh
printf '%s\\n' "$FORGE_PUSH_APPROVALS" >> {log}
cat > /dev/null
"""


def _capture_client_env(tmp_path: Path, workspace, member: Path) -> Path:
    """A pre-push of the user's own, chained by forge's: it writes down what a process that
    watches forge's push would see of FORGE_PUSH_APPROVALS."""
    log = tmp_path / "seen-approvals.txt"
    chained = git_path("hooks", member) / "pre-push.chained"
    chained.write_text(CAPTURE.format(log=log))
    chained.chmod(0o755)
    refresh_hooks(workspace)
    return log


@pytest.mark.parametrize("managed", [True, False])
def test_a_spent_approval_does_not_replay_through_the_environment(tmp_path, workspace, mono,
                                                                  managed):
    bare, member = _bare(tmp_path), mono.member_dir("alpha")
    log = _capture_client_env(tmp_path, workspace, member)
    if not managed:  # a remote forge does not manage: only the client hook checks
        (git_path("hooks", bare) / RECEIVE).unlink()
    before = _main(bare)
    new = _commit(member, "c.txt")
    a = _approve(before, new)
    r = run_forge("repos", "push", "alpha", "origin", "HEAD:main", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["approval_id"] == a["approval_id"] and _main(bare) == new
    [seen] = log.read_text().split()
    assert seen.startswith(a["approval_id"] + ":")  # a nonce rides with the id
    assert len(_events(workspace, E.PushAllowed)) == 1
    assert list((workspace.home / "push-tickets").iterdir()) == []  # taken, nothing left
    for value in (seen, a["approval_id"]):  # the spent ticket, the spent approval's id
        git(["update-ref", "refs/heads/main", before], bare)
        p = git(["push", "-q", "origin", "HEAD:main"], member, check=False,
                env={"FORGE_PUSH_APPROVALS": value})
        assert p.returncode != 0, value
        assert _main(bare) == before
    assert len(_events(workspace, E.PushRefused)) == 2
    assert len(_events(workspace, E.PushAllowed)) == 1


def test_a_receiving_hook_already_there_is_kept_and_run_first(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), mono.member_dir("alpha")
    hooks = git_path("hooks", bare)
    seen = tmp_path / "received.txt"
    (hooks / RECEIVE).write_text(f"#!/bin/sh\ncat >> '{seen}'\n"
                                 f"grep -q refs/heads/frozen '{seen}' && exit 4\nexit 0\n")
    (hooks / RECEIVE).chmod(0o755)
    refresh_hooks(workspace)
    assert MARK in (hooks / RECEIVE).read_text() and (hooks / f"{RECEIVE}.chained").is_file()
    new = _commit(member, "d.txt")
    assert git(["push", "-q", "origin", "HEAD:refs/heads/feature/x"], member,
               check=False).returncode == 0  # not protected: both let it through
    assert "refs/heads/feature/x" in seen.read_text()
    assert out(["rev-parse", "refs/heads/feature/x"], bare) == new
    p = git(["push", "-q", "origin", "HEAD:refs/heads/frozen"], member, check=False)
    assert p.returncode != 0  # the user's own refusal stands on a push forge allows
    assert git(["rev-parse", "--verify", "--quiet", "refs/heads/frozen"], bare,
               check=False).returncode != 0
    assert _events(workspace, E.PushRefused) == []
