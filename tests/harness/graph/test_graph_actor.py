"""Who ran a graph: the person who starts `forge graph run` (`--by`, else the OS user) is the
actor of the run's GraphRunStarted and is named (`on_behalf_of`) on every node the graph
runner claims for that run; NodeStarted v1 payloads upcast. Real CLI, real ledger, a real
two-node graph."""

from __future__ import annotations

import getpass
import json

import orjson
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.graph import load_graph

from tests.conftest import run_forge

GRAPH = """\
name: pair
nodes:
  - id: first
    type: evaluation
    work:
      argv: ['{python}', '-c', 'import json; print(json.dumps(dict(value=1)))']
      verify:
        - {name: value, metric: value, at_least: 1}
  - id: second
    type: evaluation
    work:
      argv: ['{python}', '-c', 'import json; print(json.dumps(dict(value=2)))']
      verify:
        - {name: value, metric: value, at_least: 1}
edges:
  - {from: first, to: second, kind: control}
"""


def _graph_events(home, graph_id: str = "pair") -> list[E.Event]:
    ws, _ = init_workspace(home)
    with ws:
        return [r.event for r in ws.ledger.stream(f"graph:{graph_id}")]


def test_the_person_who_runs_a_graph_is_recorded(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    (tmp_path / "pair.yaml").write_text(GRAPH)
    assert run_forge("graph", "new", str(tmp_path / "pair.yaml")).returncode == 0
    r = run_forge("graph", "run", "-j", "1", "--by", "ana", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    evs = _graph_events(forge_home)
    (started,) = [e for e in evs if isinstance(e, E.GraphRunStarted)]
    assert started.actor == E.Actor.human("ana")
    claims = [e for e in evs if isinstance(e, E.NodeStarted)]
    assert sorted(e.node for e in claims) == ["first", "second"]
    for e in claims:  # the runner did the work, on ana's behalf
        assert e.actor == E.Actor.tool("graph-runner") and e.on_behalf_of == "ana"
        assert e.run_id == started.run_id
    ws, _ = init_workspace(forge_home)
    with ws:
        assert [r.started_by for r in load_graph(ws.ledger, "pair").runs] == ["ana"]
    p = run_forge("sql", "SELECT actor_kind, actor_name FROM events "
                  "WHERE type = 'GraphRunStarted'", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [{"actor_kind": "human", "actor_name": "ana"}]


def test_without_by_the_os_user_runs_it(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    (tmp_path / "pair.yaml").write_text(GRAPH)
    assert run_forge("graph", "new", str(tmp_path / "pair.yaml")).returncode == 0
    r = run_forge("graph", "run", "-j", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    evs = _graph_events(forge_home)
    (started,) = [e for e in evs if isinstance(e, E.GraphRunStarted)]
    me = getpass.getuser()
    assert started.actor == E.Actor.human(me)
    assert {e.on_behalf_of for e in evs if isinstance(e, E.NodeStarted)} == {me}


def test_a_v1_node_claim_reads_with_no_person():
    v1 = {"node": "n", "attempt": 1, "run_id": "r", "worker": "w0", "pid": 7,
          "event_id": "5b0c3f0e-9d1f-4f5e-8a53-2a4a3b0b6c11",
          "occurred_at": "2026-12-01T10:00:00+00:00",
          "actor": {"kind": "tool", "name": "graph-runner", "model": None}, "_v": 1}
    ev = codec.decode("graph:g", 1, "NodeStarted", orjson.dumps(v1))
    assert isinstance(ev, E.NodeStarted) and ev.on_behalf_of is None and ev.node == "n"
    assert E.NodeStarted.SCHEMA_VERSION == 2
