"""The kernel example on this machine (examples/monorepo): a MonoRepo of local repositories,
a kernel task whose executor commits candidates in the task's worktree; the loop builds each
commit, verifies it against the reference, measures it, rejects one commit and accepts
another, each kept on a ref with its evidence. Real git, real subprocesses, the real CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from infer_forge.ledger import events as E
from infer_forge.ledger.payloads import Digest
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import open_workspace
from infer_forge.projections.memory import task_memory
from infer_forge.projections.repos import read_repo_history

from tests.conftest import REPO, run_forge

TASK = "kernel-prefix-sum"


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr + p.stdout
    return p


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_kernel_task_accepts_one_commit_and_rejects_another(tmp_path, forge_home):
    ex = tmp_path / "examples"
    for sub in ("monorepo", "points", "profiles"):
        shutil.copytree(REPO / "examples" / sub, ex / sub,
                        ignore=shutil.ignore_patterns("remotes", "__pycache__"))
    _ok(subprocess.run([sys.executable, str(ex / "monorepo/make_remotes.py")],
                       capture_output=True, text=True))
    _ok(run_forge("init"))
    _ok(run_forge("repos", "init", str(ex / "monorepo/local.yaml")))
    _ok(run_forge("task", "new", str(ex / "monorepo/kernel-task/prefix-sum.yaml")))
    run = _ok(run_forge("task", "run", TASK, timeout=600))
    assert "exited delivered" in run.stdout + run.stderr

    ws = open_workspace(forge_home)
    try:
        mem = task_memory(ws.ledger, TASK)
        b1, b2, b3 = mem.execution_record
        assert [b.decision for b in mem.execution_record] == [None, "rejected", "accepted"]
        wrong, right = b2.candidate["code.kernels"], b3.candidate["code.kernels"]
        assert len(wrong) == len(right) == 40 and wrong != right
        # The rejection says why: the commit is not exact against the reference.
        assert "exact fail" in mem.rejected[0]["reason"]
        assert b2.median("max_abs_err") > 0 and b3.median("max_abs_err") == 0
        assert b3.median("element_reads") <= 0.5 * b1.median("element_reads")

        kernels = ws.config.monorepo_root / "stack/kernels"
        # Each decided commit stays on a ref, named in the decision's evidence.
        rej = f"refs/forge/rejected/{TASK}/b2/kernels"
        acc = f"refs/forge/accepted/{TASK}/b3/kernels"
        assert _git(kernels, "rev-parse", rej) == wrong
        assert _git(kernels, "rev-parse", acc) == right
        evs = [r.event for r in ws.ledger.stream(task_stream(TASK))]
        rejected = next(e for e in evs if isinstance(e, E.DirectionRejected))
        accepted = next(e for e in evs if isinstance(e, E.DeliverableAccepted))
        assert any(rej in x and wrong in x for x in rejected.evidence)
        assert any(acc in x and right in x for x in accepted.evidence)
        # The accepted commit descends from the pinned one and holds the fixed kernel.
        pinned = b1.candidate.get("code.kernels") or _git(kernels, "rev-parse", "main")
        assert _git(kernels, "merge-base", "--is-ancestor", pinned, right) == ""
        assert "total += x\n        out.append(total)" in _git(kernels, "show",
                                                                f"{right}:prefix_sum.py")

        # Every block was built (a recorded tool call), each measurement names the snapshot
        # it ran on, and that snapshot holds the block's commit for the member.
        builds = [e for e in evs if isinstance(e, E.ToolInvoked) and e.tool == "build"]
        assert {e.block_id for e in builds} == {"b1", "b2", "b3"}
        assert all(e.exit_code == 0 and e.input_digests.get(Digest.BUILD) for e in builds)
        snaps = read_repo_history(ws.ledger).snapshots
        for e in evs:
            if isinstance(e, E.MeasurementRecorded):
                sid = e.input_digests[Digest.REPO_SNAPSHOT]
                state = next(m for m in snaps[sid].members if m.name == "kernels")
                want = e.candidate.get("code.kernels") or state.commit
                assert state.commit == want
        sid_b3 = next(e.input_digests[Digest.REPO_SNAPSHOT] for e in evs
                      if isinstance(e, E.MeasurementRecorded) and e.block_id == "b3")
        defined = evs[0]
        assert isinstance(defined, E.TaskDefined)
        assert defined.input_digests[Digest.REPO_SNAPSHOT] in snaps

        # The worktree went with the exit; the task branch stays.
        assert not (forge_home / "worktrees" / TASK / "kernels").exists()
        assert _git(kernels, "branch", "--list", f"forge/task/{TASK}")
    finally:
        ws.close()

    # The snapshot a measurement names brings the member back to the measured commit,
    # byte for byte, in the root's checkout (detached: the task's branch stays its own).
    _ok(run_forge("repos", "restore", sid_b3))
    assert _git(kernels, "rev-parse", "HEAD") == right
    assert _git(kernels, "status", "--porcelain") == ""
    restored = (kernels / "prefix_sum.py").read_text()
    assert "total += x\n        out.append(total)" in restored  # the accepted kernel
    assert "out.append(total)\n        total += x" not in restored  # not the rejected one

    # The snapshot id is a dimension of the index.
    q = _ok(run_forge("sql", "--json", "SELECT DISTINCT block_id, repo_snapshot FROM "
                      "measurements ORDER BY block_id"))
    rows = json.loads(q.stdout)
    assert [r["block_id"] for r in rows] == ["b1", "b2", "b3"]
    assert all(r["repo_snapshot"].startswith("snap-") for r in rows)
    assert len({r["repo_snapshot"] for r in rows}) == 3
