"""One owner per task stream (issue 27, item 5): a graph's node never takes over a standalone
task whose id its naming produces (`<graph>.<node>`, `<graph>.<node>.a<n>`), and a standalone
definition never enters a graph's namespace. Checked at every entry: task new, graph new and
add-node, a run's start, a node's start, a loop node's task."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.graph.commands import define_graph
from infer_forge.harness.graph.run import run_graph
from infer_forge.harness.loop.define import define_task
from infer_forge.ledger import events as E
from infer_forge.ledger.ids import graph_namespace
from infer_forge.ledger.streams import graph_stream, task_stream
from infer_forge.projections.graph import load_graph

from tests.conftest import run_forge

from ..loop.test_loop import make_task_dir
from .test_graph_run import define_loop_graph

GRAPH = """name: gy
nodes:
  - {id: n, type: evaluation, work: {sh: "echo ran > ran-n", verify: [{name: ok, sh: "true"}]}}
"""


def graph_file(tmp_path: Path) -> Path:
    p = tmp_path / "gy.yaml"
    p.write_text(GRAPH)
    return p


def test_graph_namespace_names_the_node_a_task_id_belongs_to():
    assert graph_namespace("gy.n") == ("gy", "n")
    assert graph_namespace("gy.n.a12") == ("gy", "n")
    assert graph_namespace("gy") is None and graph_namespace("gy.n.b1") is None
    assert graph_namespace("a.b.c") is None and graph_namespace("gy.n.a0") is None


def test_manual_task_first_then_graph_node_is_refused_and_the_task_untouched(tmp_path,
                                                                           forge_home):
    assert run_forge("init").returncode == 0
    task = make_task_dir(tmp_path / "specs", "gy.n")
    r = run_forge("task", "new", str(task))
    assert r.returncode == 0, r.stderr
    r = run_forge("graph", "new", str(graph_file(tmp_path)))
    assert r.returncode != 0
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "'gy.n' is already defined outside the graph" in err, err
    from infer_forge.ledger.workspace import open_workspace

    ws = open_workspace(forge_home)
    try:
        assert ws.ledger.version(graph_stream("gy")) == 0  # nothing recorded for the graph
        assert [x.type for x in ws.ledger.stream(task_stream("gy.n"))] == ["TaskDefined"]
    finally:
        ws.close()


def test_a_run_refuses_a_node_stream_a_standalone_task_holds(tmp_path, workspace):
    """A ledger where both exist (written before the rule): the run refuses before it
    records anything, and the standalone task gets nothing."""
    define_graph(workspace, graph_file(tmp_path))
    manual = E.TaskDefined(title="manual", task_type="evaluation", goal="mine",
                           definition={"goal": "mine"}, definition_hash="h", task_id="gy.n",
                           actor=E.Actor.human("alice"))
    workspace.ledger.append(task_stream("gy.n"), [manual], expected_version=0)
    before = workspace.ledger.version(graph_stream("gy"))
    with pytest.raises(HarnessError, match="'gy.n' is already defined outside the graph"):
        run_graph(workspace, "gy", jobs=1)
    assert workspace.ledger.version(graph_stream("gy")) == before  # no run recorded
    assert workspace.ledger.version(task_stream("gy.n")) == 1
    assert not (workspace.home / "graphs" / "gy" / "work" / "ran-n").exists()


def test_graph_first_then_a_manual_task_in_its_namespace_is_refused(tmp_path, forge_home):
    assert run_forge("init").returncode == 0
    assert run_forge("graph", "new", str(graph_file(tmp_path))).returncode == 0
    for tid in ("gy.n", "gy.n.a1", "gy.later"):  # its nodes, their loop tasks, nodes to come
        r = run_forge("task", "new", str(make_task_dir(tmp_path / tid, tid)))
        assert r.returncode != 0
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"task id '{tid}' belongs to graph 'gy'" in err, err
    # Outside any defined graph's namespace a dotted id stays a standalone task.
    r = run_forge("task", "new", str(make_task_dir(tmp_path / "other", "other.n")))
    assert r.returncode == 0, r.stderr
    # The graph runs its node on its own stream, and the graph's node is delivered.
    r = run_forge("graph", "run", "--graph", "gy", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    from infer_forge.ledger.workspace import open_workspace

    ws = open_workspace(forge_home)
    try:
        assert ws.ledger.version(task_stream("gy.n.a1")) == 0
        assert load_graph(ws.ledger, "gy").nodes["n"].state == "delivered"
    finally:
        ws.close()


def test_a_loop_node_does_not_take_over_a_standalone_attempt_task(tmp_path, workspace,
                                                                   monkeypatch):
    """`lg.tune.a1` defined standalone before graph `lg`, with the very content the node will
    define (before, that definition was "already there" and the graph ran the standalone
    task as its own). The graph's definition checks its nodes' streams, not every attempt's:
    the node's loop entry refuses it, the node is rejected with the reason, and the
    standalone task is untouched."""
    from . import test_graph_run

    monkeypatch.setattr(test_graph_run, "define_graph", lambda ws, p: None)
    define_loop_graph(tmp_path, workspace)  # its files only
    text = (tmp_path / "tune.yaml").read_text().replace("id: ignored", "id: lg.tune.a1")
    text = text.replace("{python}", sys.executable).replace("{graph_dir}", str(tmp_path))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tune.yaml").write_text(text)
    define_task(workspace, tmp_path / "mine" / "tune.yaml")
    define_graph(workspace, tmp_path / "g.yaml")
    s = run_graph(workspace, "lg", jobs=1)
    tune = load_graph(workspace.ledger, "lg").nodes["tune"]
    assert tune.state == "rejected", s
    assert "'lg.tune.a1' is already defined outside the graph" in tune.reason
    assert [x.type for x in workspace.ledger.stream(task_stream("lg.tune.a1"))] == [
        "TaskDefined"]
