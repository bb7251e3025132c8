"""The MonoRepo foundation with real git: manifest checks, init/adopt, byte-exact snapshot and
restore, `forge repos status`, per-task worktrees. Remotes are local bare repositories in
tmp_path (tests/helpers/gitrepos.py); nothing touches the network."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import REPOS_STREAM
from infer_forge.repos import commands as C
from infer_forge.repos import worktrees as W
from infer_forge.repos.errors import RepoError
from infer_forge.repos.git import commit_of, git, out
from infer_forge.repos.root import MonoRepo, current_branch

from tests.conftest import run_forge
from tests.helpers.gitrepos import head, make_remote, tree_digest, write_manifest

BINARY = bytes(range(256)) * 4 + b"\0\0tail\0"

KERNEL_FILES: dict[str, str | bytes] = {
    "README.md": "kernel\n", "src/attn.cu": "__global__ void attn() {}\n",
    "src/util.h": "#pragma once\n", "data/table.bin": BINARY, "run.sh": "#!/bin/sh\necho run\n",
}


def _events(ws, kind: type[E.Event]) -> list:
    return [r.event for r in ws.ledger.stream(REPOS_STREAM) if isinstance(r.event, kind)]


def _refs(mono: MonoRepo) -> dict[str, tuple[str | None, str]]:
    """name -> (branch or None when detached, HEAD commit) of the root and each member."""
    return {n: (current_branch(d), head(d)) for n, _, d in mono.repos()}


def _state(mono: MonoRepo) -> tuple[dict[str, str], dict[str, tuple[str | None, str]]]:
    """Every file's bytes and mode under the root (members included), and every HEAD."""
    return tree_digest(mono.root), _refs(mono)


@pytest.fixture
def remotes(tmp_path) -> dict[str, Path]:
    return {
        "kernel": make_remote(tmp_path, "kernel", KERNEL_FILES,
                              {"dev": {"src/attn.cu": "// dev\n", "dev.txt": "dev only\n"}}),
        "server": make_remote(tmp_path, "server", {"server.py": "print('serve')\n"},
                              {"release": {"server.py": "print('release')\n"}}),
        "bench": make_remote(tmp_path, "bench", {"bench/run.py": "pass\n"}),
    }


@pytest.fixture
def manifest(tmp_path, remotes) -> Path:
    # URLs relative to the manifest's own directory (tmp_path/manifests -> tmp_path/remotes).
    return write_manifest(tmp_path / "manifests" / "stack.yaml", [
        {"name": "kernel", "url": "../remotes/kernel.git", "branch": "main"},
        {"name": "server", "url": "../remotes/server.git", "branch": "release",
         "group": "harness"},
        {"name": "bench", "url": str(remotes["bench"]), "path": "tools/bench"},
    ])


@pytest.fixture
def mono(workspace, manifest) -> MonoRepo:
    C.init(workspace, manifest)
    return C.open_monorepo(workspace)


# --- manifest ----------------------------------------------------------------------------

BAD_MANIFESTS = [
    ("duplicate-name", "members:\n  - name: a\n    url: /x\n  - name: a\n    url: /y\n",
     4, "members[1].name"),
    ("duplicate-path", "members:\n  - name: a\n    url: /x\n  - name: b\n    url: /y\n"
     "    path: stack/a\n", 6, "members[1].path"),
    ("nested-path", "members:\n  - name: a\n    url: /x\n    path: stack\n  - name: b\n"
     "    url: /y\n", 5, "members[1].path"),
    ("dotdot-path", "members:\n  - name: a\n    url: /x\n    path: stack/../../up\n",
     4, "members[0].path"),
    ("absolute-path", "members:\n  - name: a\n    url: /x\n    path: /abs/a\n",
     4, "members[0].path"),
    ("bad-group", "members:\n  - name: a\n    url: /x\n    group: kernels\n",
     4, "members[0].group"),
    ("bad-name", "members:\n  - name: Bad Name!\n    url: /x\n", 2, "members[0].name"),
    ("empty-members", "name: s\nmembers: []\n", 2, "members"),
    ("unknown-key", "members:\n  - name: a\n    url: /x\n    colour: red\n",
     4, "members[0].colour"),
    ("unknown-top-key", "members:\n  - name: a\n    url: /x\nextra: 1\n", 4, "extra"),
]


@pytest.mark.parametrize("case,text,line,field", BAD_MANIFESTS,
                         ids=[c[0] for c in BAD_MANIFESTS])
def test_bad_manifest_is_one_line_naming_file_line_field(workspace, tmp_path, case, text,
                                                          line, field):
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    p = run_forge("repos", "init", str(path))
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert f"{path}:{line}: {field}:" in lines[0], lines[0]
    assert not workspace.config.monorepo_root.exists()  # nothing made
    assert not _events(workspace, E.MonoRepoInitialized)


# --- init and adopt ----------------------------------------------------------------------


def test_init_creates_root_with_members_on_their_branches(workspace, manifest, remotes):
    res = C.init(workspace, manifest)
    root = workspace.config.monorepo_root
    assert res["root"] == str(root) and res["adopted"] is False
    mono = MonoRepo.open(root)
    assert [n for n, _, _ in mono.repos()] == [".", "kernel", "server", "bench"]
    expect = {"kernel": ("stack/kernel", "main"), "server": ("harness/server", "release"),
              "bench": ("tools/bench", "main")}
    for name, (rel, branch) in expect.items():
        d = root / rel
        assert (d / ".git").is_file()  # a submodule's checkout
        assert current_branch(d) == branch
        assert head(d) == out(["rev-parse", branch], remotes[name])
        # the relative URL resolved against the manifest's directory
        assert out(["config", "remote.origin.url"], d) == str(remotes[name].resolve())
    assert (root / "harness/server/server.py").read_text() == "print('release')\n"
    assert out(["config", "-f", ".gitmodules", "submodule.stack/kernel.url"], root) \
        == str(remotes["kernel"].resolve())
    assert "forge-repos.yaml" in out(["ls-files"], root).splitlines()
    assert out(["status", "--porcelain"], root) == ""  # manifest and .gitmodules committed
    inits = _events(workspace, E.MonoRepoInitialized)
    assert [(i.root, i.members, i.adopted) for i in inits] == \
        [(str(root), ["kernel", "server", "bench"], False)]
    assert workspace.artifacts.get(inits[0].manifest_digest) == \
        (root / "forge-repos.yaml").read_bytes()
    snaps = _events(workspace, E.RepoSnapshotted)
    assert [s.snapshot_id for s in snaps] == [res["snapshot_id"]]
    assert {m.name: m.commit for m in snaps[0].members} == {
        n: h for n, (_, h) in _refs(mono).items()}


def test_init_twice_adopts_without_a_new_commit(workspace, manifest):
    first = C.init(workspace, manifest)
    mono = C.open_monorepo(workspace)
    before = _state(mono)
    again = C.init(workspace, manifest)
    assert again["adopted"] is True
    assert again["members"] == first["members"]
    assert again["snapshot_id"] == first["snapshot_id"]
    assert _state(mono) == before  # same root commit, same member commits, same files
    assert out(["rev-list", "--count", "HEAD"], mono.root) == "1"
    assert len(_events(workspace, E.RepoSnapshotted)) == 1  # one state, one event


def test_adopt_an_existing_repo_that_has_one_member(workspace, manifest, remotes):
    root = workspace.config.monorepo_root
    root.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], root)
    (root / "NOTES.md").write_text("mine\n")
    git(["add", "NOTES.md"], root)
    git(["commit", "-q", "-m", "user's own root"], root)
    git(["submodule", "add", "-q", "-b", "main", "--", str(remotes["kernel"].resolve()),
         "stack/kernel"], root)
    git(["commit", "-q", "-m", "kernel by hand"], root)
    own = head(root)
    kernel_head = head(root / "stack/kernel")
    res = C.init(workspace, manifest)
    assert res["adopted"] is True
    assert _events(workspace, E.MonoRepoInitialized)[0].adopted is True
    assert git(["merge-base", "--is-ancestor", own, "HEAD"], root, check=False).returncode == 0
    assert (root / "NOTES.md").read_text() == "mine\n"
    assert head(root / "stack/kernel") == kernel_head
    assert current_branch(root / "harness/server") == "release"
    assert (root / "tools/bench/bench/run.py").is_file()
    assert out(["status", "--porcelain"], root) == ""
    subs = out(["config", "-f", ".gitmodules", "--get-regexp", r"\.path$"], root)
    assert sorted(line.split()[1] for line in subs.splitlines()) == \
        ["harness/server", "stack/kernel", "tools/bench"]


def test_init_refuses_a_non_empty_dir_that_is_not_a_repo(workspace, manifest):
    root = workspace.config.monorepo_root
    (root / "stack").mkdir(parents=True)
    (root / "stack" / "keep.txt").write_text("do not touch\n")
    before = tree_digest(root)
    with pytest.raises(RepoError, match="not empty and is not a git repository"):
        C.init(workspace, manifest)
    assert tree_digest(root) == before
    assert sorted(p.name for p in root.iterdir()) == ["stack"]  # no .git, no manifest
    assert not _events(workspace, E.MonoRepoInitialized)


def test_init_with_a_bad_third_url_leaves_nothing(workspace, tmp_path, remotes):
    man = write_manifest(tmp_path / "m" / "bad.yaml", [
        {"name": "kernel", "url": str(remotes["kernel"])},
        {"name": "server", "url": str(remotes["server"])},
        {"name": "ghost", "url": str(tmp_path / "remotes" / "no-such.git")},
    ])
    p = run_forge("repos", "init", str(man))
    assert p.returncode != 0
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "no-such.git" in errors[0], p.stderr  # besides progress
    assert not workspace.config.monorepo_root.exists()  # the two members added went too
    assert not _events(workspace, E.MonoRepoInitialized)
    assert not _events(workspace, E.RepoSnapshotted)


# --- snapshot and restore: byte-exact ----------------------------------------------------


def _kernel(mono: MonoRepo) -> Path:
    return mono.member_dir("kernel")


def _modify(mono):
    (_kernel(mono) / "src/attn.cu").write_text("__global__ void attn() { /* faster */ }\n")


def _delete(mono):
    (_kernel(mono) / "README.md").unlink()


def _untracked_nested(mono):
    for rel in ("new/a/b/c/deep.txt", "new/a/other.txt", "scratch/x.py"):
        p = _kernel(mono) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{rel}\n")


def _binary(mono):
    (_kernel(mono) / "data/table.bin").write_bytes(BINARY[::-1] + b"\0" * 100)
    (_kernel(mono) / "data/new.bin").write_bytes(b"\0\x01\xff\0" * 64)


def _exec_bit(mono):
    p = _kernel(mono) / "run.sh"
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tool = _kernel(mono) / "scratch/tool.sh"  # an untracked executable too
    tool.parent.mkdir(exist_ok=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)


def _staged(mono):
    k = _kernel(mono)
    (k / "src/util.h").write_text("#pragma once\n#define STAGED 1\n")
    (k / "src/staged_new.h").write_text("// new and staged\n")
    git(["add", "src/util.h", "src/staged_new.h"], k)
    (k / "src/util.h").write_text("#pragma once\n#define STAGED 1\n#define THEN_EDITED 1\n")


def _new_commit(mono):
    k = _kernel(mono)
    (k / "src/attn.cu").write_text("// committed\n")
    git(["commit", "-q", "-am", "a local commit on main"], k)


def _other_branch(mono):
    git(["checkout", "-q", "dev"], _kernel(mono))  # a local dev from origin/dev


def _detached(mono):
    git(["checkout", "-q", "--detach", "origin/dev"], _kernel(mono))
    git(["checkout", "-q", "--detach", "origin/main"], mono.member_dir("server"))


def _symlink(mono):
    link = _kernel(mono) / "scratch/latest"  # an untracked symbolic link
    link.parent.mkdir(exist_ok=True)
    link.symlink_to("../src/attn.cu")


def _root_untracked(mono):
    (mono.root / "notes").mkdir()
    (mono.root / "notes" / "plan.md").write_text("root-level untracked\n")
    (mono.root / "TODO").write_bytes(b"\0binary todo\0")


def _everything(mono):
    for f in (_new_commit, _other_branch, _modify, _delete, _untracked_nested, _binary,
              _exec_bit, _staged, _root_untracked):
        f(mono)
    git(["checkout", "-q", "--detach", "origin/main"], mono.member_dir("server"))


CHANGES = [_modify, _delete, _untracked_nested, _binary, _exec_bit, _staged, _new_commit,
           _other_branch, _detached, _root_untracked, _symlink, _everything]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_snapshot_change_restore_is_byte_exact(workspace, mono, change):
    s0 = C.snapshot(workspace)
    st0 = _state(mono)
    change(mono)
    s1 = C.snapshot(workspace)
    st1 = _state(mono)
    assert s1 != s0 and st1 != st0
    assert C.restore(workspace, s0)["snapshot_id"] == s0
    assert _state(mono) == st0
    # then forward again to the later snapshot, after having restored the earlier one
    assert C.restore(workspace, s1)["snapshot_id"] == s1
    assert _state(mono) == st1
    assert C.restore(workspace, s0)["snapshot_id"] == s0
    assert _state(mono) == st0


def test_restore_moves_a_branch_back_and_keeps_its_tip(workspace, mono):
    s0 = C.snapshot(workspace)
    _new_commit(mono)
    tip = head(_kernel(mono))
    C.restore(workspace, s0)
    k = _kernel(mono)
    assert current_branch(k) == "main" and head(k) != tip
    assert commit_of(f"refs/forge/kept/{tip}", k) == tip  # the commit left stays reachable


def test_restore_records_the_state_it_replaced_and_nothing_is_lost(workspace, mono):
    _modify(mono)
    s1 = C.snapshot(workspace)
    _binary(mono)
    _untracked_nested(mono)
    _new_commit(mono)  # none of this is snapshotted by hand
    unsaved = _state(mono)
    res = C.restore(workspace, s1)
    restored = _events(workspace, E.RepoRestored)
    assert [(r.snapshot_id, r.previous_snapshot_id) for r in restored] == \
        [(s1, res["previous_snapshot_id"])]
    assert res["previous_snapshot_id"] not in (s1, None)
    assert _state(mono) != unsaved
    C.restore(workspace, res["previous_snapshot_id"])
    assert _state(mono) == unsaved


def test_same_state_same_snapshot_id_one_event(workspace, mono):
    _untracked_nested(mono)
    _modify(mono)
    a = C.snapshot(workspace, "first")
    b = C.snapshot(workspace, "second")
    assert a == b
    ids = [s.snapshot_id for s in _events(workspace, E.RepoSnapshotted)]
    assert ids.count(a) == 1
    (_kernel(mono) / "new/a/other.txt").write_text("changed by one byte!\n")
    assert C.snapshot(workspace) != a


def test_restore_refuses_before_touching_when_an_artifact_is_gone(workspace, mono):
    _untracked_nested(mono)
    _modify(mono)
    s1 = C.snapshot(workspace)
    ev = next(s for s in _events(workspace, E.RepoSnapshotted) if s.snapshot_id == s1)
    kernel = next(m for m in ev.members if m.name == "kernel")
    other = next(f.digest for f in kernel.untracked if f.path == "new/a/other.txt")
    gone = kernel.diff_digest
    for d in (gone, other):
        workspace.artifacts._path(d).unlink()
    # The state before the restore is snapshotted first; it must not hold these bytes again
    # (it would store them anew): the diff changes with the commit, other.txt is rewritten.
    (_kernel(mono) / "new/a/other.txt").write_text("rewritten\n")
    _new_commit(mono)
    _other_branch(mono)
    (mono.root / "stray.txt").write_text("now\n")
    before = _state(mono)
    with pytest.raises(RepoError, match=f"member kernel: artifact {gone}.*missing"):
        C.restore(workspace, s1)
    assert _state(mono) == before
    assert not workspace.artifacts.exists(gone) and not workspace.artifacts.exists(other)
    assert not _events(workspace, E.RepoRestored)


def test_unknown_snapshot_is_a_one_line_error(workspace, mono):
    (mono.root / "stray.txt").write_text("stays\n")
    before = _state(mono)
    p = run_forge("repos", "restore", "snap-doesnotexist")
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "snap-doesnotexist" in lines[0], p.stderr
    assert _state(mono) == before
    assert not _events(workspace, E.RepoRestored)


def test_snapshot_fields(workspace, mono, remotes):
    k = _kernel(mono)
    _modify(mono)
    _binary(mono)
    _delete(mono)
    _staged(mono)
    _untracked_nested(mono)
    ev = C.take_snapshot(workspace, "fields")
    assert ev.reason == "fields" and ev.root == str(mono.root)
    by = {m.name: m for m in ev.members}
    assert [m.name for m in ev.members] == [".", "kernel", "server", "bench"]
    km = by["kernel"]
    assert (km.path, km.url, km.branch, km.commit) == \
        ("stack/kernel", str(remotes["kernel"].resolve()), "main", head(k))
    assert km.diff_digest is not None and km.dirty
    assert workspace.artifacts.get(km.diff_digest) == \
        git(["diff", "--binary", "HEAD"], k).stdout
    assert b"GIT binary patch" in workspace.artifacts.get(km.diff_digest)
    assert [f.path for f in km.untracked] == sorted(
        ["new/a/b/c/deep.txt", "new/a/other.txt", "scratch/x.py", "data/new.bin"])
    for f in km.untracked:
        assert workspace.artifacts.get(f.digest) == (k / f.path).read_bytes()
    root = by["."]
    assert (root.path, root.url, root.branch, root.commit, root.dirty) == \
        (".", None, "main", head(mono.root), False)  # member changes are not the root's
    assert (by["server"].branch, by["server"].dirty) == ("release", False)


def test_status_json_lists_members_pins_dirty_and_worktrees(workspace, mono):
    _modify(mono)
    (mono.member_dir("bench") / "out.log").write_text("untracked\n")
    wt = W.ensure(mono, C.worktree_base(workspace), "kernel", "t-a")
    p = run_forge("repos", "status", "--json")
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    rows = {m["name"]: m for m in st["members"]}
    assert list(rows) == [".", "kernel", "server", "bench"]
    for n, (branch, commit) in _refs(mono).items():
        assert (rows[n]["branch"], rows[n]["commit"]) == (branch, commit)
    assert {n: r["dirty"] for n, r in rows.items()} == \
        {".": False, "kernel": True, "server": False, "bench": True}
    assert rows["kernel"]["changed"] is True and rows["bench"]["untracked"] == 1
    assert rows["kernel"]["worktrees"] == [{"task_id": "t-a", "path": str(wt.path),
                                            "branch": "forge/task/t-a", "head": wt.head}]
    assert all(not rows[n]["worktrees"] for n in (".", "server", "bench"))
    human = run_forge("repos", "status")
    assert human.returncode == 0 and "worktree of task t-a" in human.stdout


# --- per-task worktrees ------------------------------------------------------------------


def _commit_in(path: Path, rel: str, text: str) -> None:
    p = path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    git(["add", "--", rel], path)
    git(["commit", "-q", "--no-verify", "-m", f"add {rel}"], path)


def test_two_tasks_on_one_member_are_isolated(workspace, mono):
    base = C.worktree_base(workspace)
    k = _kernel(mono)
    git(["checkout", "-q", "dev"], k)  # the member's checkout is not the pin
    pinned = out(["rev-parse", "origin/main"], k)
    member_before = _state(mono)
    a = W.ensure(mono, base, "kernel", "t-a", pinned)
    b = W.ensure(mono, base, "kernel", "t-b", pinned)
    assert a.path != b.path and a.path == base / "t-a" / "kernel"
    assert (a.branch, b.branch) == ("forge/task/t-a", "forge/task/t-b")
    assert a.head == b.head == pinned
    assert current_branch(a.path) == a.branch and current_branch(b.path) == b.branch
    assert not (a.path / "dev.txt").exists()  # from the pin, not from the member's checkout
    _commit_in(a.path, "only_a.txt", "a\n")
    (b.path / "only_b_uncommitted.txt").write_text("b\n")
    assert not (b.path / "only_a.txt").exists()
    assert not (a.path / "only_b_uncommitted.txt").exists()
    assert git(["cat-file", "-e", "forge/task/t-b:only_a.txt"], k, check=False).returncode
    assert _state(mono) == member_before  # the root's checkout of the member is untouched
    assert W.ensure(mono, base, "kernel", "t-a").path == a.path  # same worktree again


def test_parallel_tasks_commit_without_seeing_each_other(workspace, mono):
    base = C.worktree_base(workspace)
    wts = {t: W.ensure(mono, base, "kernel", t) for t in ("t-a", "t-b")}
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(task: str) -> None:
        try:
            start.wait(timeout=30)
            for i in range(8):
                _commit_in(wts[task].path, f"{task}/f{i}.txt", f"{task} {i}\n")
        except BaseException as e:  # reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in wts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    k = _kernel(mono)
    base_files = set(out(["ls-tree", "-r", "--name-only", "HEAD"], k).splitlines())
    for task, other in (("t-a", "t-b"), ("t-b", "t-a")):
        files = set(out(["ls-tree", "-r", "--name-only", f"forge/task/{task}"], k)
                    .splitlines())
        assert files == base_files | {f"{task}/f{i}.txt" for i in range(8)}
        assert not (wts[task].path / other).exists()
        assert out(["rev-list", "--count", f"HEAD..forge/task/{task}"], k) == "8"
    assert out(["status", "--porcelain"], k) == ""


def test_release_commits_leftovers_removes_worktree_keeps_branch(workspace, mono):
    base = C.worktree_base(workspace)
    k = _kernel(mono)
    a = W.ensure(mono, base, "kernel", "t-a")
    kept = W.ensure(mono, base, "kernel", "t-keep")
    (a.path / "wip").mkdir()
    (a.path / "wip" / "unsaved.txt").write_text("uncommitted work\n")
    (a.path / "README.md").write_text("edited, not committed\n")
    released = W.release(mono, base, "t-a")
    assert [w.path for w in released] == [a.path]
    assert not a.path.exists() and not (base / "t-a").exists()
    assert out(["show", "forge/task/t-a:wip/unsaved.txt"], k) == "uncommitted work"
    assert out(["show", "forge/task/t-a:README.md"], k) == "edited, not committed"
    assert str(a.path) not in out(["worktree", "list"], k)
    assert [w.task_id for w in W.holders(mono)["kernel"]] == ["t-keep"]
    # keep=True leaves the worktree where it is
    assert [w.path for w in W.release(mono, base, "t-keep", keep=True)] == [kept.path]
    assert (kept.path / ".git").exists()
    # the task comes back: its branch, with the work, in a fresh worktree
    again = W.ensure(mono, base, "kernel", "t-a")
    assert (again.path / "wip" / "unsaved.txt").read_text() == "uncommitted work\n"
    assert os.path.samefile(again.path, a.path)
