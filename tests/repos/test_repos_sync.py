"""`forge repos sync`: members fetched, task branches fast-forwarded or rebased onto their
upstream; a conflict comes back as data (files, hunks), recorded, and leaves every tree as
it was. Real git, local bare remotes in tmp_path; upstream advances through plain clones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from infer_forge.projections.repos import read_repo_history
from infer_forge.repos import commands, worktrees
from infer_forge.repos.errors import RepoError
from infer_forge.repos.git import commit_of, git, git_path, out

from tests.conftest import run_forge
from tests.helpers.gitrepos import head, make_remote, tree_digest, write_manifest

A_TXT = "one\ntwo\nthree\nfour\nfive\n"


@pytest.fixture
def stack(tmp_path, workspace):
    """A MonoRepo of two members (alpha, beta) made from local bare remotes."""
    remotes = {name: make_remote(tmp_path, name, {"a.txt": A_TXT, "README": f"{name}\n"})
               for name in ("alpha", "beta")}
    manifest = write_manifest(tmp_path / "manifest.yaml", [
        {"name": name, "url": str(bare), "branch": "main"} for name, bare in remotes.items()])
    commands.init(workspace, manifest)
    return remotes


def advance(tmp_path: Path, bare: Path, files: dict[str, str], message: str) -> str:
    """A commit on the bare remote's main from a plain clone (not through forge), written
    as the remote's owner would (a fetch into it: forge's pre-receive guards pushes)."""
    n = len(list((tmp_path / "pushers").glob("*"))) if (tmp_path / "pushers").exists() else 0
    clone = tmp_path / "pushers" / f"c{n}"
    git(["clone", "-q", str(bare), str(clone)], tmp_path)
    for rel, text in files.items():
        (clone / rel).write_text(text)
    git(["commit", "-q", "-am", message], clone)
    git(["fetch", "-q", str(clone), "main:main"], bare)
    return head(clone)


def commit_in(path: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (path / rel).write_text(text)
    git(["add", "-A"], path)
    git(["commit", "-q", "-m", message], path)
    return head(path)


def patch_id(commit: str, repo: Path) -> str:
    diff = git(["show", "--format=", commit], repo).stdout
    return out(["patch-id", "--stable"], repo, input=diff).split()[0]


def porcelain(path: Path) -> str:
    return out(["status", "--porcelain", "--untracked-files=all"], path)


def worktree_paths(repo: Path) -> list[str]:
    return [ln.split(" ", 1)[1] for ln in out(["worktree", "list", "--porcelain"], repo)
            .splitlines() if ln.startswith("worktree ")]


def task_worktree(ws, member: str, task_id: str) -> worktrees.Worktree:
    mono = commands.open_monorepo(ws)
    return worktrees.ensure(mono, commands.worktree_base(ws), member, task_id)


def by_branch(events, member: str = "alpha"):
    return {e.branch: e for e in events if e.member == member}


def test_fast_forward_and_rebase_bring_task_branches_onto_upstream(tmp_path, workspace, stack):
    plain = task_worktree(workspace, "alpha", "t-plain")
    mine = task_worktree(workspace, "alpha", "t-mine")
    own = commit_in(mine.path, {"task.txt": "task work\n"}, "task: add task.txt")
    up = advance(tmp_path, stack["alpha"], {"a.txt": A_TXT.replace("one", "ONE")},
                 "upstream: ONE")

    events = commands.sync(workspace)
    got = by_branch(events)

    # the member checkout's own branch: fast-forwarded
    member_dir = commands.open_monorepo(workspace).member_dir("alpha")
    assert got["main"].outcome == "fast-forward"
    assert head(member_dir) == up and got["main"].new == up
    # a task branch without its own commits: fast-forwarded, its worktree moved with it
    ff = got["forge/task/t-plain"]
    assert (ff.outcome, ff.old, ff.new) == ("fast-forward", plain.head, up)
    assert head(plain.path) == up
    assert (plain.path / "a.txt").read_text().startswith("ONE\n")
    assert porcelain(plain.path) == ""
    # a task branch with a commit of its own: rebased, the commit now on top of upstream
    rb = got["forge/task/t-mine"]
    assert (rb.outcome, rb.old) == ("rebased", own)
    assert rb.new == head(mine.path) == commit_of("refs/heads/forge/task/t-mine", member_dir)
    assert out(["rev-parse", f"{rb.new}^"], member_dir) == up
    assert patch_id(rb.new, member_dir) == patch_id(own, member_dir)
    assert (mine.path / "a.txt").read_text().startswith("ONE\n")
    assert (mine.path / "task.txt").read_text() == "task work\n"
    assert porcelain(mine.path) == ""
    # beta had nothing new
    assert {e.outcome for e in events if e.member == "beta"} == {"up-to-date"}
    # recorded, one event per branch
    syncs = read_repo_history(workspace.ledger).syncs
    assert [(s.member, s.branch, s.outcome) for s in syncs] == [
        (e.member, e.branch, e.outcome) for e in events]

    again = commands.sync(workspace, member="alpha")
    assert {e.member for e in again} == {"alpha"}
    assert {e.outcome for e in again} == {"up-to-date"}
    assert len(read_repo_history(workspace.ledger).syncs) == len(events) + len(again)


def test_a_conflict_is_data_and_leaves_every_tree_as_it_was(tmp_path, workspace, stack):
    t = task_worktree(workspace, "alpha", "t-clash")
    commit_in(t.path, {"a.txt": A_TXT.replace("two", "two from the task")}, "task: two")
    own = commit_in(t.path, {"notes.txt": "task notes\n"}, "task: notes")
    advance(tmp_path, stack["alpha"], {"a.txt": A_TXT.replace("two", "two from upstream")},
            "upstream: change two")
    member_dir = commands.open_monorepo(workspace).member_dir("alpha")
    before_tree = tree_digest(t.path)
    before_worktrees = worktree_paths(member_dir)

    ev = by_branch(commands.sync(workspace))["forge/task/t-clash"]

    assert (ev.outcome, ev.old, ev.new) == ("conflict", own, None)
    assert [c.path for c in ev.conflicts] == ["a.txt"]
    hunk = ev.conflicts[0].hunks[0]
    assert hunk.startswith("<<<<<<< ") and "=======" in hunk and ">>>>>>> " in hunk
    assert "two from upstream" in hunk and "two from the task" in hunk
    # nothing moved, nothing half-done
    assert commit_of("refs/heads/forge/task/t-clash", member_dir) == own
    assert head(t.path) == own
    assert tree_digest(t.path) == before_tree
    assert porcelain(t.path) == ""
    assert worktree_paths(member_dir) == before_worktrees  # the temporary one is gone
    for repo in (member_dir, t.path):
        assert not git_path("rebase-merge", repo).exists()
        assert not git_path("rebase-apply", repo).exists()
    assert not list(Path(out(["rev-parse", "--git-common-dir"], member_dir),
                         ).resolve().joinpath("worktrees").glob("wt*"))
    # recorded as data
    recorded = [s for s in read_repo_history(workspace.ledger).syncs
                if s.branch == "forge/task/t-clash"]
    assert len(recorded) == 1 and recorded[0].conflicts == ev.conflicts


def test_a_conflict_on_a_branch_without_worktree_leaves_it(tmp_path, workspace, stack):
    t = task_worktree(workspace, "alpha", "t-gone")
    own = commit_in(t.path, {"a.txt": A_TXT.replace("five", "5")}, "task: five")
    worktrees.release(commands.open_monorepo(workspace), commands.worktree_base(workspace),
                      "t-gone")
    advance(tmp_path, stack["alpha"], {"a.txt": A_TXT.replace("five", "FIVE")}, "up: five")
    member_dir = commands.open_monorepo(workspace).member_dir("alpha")

    ev = by_branch(commands.sync(workspace, member="alpha"))["forge/task/t-gone"]

    assert ev.outcome == "conflict" and ev.conflicts[0].path == "a.txt"
    assert commit_of("refs/heads/forge/task/t-gone", member_dir) == own
    assert len(worktree_paths(member_dir)) == 1  # the member checkout only
    assert porcelain(member_dir) == ""


def test_a_dirty_task_worktree_is_not_moved(tmp_path, workspace, stack):
    t = task_worktree(workspace, "alpha", "t-dirty")
    (t.path / "README").write_text("half-done edit\n")
    before = tree_digest(t.path)
    advance(tmp_path, stack["alpha"], {"a.txt": A_TXT.replace("three", "3")}, "up: three")
    member_dir = commands.open_monorepo(workspace).member_dir("alpha")

    ev = by_branch(commands.sync(workspace))["forge/task/t-dirty"]

    assert ev.outcome == "failed" and "uncommitted changes" in (ev.error or "")
    assert commit_of("refs/heads/forge/task/t-dirty", member_dir) == t.head == head(t.path)
    assert tree_digest(t.path) == before


def test_a_diverged_member_checkout_is_not_rewritten(tmp_path, workspace, stack):
    member_dir = commands.open_monorepo(workspace).member_dir("beta")
    mine = commit_in(member_dir, {"README": "local\n"}, "local work on main")
    advance(tmp_path, stack["beta"], {"a.txt": "upstream\n"}, "up")

    ev = by_branch(commands.sync(workspace, member="beta"), "beta")["main"]

    assert ev.outcome == "failed" and (ev.error or "").startswith("diverged:")
    assert head(member_dir) == mine and porcelain(member_dir) == ""


def test_an_unreachable_remote_fails_that_member_only(tmp_path, workspace, stack):
    t = task_worktree(workspace, "alpha", "t-a")
    up = advance(tmp_path, stack["alpha"], {"a.txt": "new\n"}, "up")
    shutil.move(str(stack["beta"]), str(tmp_path / "beta-moved-away.git"))

    events = commands.sync(workspace)

    beta = [e for e in events if e.member == "beta"]
    assert len(beta) == 1 and beta[0].outcome == "failed"
    assert (beta[0].error or "").startswith("fetch: ")
    assert "\n" not in (beta[0].error or "")
    assert by_branch(events)["forge/task/t-a"].outcome == "fast-forward"
    assert head(t.path) == up
    assert [s.outcome for s in read_repo_history(workspace.ledger).syncs
            if s.member == "beta"] == ["failed"]


def test_an_unknown_member_is_one_line(workspace, stack):
    with pytest.raises(RepoError, match="no member 'gamma'"):
        commands.sync(workspace, member="gamma")


def test_cli_json_and_exit_codes(tmp_path, forge_home, workspace, stack):
    task_worktree(workspace, "alpha", "t-cli")
    advance(tmp_path, stack["alpha"], {"a.txt": A_TXT.replace("four", "4")}, "up: four")

    ok = run_forge("repos", "sync", "--json", home=forge_home)
    assert ok.returncode == 0, ok.stderr
    rows = json.loads(ok.stdout)["synced"]
    assert {(r["member"], r["branch"], r["outcome"]) for r in rows} == {
        ("alpha", "main", "fast-forward"), ("alpha", "forge/task/t-cli", "fast-forward"),
        ("beta", "main", "up-to-date")}
    assert set(rows[0]) == {"member", "branch", "upstream", "outcome", "old", "new",
                            "conflicts", "error"}
    assert ok.stderr == ""  # no progress lines with --json

    t = task_worktree(workspace, "alpha", "t-cli")
    commit_in(t.path, {"a.txt": A_TXT.replace("four", "four (task)")}, "task: four")
    advance(tmp_path, stack["alpha"], {"a.txt": A_TXT.replace("four", "four (up)")}, "up 2")

    bad = run_forge("repos", "sync", "--json", "--member", "alpha", home=forge_home)
    assert bad.returncode == 1, bad.stderr
    rows = json.loads(bad.stdout)["synced"]
    clash = next(r for r in rows if r["branch"] == "forge/task/t-cli")
    assert clash["outcome"] == "conflict" and clash["new"] is None
    assert clash["conflicts"][0]["path"] == "a.txt"
    assert "<<<<<<< " in clash["conflicts"][0]["hunks"][0]

    human = run_forge("repos", "sync", "--member", "alpha", home=forge_home)
    assert human.returncode == 1
    assert "conflicts: a.txt" in human.stdout
    assert "member alpha: fetching origin" in human.stderr

    unknown = run_forge("repos", "sync", "--member", "gamma", home=forge_home)
    assert unknown.returncode != 0
    assert "no member 'gamma'" in unknown.stderr and len(unknown.stderr.splitlines()) == 1
