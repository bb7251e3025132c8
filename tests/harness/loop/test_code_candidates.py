"""Code candidates in the loop: a candidate names a commit of a MonoRepo member as a ref, a
patch file, the worktree's state or `upstream` (the task branch rebased onto the member's
upstream); each is resolved to a full commit id before its block starts, measured in the
task's worktree, and a bad one is refused as data. Real git, real subprocesses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import SpecError
from infer_forge.ledger.streams import task_stream
from infer_forge.projections.memory import task_memory
from infer_forge.projections.repos import read_repo_history
from infer_forge.repos import commands as rc

from tests.conftest import REPO
from tests.helpers.gitrepos import make_remote, write_manifest

EXECUTOR = r'''
import json, os, sys
memory = json.load(sys.stdin)["memory"]
n = sum(1 for b in memory["execution_record"] if b.get("candidate"))
cands = json.loads(os.environ.get("CANDS") or open(os.path.join(os.path.dirname(__file__),
                                                               "cands.json")).read())
if n < len(cands):
    print(json.dumps({"action": "try", "candidate": cands[n]}))
else:
    print(json.dumps({"action": "stop", "reason": "done"}))
'''
EVALUATOR = r'''
import json, os, pathlib
t = pathlib.Path(os.environ["FORGE_WORKTREE_KERNELS"])
up = t / "up.txt"
print(json.dumps({"value": int((t / "value.txt").read_text()) +
                  (int(up.read_text()) if up.exists() else 0)}))
'''
PATCH = """diff --git a/value.txt b/value.txt
--- a/value.txt
+++ b/value.txt
@@ -1 +1 @@
-0
+1
"""


def _task(tmp: Path, cands: list) -> Path:
    d = tmp / "spec"
    shutil.copytree(REPO / "examples/points", d / "points")
    shutil.copytree(REPO / "examples/profiles", d / "profiles")
    (d / "exec.py").write_text(EXECUTOR)
    (d / "eval.py").write_text(EVALUATOR)
    (d / "cands.json").write_text(json.dumps(cands))
    (d / "p1.patch").write_text(PATCH)
    py = json.dumps(sys.executable)
    (d / "t.yaml").write_text(f"""id: code-t
type: upstream-sync
goal: bring the value to at least 2
point: points/tiny-cpu.yaml
code: {{members: [kernels], build: false}}
contract:
  gates: [{{name: value, metric: value, at_least: 2, repeats: 1}}]
exit: {{when: all_gates_pass, max_blocks: 6, no_progress_blocks: 5}}
executor: {{kind: command, argv: [{py}, exec.py]}}
evaluator: {{kind: command, argv: [{py}, eval.py]}}
""")
    return d / "t.yaml"


def _upstream_commit(tmp: Path, remote: Path, files: dict[str, str]) -> str:
    clone = tmp / "upstream-clone"
    subprocess.run(["git", "clone", "-q", str(remote), str(clone)], check=True)
    for k, v in files.items():
        (clone / k).write_text(v)
    env = ["-c", "user.name=u", "-c", "user.email=u@u"]
    subprocess.run(["git", "-C", str(clone), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(clone), *env, "commit", "-qm", "upstream"], check=True)
    # written as the remote's owner would (a fetch into it): forge's pre-receive guards pushes
    subprocess.run(["git", "-C", str(remote), "fetch", "-q", str(clone), "HEAD:main"],
                   check=True)
    return subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def _setup(tmp_path, workspace):
    remote = make_remote(tmp_path, "kernels", {"value.txt": "0\n"})
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "kernels", "url": str(remote)}]))
    return remote


def test_ref_patch_and_upstream_candidates(tmp_path, workspace):
    remote = _setup(tmp_path, workspace)
    task = _task(tmp_path, [{"code.kernels": "no-such-ref"},
                            {"code.kernels": "patch:p1.patch"},
                            {"code.kernels": "upstream"}])
    define_task(workspace, task)
    up = _upstream_commit(tmp_path, remote, {"up.txt": "5\n"})  # after the task pinned
    res = run_task(workspace, "code-t")
    assert res.exit_state == "delivered", res.exit_reason
    mem = task_memory(workspace.ledger, "code-t")
    b1, b2, b3, b4 = mem.execution_record
    # A value that names no commit is refused when its block starts, as data.
    assert b2.decision == "rejected" and not b2.measurements
    assert "no-such-ref" in mem.rejected[0]["reason"]
    # The patch: committed on the task branch, measured, rejected by its gate.
    assert b3.decision == "rejected" and b3.median("value") == 1
    patched = b3.candidate["code.kernels"]
    # Upstream: the task branch (the patch commit) rebased onto upstream, then accepted.
    assert b4.decision == "accepted" and b4.median("value") == 6
    rebased = b4.candidate["code.kernels"]
    member = rc.open_monorepo(workspace).member_dir("kernels")

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(member), *a], check=True,
                              capture_output=True, text=True).stdout.strip()

    assert git("rev-parse", f"{rebased}^") == up
    assert git("show", f"{rebased}:value.txt") == "1"
    assert git("rev-parse", "refs/forge/rejected/code-t/b3/kernels") == patched
    syncs = read_repo_history(workspace.ledger).syncs
    assert [(s.branch, s.outcome) for s in syncs] == [("forge/task/code-t", "rebased")]


def test_an_upstream_conflict_refuses_the_candidate_and_leaves_the_branch(tmp_path, workspace):
    remote = _setup(tmp_path, workspace)
    task = _task(tmp_path, [{"code.kernels": "patch:p1.patch"},
                            {"code.kernels": "upstream"}])
    define_task(workspace, task)
    _upstream_commit(tmp_path, remote, {"value.txt": "7\n"})  # the same line as the patch
    res = run_task(workspace, "code-t")
    assert res.exit_state != "delivered"
    mem = task_memory(workspace.ledger, "code-t")
    b3 = mem.execution_record[2]
    assert b3.decision == "rejected" and not b3.measurements
    assert "conflict in value.txt" in mem.rejected[-1]["reason"]
    syncs = read_repo_history(workspace.ledger).syncs
    assert syncs[-1].outcome == "conflict" and syncs[-1].conflicts[0].path == "value.txt"
    assert any("<<<<<<<" in h for h in syncs[-1].conflicts[0].hunks)
    # The task branch still holds the patch commit; nothing was half-rebased.
    member = rc.open_monorepo(workspace).member_dir("kernels")
    tip = subprocess.run(["git", "-C", str(member), "rev-parse", "forge/task/code-t"],
                         check=True, capture_output=True, text=True).stdout.strip()
    assert tip == mem.execution_record[1].candidate["code.kernels"]
    events = [r.event for r in workspace.ledger.stream(task_stream("code-t"))]
    assert isinstance(events[-1], E.TaskExited)


def test_code_base_pins_the_baseline_to_a_ref_resolved_when_defined(tmp_path, workspace):
    remote = make_remote(tmp_path, "kernels", {"value.txt": "0\n"},
                         branches={"two": {"value.txt": "2\n"}})
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "kernels", "url": str(remote)}]))
    task = _task(tmp_path, [])
    text = task.read_text().replace("code: {members: [kernels], build: false}",
                                    "code: {members: [kernels], build: false, "
                                    "base: {kernels: two}}")
    task.write_text(text.replace("id: code-t", "id: code-base"))
    info = define_task(workspace, task)
    member = rc.open_monorepo(workspace).member_dir("kernels")
    two = subprocess.run(["git", "-C", str(member), "rev-parse", "origin/two"], check=True,
                         capture_output=True, text=True).stdout.strip()
    # Stored as the commit it named (a moving branch does not move the baseline).
    mem = task_memory(workspace.ledger, info["task_id"])
    assert mem.definition["code"]["base"] == {"kernels": two}
    res = run_task(workspace, "code-base")
    assert res.memory.execution_record[0].median("value") == 2  # the baseline ran `two`
    # A ref the member does not have, or a member the task does not change: one line.
    bad = tmp_path / "spec" / "bad.yaml"
    bad.write_text(text.replace("id: code-t", "id: code-bad").replace("kernels: two",
                                                                      "kernels: nope"))
    with pytest.raises(HarnessError, match=r"code.base.kernels: 'nope' is not a commit"):
        define_task(workspace, bad)
    bad.write_text(text.replace("id: code-t", "id: code-bad").replace("kernels: two",
                                                                      "other: two"))
    with pytest.raises(SpecError, match="base names member 'other'"):
        define_task(workspace, bad)
