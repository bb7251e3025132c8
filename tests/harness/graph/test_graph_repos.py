"""A task graph's shared-repo nodes as MonoRepo members: each is a worktree of its member,
on its own branch, pinned at the snapshot the run records. Two tasks run in parallel (-j 2)
on two branches of one member and never see each other's files."""

from __future__ import annotations

import subprocess

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.graph.commands import define_graph
from infer_forge.harness.graph.run import run_graph
from infer_forge.ledger.streams import graph_stream
from infer_forge.projections.graph import load_graph
from infer_forge.projections.repos import read_repo_history
from infer_forge.repos import commands as rc

from tests.helpers.gitrepos import head, make_remote, write_manifest

# Each task writes its own file in its repo node, commits it, waits (bounded) until the other
# task has committed too, then fails if the other's file is visible in its checkout.
WRITER = r'''
import os, pathlib, subprocess, sys, time
me, other, repo = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
(repo / f"{me}.txt").write_text(me)
subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                "commit", "-qm", me], check=True)
flags = pathlib.Path(os.environ["FORGE_WORKDIR"]) / "committed"
flags.mkdir(exist_ok=True)
(flags / me).touch()
end = time.monotonic() + 30
while not (flags / other).exists() and time.monotonic() < end:
    time.sleep(0.01)
seen = (repo / f"{other}.txt").exists()
print('{"saw_other": %d, "overlapped": %d}' % (seen, (flags / other).exists()))
'''


def _graph(tmp_path):
    (tmp_path / "w.py").write_text(WRITER)
    g = tmp_path / "g.yaml"
    g.write_text("""name: shared
nodes:
  - {id: repo-a, kind: repo, member: kernels, path: repos/a}
  - {id: repo-b, kind: repo, member: kernels, path: repos/b}
  - id: task-a
    type: kernel
    work:
      argv: ['{python}', '{graph_dir}/w.py', a, b, '{workdir}/repos/a']
      verify: [{name: isolated, metric: saw_other, at_most: 0},
               {name: parallel, metric: overlapped, at_least: 1}]
  - id: task-b
    type: kernel
    work:
      argv: ['{python}', '{graph_dir}/w.py', b, a, '{workdir}/repos/b']
      verify: [{name: isolated, metric: saw_other, at_most: 0},
               {name: parallel, metric: overlapped, at_least: 1}]
edges:
  - {from: task-a, to: repo-a, kind: state, access: write}
  - {from: task-b, to: repo-b, kind: state, access: write}
""")
    return g


def test_member_repo_nodes_are_pinned_worktrees_isolated_in_parallel(tmp_path, workspace):
    remote = make_remote(tmp_path, "kernels", {"k.c": "int k;\n"})
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "kernels", "url": str(remote)}]))
    mono = rc.open_monorepo(workspace)
    pinned = head(mono.member_dir("kernels"))
    define_graph(workspace, _graph(tmp_path))
    s = run_graph(workspace, "shared", jobs=2)
    assert s.outcome == "completed"
    v = load_graph(workspace.ledger, "shared")
    assert {n.id: n.state for n in v.tasks()} == {"task-a": "delivered", "task-b": "delivered"}
    started = [r.event for r in workspace.ledger.stream(graph_stream("shared"))
               if r.event.TYPE == "GraphRunStarted"]
    snap = read_repo_history(workspace.ledger).snapshots[started[0].repo_snapshot]
    assert next(m for m in snap.members if m.name == "kernels").commit == pinned
    work = workspace.home / "graphs" / "shared" / "work" / "repos"
    for me, other in (("a", "b"), ("b", "a")):
        d = work / me
        assert (d / f"{me}.txt").exists() and not (d / f"{other}.txt").exists()
        branch = subprocess.run(["git", "-C", str(d), "branch", "--show-current"],
                                capture_output=True, text=True, check=True).stdout.strip()
        assert branch == f"forge/graph/shared/repo-{me}"
        # Each branch starts at the pinned commit and holds only its own task's commit.
        log = subprocess.run(["git", "-C", str(d), "log", "--format=%s", f"{pinned}..HEAD"],
                             capture_output=True, text=True, check=True).stdout.split()
        assert log == [me]
    # The member's own checkout in the root is untouched.
    assert head(mono.member_dir("kernels")) == pinned
    assert not (mono.member_dir("kernels") / "a.txt").exists()


def test_a_member_node_without_a_monorepo_is_refused_before_anything_is_recorded(
        tmp_path, workspace):
    define_graph(workspace, _graph(tmp_path))
    before = workspace.ledger.version(graph_stream("shared"))
    with pytest.raises(HarnessError, match="repos init"):
        run_graph(workspace, "shared", jobs=1)
    assert workspace.ledger.version(graph_stream("shared")) == before
