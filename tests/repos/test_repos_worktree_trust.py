"""Git in a task's worktree after the task's calls (issue 27, item 1): a call may rewrite the
worktree's `.git` file to a repository of its own, plant a per-worktree config in the admin
directory, or make a nested repository; forge's next git there (the candidate commit, the
snapshot, the dirty check) must never run a program that config names. Real git, real
sandboxed calls (`run_tool` with the task: bubblewrap where it works), a real code task."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.tool_calls.calls import run_tool
from infer_forge.repos import commands as C
from infer_forge.repos import snapshot as S
from infer_forge.repos import worktrees as W
from infer_forge.repos.errors import RepoError
from infer_forge.repos.git import git, out

from tests.helpers.gitrepos import alpha_monorepo

TASK = "trust-t"


@pytest.fixture
def mono(tmp_path, workspace):
    return alpha_monorepo(tmp_path, workspace, {"value.txt": "0\n"})


@pytest.fixture
def evil(tmp_path) -> tuple[Path, Path]:
    """(a script that touches a marker, the marker): the program a planted config names."""
    marker = tmp_path / "MARKER"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\ncat\n")
    script.chmod(0o755)
    return script, marker


def _call(ws, wt: Path, code: str) -> None:
    """What a task's call does: a process in the task's sandbox (bubblewrap where the host
    has it), its worktree and the worktree's admin directory writable."""
    r = run_tool(ws, [sys.executable, "-c", code], cwd=wt, task=TASK)
    assert r.returncode == 0, r.stderr


PLANT = r'''
import os, subprocess, sys
wt, script = sys.argv[1], sys.argv[2]
evil = os.path.join(wt, "evil")
subprocess.run(["git", "init", "-q", evil], check=True)
with open(os.path.join(evil, ".git", "config"), "a") as f:
    f.write("[core]\n\thooksPath = %s\n[filter \"x\"]\n\tclean = %s\n[include]\n"
            "\tpath = %s\n" % (os.path.dirname(script), script, os.path.join(evil, "inc")))
open(os.path.join(evil, "inc"), "w").write("[core]\n\tfsmonitor = %s\n" % script)
open(os.path.join(wt, ".gitattributes"), "w").write("* filter=x diff=x\n")
open(os.path.join(wt, "value.txt"), "w").write("7\n")
open(os.path.join(wt, ".git"), "w").write("gitdir: %s\n" % os.path.join(evil, ".git"))
'''


def test_a_rewritten_git_file_is_refused_and_runs_nothing(tmp_path, workspace, mono, evil):
    script, marker = evil
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    _call(workspace, wt.path, PLANT.replace("sys.argv[1]", repr(str(wt.path)))
          .replace("sys.argv[2]", repr(str(script))))
    repo = mono.member_dir("alpha")
    ops = {
        "ensure": lambda: W.ensure(mono, C.worktree_base(workspace), "alpha", TASK),
        "locate": lambda: W.locate(repo, wt.path),
        "release": lambda: W.release(mono, C.worktree_base(workspace), TASK),
    }
    for name, op in ops.items():
        with pytest.raises(RepoError) as e:
            op()
        msg = str(e.value)
        assert "\n" not in msg and str(wt.path) in msg and "refusing to run git" in msg, name
        assert not marker.exists(), f"{name} ran the planted program"
    assert wt.path.is_dir()  # release refused: nothing removed
    # The plant is live: plain git there runs it (what forge did before).
    subprocess.run(["git", "status"], cwd=wt.path, capture_output=True)
    assert marker.exists()


def test_a_git_file_that_is_a_link_or_huge_is_refused(tmp_path, workspace, mono):
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    repo = mono.member_dir("alpha")
    dot = wt.path / ".git"
    good = dot.read_text()
    elsewhere = tmp_path / "gitfile"
    elsewhere.write_text(good)
    dot.unlink()
    dot.symlink_to(elsewhere)  # the same text, behind a link
    with pytest.raises(RepoError, match="refusing to run git"):
        W.locate(repo, wt.path)
    dot.unlink()
    dot.write_text(good + "#" * (1 << 20))
    with pytest.raises(RepoError, match="over the limit"):
        W.locate(repo, wt.path)
    dot.write_text(good)
    assert W.locate(repo, wt.path).admin.parent.name == "worktrees"  # intact: located


def test_a_head_moved_off_the_task_branch_is_refused(tmp_path, workspace, mono):
    repo = mono.member_dir("alpha")
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    assert wt.tree is not None
    main = out(["rev-parse", "refs/heads/main"], repo)
    # The admin directory is the call's to write: HEAD now names the member's main.
    _call(workspace, wt.path, f"open({str(wt.tree.admin / 'HEAD')!r}, 'w')"
                              f".write('ref: refs/heads/main\\n'); "
                              f"open({str(wt.path / 'x.txt')!r}, 'w').write('x')")
    with pytest.raises(RepoError, match="not its task branch forge/task/trust-t"):
        W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    W.release(mono, C.worktree_base(workspace), TASK)  # git no longer lists it as the task's
    assert out(["rev-parse", "refs/heads/main"], repo) == main  # forge committed nothing


WORKTREE_CONFIG = r'''
import sys
admin, wt, script = sys.argv[1], sys.argv[2], sys.argv[3]
open(admin + "/config.worktree", "w").write(
    "[core]\n\tfsmonitor = %s\n[filter \"x\"]\n\tclean = %s\n\trequired = true\n"
    % (script, script))
open(wt + "/.gitattributes", "w").write("* filter=x\n")
open(wt + "/value.txt", "w").write("8\n")
'''


def test_a_planted_per_worktree_config_is_refused(tmp_path, workspace, mono, evil):
    script, marker = evil
    repo = mono.member_dir("alpha")
    git(["config", "extensions.worktreeConfig", "true"], repo)  # the user's own choice
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    assert wt.tree is not None
    code = (WORKTREE_CONFIG.replace("sys.argv[1]", repr(str(wt.tree.admin)))
            .replace("sys.argv[2]", repr(str(wt.path))).replace("sys.argv[3]",
                                                                 repr(str(script))))
    _call(workspace, wt.path, code)  # the admin directory is writable to the call
    for op in (lambda: W.dirty(wt.tree), lambda: W.commit_all(wt.tree, "x"),
               lambda: C.take_snapshot(workspace, "after a call", mono,
                                       overrides={"alpha": wt.tree})):
        with pytest.raises(RepoError) as e:
            op()
        assert "config.worktree" in str(e.value) and "\n" not in str(e.value)
        assert not marker.exists()
    subprocess.run(["git", "status"], cwd=wt.path, capture_output=True)  # the plant is live
    assert marker.exists()
    marker.unlink()
    # Sparse checkout's own keys are fine there.
    (wt.tree.admin / "config.worktree").write_text("[core]\n\tsparseCheckout = false\n")
    (wt.path / ".gitattributes").unlink()
    assert W.dirty(wt.tree) and not marker.exists()


def test_a_nested_repository_in_a_worktree_is_never_entered(tmp_path, workspace, mono, evil):
    script, marker = evil
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    code = f'''
import subprocess
sub = {str(wt.path / "sub")!r}
run = lambda *a, **k: subprocess.run(list(a), check=True, **k)
run("git", "init", "-q", sub)
open(sub + "/f", "w").write("f\\n")
run("git", "-C", sub, "add", "f")
run("git", "-C", sub, "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qm", "s")
sha = subprocess.run(["git", "-C", sub, "rev-parse", "HEAD"], capture_output=True,
                     text=True).stdout.strip()
run("git", "update-index", "--add", "--cacheinfo", "160000," + sha + ",sub")
open({str(wt.path / ".gitmodules")!r}, "w").write(
    '[submodule "sub"]\\n\\tpath = sub\\n\\turl = ./sub\\n\\tignore = none\\n')
run("git", "-C", sub, "config", "core.fsmonitor", {str(script)!r})
run("git", "-C", sub, "config", "filter.x.clean", {str(script)!r})
open(sub + "/.gitattributes", "w").write("* filter=x\\n")
open(sub + "/f", "w").write("changed\\n")
'''
    _call(workspace, wt.path, code)
    assert wt.tree is not None
    W.commit_all(wt.tree, "forge: the task's work")
    ev = C.take_snapshot(workspace, "after a call", mono, overrides={"alpha": wt.tree})
    assert not marker.exists()
    assert "sub" in out(["ls-tree", "--name-only", "HEAD"], wt.tree)
    assert ev.snapshot_id.startswith("snap-")
    subprocess.run(["git", "status"], cwd=wt.path, capture_output=True)  # the plant is live
    assert marker.exists()


def test_an_oversized_untracked_file_is_refused_in_one_line(tmp_path, workspace, mono,
                                                            monkeypatch):
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    monkeypatch.setattr(S, "MAX_UNTRACKED", 1000)
    (wt.path / "small.bin").write_bytes(b"x" * 1000)
    os.mkfifo(wt.path / "pipe")  # never opened for a read that would block
    assert wt.tree is not None
    ev = C.take_snapshot(workspace, "ok", mono, overrides={"alpha": wt.tree})
    [m] = [m for m in ev.members if m.name == "alpha"]
    assert [f.path for f in m.untracked] == ["small.bin"]
    with open(wt.path / "big.bin", "wb") as f:  # sparse: its size, not its blocks
        f.truncate(6 << 30)
    with pytest.raises(RepoError) as e:
        C.take_snapshot(workspace, "too big", mono, overrides={"alpha": wt.tree})
    assert "big.bin" in str(e.value) and "limit" in str(e.value) and "\n" not in str(e.value)


EXECUTOR = r'''
import json, os, subprocess, sys
memory = json.load(sys.stdin)["memory"]
wt = os.environ["FORGE_WORKTREE_ALPHA"]
if not any(b.get("candidate") for b in memory["execution_record"]):
    evil = os.path.join(wt, "evil")
    subprocess.run(["git", "init", "-q", evil], check=True)
    with open(os.path.join(evil, ".git", "config"), "a") as f:
        f.write("[core]\n\tfsmonitor = %s\n" % os.environ["EVIL"])
    open(os.path.join(wt, "value.txt"), "w").write("5\n")
    open(os.path.join(wt, ".git"), "w").write("gitdir: %s\n" % os.path.join(evil, ".git"))
    print(json.dumps({"action": "try", "candidate": {"code.alpha": "worktree"}}))
else:
    print(json.dumps({"action": "stop", "reason": "done"}))
'''
EVALUATOR = r'''
import json, os, pathlib
print(json.dumps({"value": int((pathlib.Path(os.environ["FORGE_WORKTREE_ALPHA"])
                                / "value.txt").read_text())}))
'''


def test_the_loop_refuses_a_candidate_from_a_rewritten_worktree(tmp_path, workspace, mono,
                                                                evil, monkeypatch):
    from infer_forge.harness.loop.define import define_task
    from infer_forge.harness.loop.run import run_task
    from infer_forge.projections.memory import task_memory

    from tests.conftest import REPO

    script, marker = evil
    d = tmp_path / "spec"
    d.mkdir()
    (d / "exec.py").write_text(EXECUTOR.replace('os.environ["EVIL"]', repr(str(script))))
    (d / "eval.py").write_text(EVALUATOR)
    py = json.dumps(sys.executable)
    (d / "t.yaml").write_text(f"""id: {TASK}
type: upstream-sync
goal: raise the value
point: {REPO}/examples/points/tiny-cpu.yaml
code: {{members: [alpha], build: false}}
contract:
  gates: [{{name: value, metric: value, at_least: 2, repeats: 1}}]
exit: {{when: all_gates_pass, max_blocks: 4, no_progress_blocks: 3}}
executor: {{kind: command, argv: [{py}, exec.py]}}
evaluator: {{kind: command, argv: [{py}, eval.py]}}
""")
    define_task(workspace, d / "t.yaml")
    try:
        run_task(workspace, TASK)
    except HarnessError as e:  # the next step's worktree: refused, one line
        assert "refusing to run git" in str(e) and "\n" not in str(e)
    mem = task_memory(workspace.ledger, TASK)
    cands = [b for b in mem.execution_record if b.candidate.get("code.alpha")]
    # The candidate commit was refused as data, naming the worktree; nothing measured.
    assert cands and all(b.decision == "rejected" and not b.measurements for b in cands)
    assert any("refusing to run git" in r["reason"] for r in mem.rejected)
    assert not marker.exists()


def test_a_rewritten_git_file_gets_the_next_call_no_other_directory(tmp_path, workspace,
                                                                    mono):
    """The sandbox makes a worktree's git directories writable to a call: found as forge
    made them, not from the `.git` file (and `commondir`) an earlier call rewrote."""
    victim = tmp_path / "victim"
    git(["init", "-q", str(victim)], tmp_path)
    wt = W.ensure(mono, C.worktree_base(workspace), "alpha", TASK)
    fake = wt.path / "fake"
    _call(workspace, wt.path, f"""
import os
os.makedirs({str(fake)!r})
open({str(fake / 'commondir')!r}, 'w').write({str(victim / '.git')!r})
open({str(fake / 'gitdir')!r}, 'w').write({str(wt.path / '.git')!r})
open({str(wt.path / '.git')!r}, 'w').write('gitdir: ' + {str(fake)!r} + '\\n')
""")
    planted = victim / ".git" / "objects" / "planted"
    r = run_tool(workspace, [sys.executable, "-c", f"open({str(planted)!r}, 'w').write('x')"],
                 cwd=wt.path, task=TASK)
    if r.event.sandbox["kind"] == "none":
        pytest.skip(f"no sandbox on this host: {r.event.sandbox.get('reason')}")
    assert r.returncode != 0 and not planted.exists()
    assert not (victim / ".git" / "refs" / "heads" / "forge").exists()
