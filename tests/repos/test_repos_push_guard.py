"""The push guard with real git: the pre-push hook `forge repos init` installs in the root and
every member, `forge repos push` (forge's own push path), `forge repos approve` (a grant of
the human gate's `push` action, on the `approvals` stream). Remotes are local bare
repositories in tmp_path; every push below is a real `git push`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infer_forge.harness.guard.human_channel import os_user
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import APPROVALS_STREAM, REPOS_STREAM
from infer_forge.repos import commands as C
from infer_forge.repos.git import git, git_path, out
from infer_forge.repos.hooks import CHAINED, MARK
from infer_forge.repos.push_guard import ZERO, protected
from infer_forge.repos.root import MonoRepo

from tests.conftest import run_forge
from tests.helpers.gitrepos import alpha_monorepo


@pytest.fixture
def mono(tmp_path, workspace) -> MonoRepo:
    return alpha_monorepo(tmp_path, workspace, {"README.md": "alpha\n"})


def _bare(tmp_path: Path) -> Path:
    return tmp_path / "remotes" / "alpha.git"


def _member(mono: MonoRepo) -> Path:
    return mono.member_dir("alpha")


def _commit(repo: Path, name: str) -> str:
    (repo / name).write_text(f"{name}\n")
    git(["add", "--", name], repo)
    git(["commit", "-q", "-m", f"add {name}"], repo)
    return out(["rev-parse", "HEAD"], repo)


def _remote_ref(bare: Path, ref: str) -> str | None:
    p = git(["rev-parse", "--verify", "--quiet", ref], bare, check=False)
    return p.stdout.decode().strip() or None


def _main(bare: Path) -> str:
    sha = _remote_ref(bare, "refs/heads/main")
    assert sha is not None
    return sha


def _events(ws, kind: type[E.Event]) -> list:
    stream = APPROVALS_STREAM if kind.TYPE.startswith("Approval") else REPOS_STREAM
    return [r.event for r in ws.ledger.stream(stream) if isinstance(r.event, kind)]


def _git_push(repo: Path, *args: str):
    """A plain `git push`, as a person would type it: only the hook stands in the way."""
    return git(["push", "-q", "origin", *args], repo, check=False)


def _approve(*args: str):
    return run_forge("repos", "approve", *args)


# --- the rule ----------------------------------------------------------------------------


def test_rule_protects_branches_of_protected_remotes_only(workspace):
    g = workspace.config.settings.guard
    assert protected(g, "origin", "/x/a.git", "refs/heads/main")
    assert protected(g, "origin", "/x/a.git", "refs/heads/release/1.2")
    assert protected(g, "origin", "/x/a.git", "refs/heads/feature/x") is None
    assert protected(g, "origin", "/x/a.git", "refs/tags/main") is None  # a tag is no branch
    only_prod = g.model_copy(update={"protected_remotes": ["prod-*", "*/prod.git"]})
    assert protected(only_prod, "origin", "/x/a.git", "refs/heads/main") is None
    assert protected(only_prod, "prod-eu", "/x/a.git", "refs/heads/main")  # by name
    assert protected(only_prod, "origin", "/x/prod.git", "refs/heads/main")  # by URL


# --- refusals ----------------------------------------------------------------------------


def test_plain_git_push_to_main_is_refused_by_the_hook_and_recorded(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    new = _commit(member, "a.txt")
    p = _git_push(member, "HEAD:main")
    assert p.returncode != 0
    err = p.stderr.decode()
    assert "forge guard: push of alpha to origin refs/heads/main" in err and "refused" in err
    assert _remote_ref(bare, "refs/heads/main") == before
    [r] = _events(workspace, E.PushRefused)
    assert (r.member, r.remote, r.ref, r.old, r.new) == ("alpha", "origin", "refs/heads/main",
                                                          before, new)
    assert "protected_branches 'main'" in r.reason
    assert _events(workspace, E.PushAllowed) == []


def test_forge_push_is_refused_before_git_and_recorded_once(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    new = _commit(member, "b.txt")
    r = run_forge("repos", "push", "alpha", "origin", "HEAD:main")
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1
    assert "refused" in r.stderr and "forge repos approve alpha" in r.stderr
    assert _remote_ref(bare, "refs/heads/main") == before
    [ev] = _events(workspace, E.PushRefused)  # forge refused; git (and its hook) never ran
    assert (ev.ref, ev.old, ev.new) == ("refs/heads/main", before, new)


def test_deleting_a_protected_branch_is_refused(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    assert _git_push(member, ":main").returncode != 0
    assert _remote_ref(bare, "refs/heads/main") == before
    [ev] = _events(workspace, E.PushRefused)
    assert (ev.old, ev.new) == (before, ZERO)


# --- approvals ---------------------------------------------------------------------------


def test_an_approval_lets_exactly_that_push_through_once(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    new = _commit(member, "c.txt")
    a = _approve("alpha", "--ref", "main", "--range", f"{before}..HEAD", "--reason", "hotfix",
                 "--by", "ana", "--json")
    assert a.returncode == 0, a.stderr
    appr = json.loads(a.stdout)
    assert (appr["ref"], appr["old"], appr["new"]) == ("refs/heads/main", before, new)
    assert appr["actor"] == {"kind": "human", "name": f"{os_user()} via key, says ana",
                             "model": None}

    r = run_forge("repos", "push", "alpha", "origin", "HEAD:main", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["approval_id"] == appr["approval_id"]
    assert _remote_ref(bare, "refs/heads/main") == new
    # Spent once: forge's path recorded it, the hook git ran found it spent for this push.
    [ok] = _events(workspace, E.PushAllowed)
    assert (ok.approval_id, ok.ref, ok.old, ok.new) == (appr["approval_id"],
                                                        "refs/heads/main", before, new)
    assert _events(workspace, E.PushRefused) == []

    newer = _commit(member, "d.txt")  # the same approval does not cover another push
    r2 = run_forge("repos", "push", "alpha", "origin", "HEAD:main")
    assert r2.returncode != 0
    assert _remote_ref(bare, "refs/heads/main") == new
    [ref2] = _events(workspace, E.PushRefused)
    assert (ref2.old, ref2.new) == (new, newer)
    assert len(_events(workspace, E.PushAllowed)) == 1


def test_plain_git_push_under_an_approval_spends_it(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    new = _commit(member, "e.txt")
    assert _approve("alpha", "--ref", "refs/heads/main", "--range", f"{before}..{new}",
                    "--reason", "release", "--by", "bo").returncode == 0
    p = _git_push(member, "HEAD:main")
    assert p.returncode == 0, p.stderr
    assert _remote_ref(bare, "refs/heads/main") == new
    [ok] = _events(workspace, E.PushAllowed)
    # Rewind the remote and push the same range again: the approval is spent.
    git(["update-ref", "refs/heads/main", before], bare)
    assert _git_push(member, "HEAD:main").returncode != 0
    assert _remote_ref(bare, "refs/heads/main") == before
    assert len(_events(workspace, E.PushRefused)) == 1
    assert [a.approval_id for a in _events(workspace, E.PushAllowed)] == [ok.approval_id]


def test_an_approval_for_another_range_does_not_let_the_push_through(tmp_path, workspace,
                                                                       mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    first = _commit(member, "f.txt")
    second = _commit(member, "g.txt")
    assert _approve("alpha", "--ref", "main", "--range", f"{before}..{first}", "--reason",
                    "only f", "--by", "ana").returncode == 0
    assert _approve("alpha", "--ref", "main", "--range", f"{before}..{second}", "--remote",
                    "upstream", "--reason", "other remote", "--by", "ana").returncode == 0
    assert _approve("alpha", "--ref", "release/1", "--range", f"{before}..{second}",
                    "--reason", "other ref", "--by", "ana").returncode == 0
    assert _git_push(member, "HEAD:main").returncode != 0
    r = run_forge("repos", "push", "alpha", "origin", "HEAD:main")
    assert r.returncode != 0
    assert _remote_ref(bare, "refs/heads/main") == before
    assert len(_events(workspace, E.PushRefused)) == 2
    assert _events(workspace, E.PushAllowed) == []


def test_approving_twice_while_unspent_returns_the_same_approval(tmp_path, workspace, mono):
    before = _main(_bare(tmp_path))
    new = _commit(_member(mono), "h.txt")
    args = ("alpha", "--ref", "main", "--range", f"{before}..{new}", "--reason", "x", "--by",
            "ana", "--json")
    one, two = (json.loads(_approve(*args).stdout) for _ in range(2))
    assert one["approval_id"] == two["approval_id"] and not two["created"]
    assert len(_events(workspace, E.ApprovalGranted)) == 1


@pytest.mark.parametrize("args, says", [
    (("ghost", "--ref", "main", "--range", "HEAD~1..HEAD"), "no member 'ghost'"),
    (("alpha", "--ref", "main", "--range", "HEAD"), "OLD..NEW"),
    (("alpha", "--ref", "main", "--range", "HEAD...HEAD"), "OLD..NEW"),
    (("alpha", "--ref", "main", "--range", "HEAD..nope"), "range end 'nope' is not a commit"),
    (("alpha", "--ref", "main", "--range", f"{ZERO}..HEAD", "--by", " "), "--by"),
    (("alpha", "--ref", "ma in", "--range", "HEAD~1..HEAD"), "not a valid ref"),
])
def test_bad_approvals_are_one_line_errors_and_record_nothing(workspace, mono, args, says):
    full = list(args) + ["--reason", "r"] + ([] if "--by" in args else ["--by", "ana"])
    _commit(_member(mono), "i.txt")
    r = _approve(*full)
    assert r.returncode != 0
    assert says in r.stderr
    assert "Traceback" not in r.stderr
    assert workspace.ledger.stream(APPROVALS_STREAM) == []


# --- what is protected -------------------------------------------------------------------


def test_an_unprotected_branch_pushes_freely(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    new = _commit(member, "j.txt")
    assert _git_push(member, "HEAD:refs/heads/feature/x").returncode == 0
    assert _remote_ref(bare, "refs/heads/feature/x") == new
    newer = _commit(member, "k.txt")
    r = run_forge("repos", "push", "alpha", "origin", "HEAD:feature/x")
    assert r.returncode == 0, r.stderr
    assert _remote_ref(bare, "refs/heads/feature/x") == newer
    assert _events(workspace, E.PushRefused) == [] == _events(workspace, E.PushAllowed)


def test_guard_settings_in_forge_toml_decide_what_is_protected(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    toml = workspace.home / "forge.toml"
    text = toml.read_text()
    line = 'protected_branches = ["main", "master", "release/*"]'
    assert line in text
    toml.write_text(text.replace(line, 'protected_branches = ["prod/*"]'))
    new = _commit(member, "l.txt")
    assert _git_push(member, "HEAD:main").returncode == 0  # main is no longer protected
    assert _remote_ref(bare, "refs/heads/main") == new
    assert _git_push(member, "HEAD:refs/heads/prod/eu").returncode != 0
    r = run_forge("repos", "push", "alpha", "origin", "HEAD:prod/us")
    assert r.returncode != 0 and "prod/*" in r.stderr
    assert _remote_ref(bare, "refs/heads/prod/eu") is None
    assert _remote_ref(bare, "refs/heads/prod/us") is None
    assert [e.ref for e in _events(workspace, E.PushRefused)] == ["refs/heads/prod/eu",
                                                                  "refs/heads/prod/us"]


# --- the hooks ---------------------------------------------------------------------------


def test_root_and_members_have_the_hook_and_the_root_is_guarded(tmp_path, workspace, mono):
    for _, _, repo in mono.repos():
        hook = git_path("hooks", repo) / "pre-push"
        assert MARK in hook.read_text() and hook.stat().st_mode & 0o111
    assert str(mono.root / ".git" / "modules") in str(git_path("hooks", _member(mono)))
    root_remote = tmp_path / "remotes" / "root.git"
    git(["init", "-q", "--bare", str(root_remote)], tmp_path)
    git(["remote", "add", "origin", str(root_remote)], mono.root)
    assert _git_push(mono.root, "HEAD:main").returncode != 0
    assert _remote_ref(root_remote, "refs/heads/main") is None
    [ev] = _events(workspace, E.PushRefused)
    assert (ev.member, ev.ref, ev.old) == (".", "refs/heads/main", ZERO)
    head = out(["rev-parse", "HEAD"], mono.root)
    assert _approve(".", "--ref", "main", "--range", f"{ZERO}..{head}", "--reason",
                    "first publish", "--by", "ana").returncode == 0
    r = run_forge("repos", "push", ".", "origin", "HEAD:main")
    assert r.returncode == 0, r.stderr
    assert _remote_ref(root_remote, "refs/heads/main") == head


def test_a_hook_already_there_is_kept_and_chained(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    hooks = git_path("hooks", member)
    seen = tmp_path / "seen.txt"
    (hooks / "pre-push").write_text(f"#!/bin/sh\ncat >> '{seen}'\n"
                                    "case \"$*\" in *refuse-me*) exit 3;; esac\n")
    (hooks / "pre-push").chmod(0o755)
    r = run_forge("repos", "hooks", "--json")
    assert r.returncode == 0, r.stderr
    assert {row["member"] for row in json.loads(r.stdout)} == {".", "alpha"}
    assert MARK in (hooks / "pre-push").read_text()
    assert (hooks / CHAINED).is_file()
    new = _commit(member, "m.txt")
    assert _git_push(member, "HEAD:refs/heads/feature/y").returncode == 0
    assert f"refs/heads/feature/y {ZERO}" in seen.read_text()  # it saw git's input
    assert _remote_ref(bare, "refs/heads/feature/y") == new
    # Its refusal stands, on a push the guard itself would let through.
    git(["remote", "add", "refuse-me", str(bare)], member)
    newer = _commit(member, "n.txt")
    assert git(["push", "-q", "refuse-me", "HEAD:refs/heads/feature/y"], member,
               check=False).returncode != 0
    assert _remote_ref(bare, "refs/heads/feature/y") == new != newer
    # Refreshing again keeps the chain as it is.
    assert run_forge("repos", "hooks").returncode == 0
    assert (hooks / CHAINED).is_file() and MARK in (hooks / "pre-push").read_text()


def test_a_task_worktree_shares_its_members_hook(tmp_path, workspace, mono):
    from infer_forge.repos import worktrees as W

    bare = _bare(tmp_path)
    before = _main(bare)
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", "guard-task")
    new = _commit(wt.path, "o.txt")
    assert _git_push(wt.path, "HEAD:main").returncode != 0
    assert _remote_ref(bare, "refs/heads/main") == before
    assert _git_push(wt.path, "HEAD").returncode == 0  # its own task branch is not protected
    assert _remote_ref(bare, f"refs/heads/{wt.branch}") == new
    [ev] = _events(workspace, E.PushRefused)
    assert (ev.member, ev.new) == ("alpha", new)


def test_naming_an_unspent_approval_in_the_environment_still_spends_it(tmp_path, workspace,
                                                                         mono):
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    new = _commit(member, "p.txt")
    a = json.loads(_approve("alpha", "--ref", "main", "--range", f"{before}..{new}",
                            "--reason", "x", "--by", "ana", "--json").stdout)
    p = git(["push", "-q", "origin", "HEAD:main"], member, check=False,
            env={"FORGE_PUSH_APPROVALS": a["approval_id"]})
    assert p.returncode == 0, p.stderr
    assert [e.approval_id for e in _events(workspace, E.PushAllowed)] == [a["approval_id"]]


def test_forge_push_defaults_to_the_checked_out_branch(tmp_path, workspace, mono):
    bare, member = _bare(tmp_path), _member(mono)
    git(["checkout", "-q", "-b", "feature/z"], member)
    new = _commit(member, "q.txt")
    r = run_forge("repos", "push", "alpha", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert (res["ref"], res["old"], res["new"], res["pushed"]) == ("refs/heads/feature/z", ZERO,
                                                                  new, True)
    assert _remote_ref(bare, "refs/heads/feature/z") == new
    again = run_forge("repos", "push", "alpha", "--json")
    assert json.loads(again.stdout)["pushed"] is False
    git(["checkout", "-q", "--detach"], member)
    bad = run_forge("repos", "push", "alpha")
    assert bad.returncode != 0 and "SRC:DST" in bad.stderr
