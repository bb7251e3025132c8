"""Task graph semantics: spec errors, ready/blocked, verified handoffs, rework."""

from __future__ import annotations

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.graph.commands import (
    add_edge,
    add_node,
    define_graph,
    hand_off,
    handoff_events,
    invalidate,
    request_rework,
)
from infer_forge.ledger import events as E
from infer_forge.ledger.graphspec import GraphSpecError, load_graph_spec, parse_graph_spec
from infer_forge.ledger.streams import graph_stream
from infer_forge.projections.graph import (
    fold,
    load_graph,
    rework_plan,
)
from infer_forge.projections.graph_views import page_markdown, to_dot, to_mermaid, tree_lines

from tests.conftest import run_forge

WORK = {"sh": "true", "verify": [{"name": "ok", "sh": "true"}]}


def task(nid: str, **kw) -> dict:
    return {"id": nid, "type": kw.pop("type", "kernel"), "work": WORK, **kw}


def spec(nodes: list, edges: list, name: str = "g") -> dict:
    return {"name": name, "nodes": [task(n) if isinstance(n, str) else n for n in nodes],
            "edges": [dict(zip(("from", "to", "kind"), e[:3], strict=True), **(e[3] if len(e) > 3
                                                                                else {}))
                      for e in edges]}


def view_of(data: dict):
    s = parse_graph_spec(data)
    evs = [E.GraphDefined(graph_id=s.name, spec_hash=s.spec_hash())]
    evs += [E.NodeAdded(node=n.model_dump(mode="json")) for n in s.nodes]
    evs += [E.EdgeAdded(edge=e.dump()) for e in s.edges]
    return fold(evs)


def deliver(view, node: str) -> None:
    """Run `node` through claim, passing verification and the real handoff gate."""
    attempt = view.nodes[node].attempt + 1
    view.apply(E.NodeStarted(node=node, attempt=attempt, run_id="r", worker="t", pid=1))
    view.apply(E.NodeVerified(node=node, attempt=attempt, passed=True))
    delivered, refused = handoff_events(view, node, attempt)
    assert not refused
    for ev in delivered:
        view.apply(ev)
    view.apply(E.NodeDelivered(node=node, attempt=attempt))


def write_yaml(tmp_path, text: str, name: str = "g.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# --- spec errors --------------------------------------------------------------------------

YAML_HEAD = """name: g
nodes:
  - {id: a, type: kernel, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
  - {id: b, type: evaluation, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
  - {id: c, type: diagnosis, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
edges:
"""


def test_cycle_in_yaml_is_named(tmp_path):
    p = write_yaml(tmp_path, YAML_HEAD + """  - {from: a, to: b, kind: handoff}
  - {from: b, to: c, kind: handoff}
  - {from: c, to: a, kind: control}
""")
    with pytest.raises(GraphSpecError) as e:
        load_graph_spec(p)
    msg = str(e.value)
    assert "cycle" in msg and "a -> b -> c -> a" in msg and str(p) in msg
    assert "\n" not in msg


def test_state_edges_may_close_a_loop(tmp_path):
    # Only gating edges (handoff, control/start) make a cycle that can never run.
    p = write_yaml(tmp_path, YAML_HEAD + """  - {from: a, to: b, kind: handoff}
  - {from: b, to: a, kind: state}
  - {from: b, to: a, kind: control, action: rework}
""")
    assert len(load_graph_spec(p).edges) == 3


def test_dangling_edge_in_yaml_is_named(tmp_path):
    p = write_yaml(tmp_path, YAML_HEAD + "  - {from: a, to: zz, kind: handoff}\n")
    with pytest.raises(GraphSpecError, match=r"edges\[0\] \(a -> zz, handoff\): unknown node 'zz'"):
        load_graph_spec(p)


@pytest.mark.parametrize("bad, match", [
    ({"id": "a", "type": "cooking", "work": WORK}, r"nodes\[0\] \(a\).*type 'cooking'"),
    ({"id": "a", "type": "kernel"}, r"nodes\[0\] \(a\).*needs work"),
    ({"id": "a", "type": "kernel", "work": {"sh": "x", "verify": []}}, r"verify"),
    ({"id": "A b", "type": "kernel", "work": WORK}, r"node id 'A b'"),
])
def test_bad_nodes_are_named(bad, match):
    with pytest.raises(GraphSpecError, match=match):
        parse_graph_spec({"name": "g", "nodes": [bad]})


def test_a_node_takes_every_task_type_a_task_file_takes():
    from infer_forge.ledger.specs import TASK_TYPES

    spec = parse_graph_spec({"name": "g", "nodes": [
        {"id": f"n{i}", "type": t, "work": WORK} for i, t in enumerate(TASK_TYPES)]})
    assert [n.type for n in spec.nodes] == list(TASK_TYPES)
    assert {"quantization", "moe-backend", "scheduler", "profiling"} <= set(TASK_TYPES)


def test_edge_kind_rules():
    sysnode = {"id": "prod", "kind": "system"}
    with pytest.raises(GraphSpecError, match="read-only"):
        parse_graph_spec(spec(["a", sysnode], [("a", "prod", "state")]))
    with pytest.raises(GraphSpecError, match="handoff edges join two task nodes"):
        parse_graph_spec(spec(["a", sysnode], [("prod", "a", "handoff")]))
    with pytest.raises(GraphSpecError, match="duplicate node id 'a'"):
        parse_graph_spec(spec(["a", "a"], []))
    with pytest.raises(GraphSpecError, match="duplicate edge"):
        parse_graph_spec(spec(["a", "b"], [("a", "b", "handoff"), ("a", "b", "handoff")]))


def test_cli_graph_new_names_the_cycle(tmp_path, forge_home):
    p = write_yaml(tmp_path, YAML_HEAD + """  - {from: a, to: b, kind: handoff}
  - {from: b, to: a, kind: handoff}
""")
    assert run_forge("init").returncode == 0
    r = run_forge("graph", "new", str(p))
    assert r.returncode != 0
    assert "a -> b -> a" in r.stderr and "Traceback" not in r.stderr


# --- ready / blocked ----------------------------------------------------------------------


def test_chain_ready_and_blocked():
    v = view_of(spec(["a", "b", "c"], [("a", "b", "handoff"), ("b", "c", "handoff")]))
    assert v.ready() == ["a"]
    assert set(v.blocked()) == {"b", "c"}
    assert "from a (pending)" in v.blocked()["b"][0]
    deliver(v, "a")
    assert v.ready() == ["b"]
    assert v.edges["a->b:handoff"].delivered
    deliver(v, "b")
    deliver(v, "c")
    assert v.finished() and v.counts()["delivered"] == 3


def test_only_handoff_and_control_start_gate():
    v = view_of(spec(["a", "b", "c", "d", "e"], [
        ("a", "b", "state"), ("a", "c", "control", {"action": "start"}),
        ("a", "d", "control", {"action": "stop"}), ("a", "e", "control", {"action": "rework"})]))
    assert v.ready() == ["a", "b", "d", "e"] or set(v.ready()) == {"a", "b", "d", "e"}
    assert list(v.blocked()) == ["c"]
    assert "control/start from a" in v.blocked()["c"][0]


def test_diamond_waits_for_both_and_names_the_missing_one():
    v = view_of(spec(["a", "b", "c", "d"], [("a", "b", "handoff"), ("a", "c", "handoff"),
                                            ("b", "d", "handoff"), ("c", "d", "handoff")]))
    deliver(v, "a")
    assert set(v.ready()) == {"b", "c"}
    deliver(v, "b")
    assert "d" not in v.ready()
    why = v.blocked()["d"]
    assert len(why) == 1 and "from c" in why[0]
    deliver(v, "c")
    assert v.ready() == ["d"]


def test_rejected_upstream_blocks_with_its_reason_and_repo_nodes_never_run():
    repo = {"id": "r", "kind": "repo"}
    v = view_of(spec(["a", "b", repo], [("a", "b", "handoff"), ("r", "b", "state")]))
    v.apply(E.NodeStarted(node="a", attempt=1, run_id="r", worker="t", pid=1))
    v.apply(E.NodeRejected(node="a", attempt=1, reason="too slow on H20", evidence=["ev1"]))
    assert v.ready() == [] and v.finished()
    assert "rejected: too slow on H20" in v.blocked()["b"][0]
    assert v.nodes["r"].state == "available"
    assert v.nodes["a"].evidence == ["ev1"]


def test_critical_path_uses_weights():
    v = view_of(spec([task("a", est_s=1), task("b", est_s=5), task("c", est_s=1),
                      task("d", est_s=1)],
                     [("a", "b", "handoff"), ("a", "c", "handoff"), ("b", "d", "handoff"),
                      ("c", "d", "handoff")]))
    path, total = v.critical_path()
    assert path == ["a", "b", "d"] and total == 7
    deliver(v, "a")
    assert v.ready()[0] == "b"  # the critical branch first


def test_views_render():
    v = view_of(spec(["a", "b", {"id": "prod", "kind": "system"}],
                     [("a", "b", "handoff", {"deliverable": "lib.so"}), ("prod", "a", "state")]))
    m = to_mermaid(v)
    assert m.startswith("flowchart LR") and '-->|"lib.so"|' in m and "n_prod{{" in m
    assert 'shape=hexagon' in to_dot(v) and '"a" -> "b"' in to_dot(v)
    assert tree_lines(v)[0].startswith("a [kernel]")
    v.apply(E.NodeRejected(node="b", reason="no gain", evidence=["ev9"]))
    page = page_markdown(v)
    assert "```mermaid" in page and "- **b**: no gain (evidence: ev9)" in page


# --- verification before handoff ------------------------------------------------------------


def test_unverified_handoff_is_refused_and_recorded(workspace, tmp_path):
    p = write_yaml(tmp_path, YAML_HEAD + "  - {from: a, to: b, kind: handoff}\n")
    view, created = define_graph(workspace, p)
    assert created and define_graph(workspace, p)[1] is False  # same file: no-op
    led, stream = workspace.ledger, graph_stream("g")
    led.append(stream, [E.NodeStarted(node="a", attempt=1, run_id="r", worker="t", pid=1)])
    with pytest.raises(HarnessError, match="refused: deliverable not verified yet"):
        hand_off(workspace, "g", "a", "b")
    led.append(stream, [E.NodeVerified(node="a", attempt=1, passed=False)])
    with pytest.raises(HarnessError, match="refused: deliverable failed verification"):
        hand_off(workspace, "g", "a", "b")
    refusals = [r.event for r in led.stream(stream) if isinstance(r.event, E.HandoffRefused)]
    assert [(r.src, r.dst) for r in refusals] == [("a", "b"), ("a", "b")]
    assert "b" not in load_graph(led, "g").ready()
    led.append(stream, [E.NodeStarted(node="a", attempt=2, run_id="r", worker="t", pid=1),
                        E.NodeVerified(node="a", attempt=2, passed=True)])
    ev = hand_off(workspace, "g", "a", "b")
    assert ev.attempt == 2
    assert load_graph(led, "g").edges["a->b:handoff"].delivered


def test_handoff_refused_when_reworked_while_running():
    v = view_of(spec(["a", "b"], [("a", "b", "handoff")]))
    v.apply(E.NodeStarted(node="a", attempt=1, run_id="r", worker="t", pid=1))
    v.apply(E.NodeVerified(node="a", attempt=1, passed=True))
    v.apply(E.ReworkRequested(node="a", origin="a", reason="inputs changed", path=["a"]))
    delivered, refused = handoff_events(v, "a", 1)
    assert not delivered and "rework was requested" in refused[0].reason


# --- rework -----------------------------------------------------------------------------------


def test_rework_chain_from_the_middle(workspace, tmp_path):
    p = write_yaml(tmp_path, YAML_HEAD + """  - {from: a, to: b, kind: handoff}
  - {from: b, to: c, kind: handoff}
""")
    define_graph(workspace, p)
    led, stream = workspace.ledger, graph_stream("g")
    v = load_graph(led, "g")
    for n in "abc":
        before = v.version
        deliver(v, n)
        # persist what `deliver` applied, as the runner would have written it
        evs = [E.NodeStarted(node=n, attempt=1, run_id="r", worker="t", pid=1),
               E.NodeVerified(node=n, attempt=1, passed=True)]
        evs += [E.HandoffDelivered(edge=e, src=n, dst=e.split("->")[1].split(":")[0], attempt=1)
                for e in v.edges if e.startswith(f"{n}->")]
        evs.append(E.NodeDelivered(node=n, attempt=1))
        led.append(stream, evs, expected_version=before)
    plan = request_rework(workspace, "g", "b", "wrong epsilon")
    assert plan == {"b": ["b"], "c": ["b", "c"]}
    v = load_graph(led, "g")
    assert [v.nodes[n].state for n in "abc"] == ["delivered", "needs-rework", "needs-rework"]
    assert v.nodes["c"].reason == "wrong epsilon" and v.nodes["c"].rework_path == ["b", "c"]
    assert v.ready() == ["b"]  # a's handoff still stands; c waits for b again
    assert not v.edges["b->c:handoff"].delivered
    reqs = [r.event for r in led.stream(stream) if isinstance(r.event, E.ReworkRequested)]
    assert {(r.node, r.origin, tuple(r.path)) for r in reqs} == {("b", "b", ("b",)),
                                                                ("c", "b", ("b", "c"))}


def test_rework_diamond_stops_at_the_right_nodes():
    repo = {"id": "repo", "kind": "repo"}
    v = view_of(spec(["a", "b", "c", "d", "e", "f", "g", "h", repo], [
        ("a", "b", "handoff"), ("a", "c", "handoff"), ("b", "d", "handoff"),
        ("c", "d", "handoff"),
        ("d", "f", "handoff"), ("g", "f", "handoff"),   # f never ran (g pending)
        ("e", "d", "control", {"action": "start"}),     # e is upstream only
        ("c", "repo", "state", {"access": "write"}), ("repo", "h", "state"),
    ]))
    for n in ("a", "e", "b", "c", "d", "h"):
        deliver(v, n)
    plan = rework_plan(v, "a")
    assert set(plan) == {"a", "b", "c", "d", "h"}
    assert plan["d"] in (["a", "b", "d"], ["a", "c", "d"])
    assert plan["h"] == ["a", "c", "repo", "h"]  # carried through the shared repo
    assert "f" not in plan and "e" not in plan and "g" not in plan
    # a rejected node stops propagation through it
    v.apply(E.NodeRejected(node="c", attempt=1, reason="dropped"))
    plan = rework_plan(v, "a")
    assert "c" not in plan and "h" not in plan and plan["d"] == ["a", "b", "d"]


def test_control_rework_edge_carries_rework_start_does_not():
    v = view_of(spec(["a", "b", "c"], [("a", "b", "control", {"action": "rework"}),
                                       ("a", "c", "control", {"action": "start"})]))
    for n in "abc":
        deliver(v, n)
    assert set(rework_plan(v, "a")) == {"a", "b"}


def test_invalidate_records_evidence_and_reworked_nodes_wait_for_the_path(workspace, tmp_path):
    p = write_yaml(tmp_path, YAML_HEAD + """  - {from: a, to: b, kind: state}
  - {from: b, to: c, kind: handoff}
""")
    define_graph(workspace, p)
    led, stream = workspace.ledger, graph_stream("g")
    for n in "abc":
        led.append(stream, [E.NodeStarted(node=n, attempt=1, run_id="r", worker="t", pid=1),
                            E.NodeVerified(node=n, attempt=1, passed=True),
                            *([E.HandoffDelivered(edge="b->c:handoff", src="b", dst="c",
                                                  attempt=1)] if n == "b" else []),
                            E.NodeDelivered(node=n, attempt=1)])
    plan = invalidate(workspace, "g", "a", "measured on the wrong image", ["sha256:" + "0" * 64])
    assert plan == {"a": ["a"], "b": ["a", "b"], "c": ["a", "b", "c"]}
    evs = [r.event for r in led.stream(stream)]
    inv = [e for e in evs if isinstance(e, E.DeliverableInvalidated)]
    assert inv and inv[0].evidence == ["sha256:" + "0" * 64]
    assert {e.trigger for e in evs if isinstance(e, E.ReworkRequested)} == {"invalidate"}
    v = load_graph(led, "g")
    # b reads a over a (non-gating) state edge, yet waits for a's re-delivery
    assert v.ready() == ["a"]
    assert "waits for rework of a" in v.blocked()["b"][0]


def test_add_node_and_edge_evolve_the_graph(workspace, tmp_path):
    p = write_yaml(tmp_path, YAML_HEAD + "  - {from: a, to: b, kind: handoff}\n")
    define_graph(workspace, p)
    add_node(workspace, "g", task("d", type="evaluation"), reason="new evidence")
    v = add_edge(workspace, "g", {"from": "b", "to": "d", "kind": "handoff"})
    assert "d" in v.nodes and "b->d:handoff" in v.edges
    with pytest.raises(GraphSpecError, match="cycle.*d -> a"):
        add_edge(workspace, "g", {"from": "d", "to": "a", "kind": "control"})
    with pytest.raises(GraphSpecError, match="unknown node 'zz'"):
        add_edge(workspace, "g", {"from": "d", "to": "zz", "kind": "handoff"})
    with pytest.raises(GraphSpecError, match="duplicate node id 'd'"):
        add_node(workspace, "g", task("d"))
    added = [r.event for r in workspace.ledger.stream(graph_stream("g"))
             if isinstance(r.event, E.NodeAdded)]
    assert added[-1].reason == "new evidence"


def test_cli_graph_commands(tmp_path, forge_home):
    import json

    p = write_yaml(tmp_path, YAML_HEAD + "  - {from: a, to: b, kind: handoff, deliverable: lib}\n")
    assert run_forge("init").returncode == 0
    r = run_forge("graph", "new", str(p))
    assert r.returncode == 0 and "graph g defined: 3 tasks" in r.stdout
    r = run_forge("graph", "add-node", "--id", "d", "--type", "evaluation", "--sh", "true",
                  "--verify", "true", "--reason", "a new check")
    assert r.returncode == 0, r.stderr
    assert run_forge("graph", "add-edge", "b", "d", "--kind", "handoff").returncode == 0
    r = run_forge("graph", "add-edge", "d", "a", "--kind", "handoff")
    assert r.returncode != 0 and "a -> b -> d -> a" in r.stderr
    r = run_forge("graph", "handoff", "a", "b")
    assert r.returncode != 0 and "refused: source is pending, not verified" in r.stderr
    assert run_forge("graph", "reject", "c", "--reason", "not needed",
                     "--evidence", "ev-1").returncode == 0
    data = json.loads(run_forge("graph", "show", "--json").stdout)
    assert data["ready"] == ["a"] and data["counts"]["rejected"] == 1
    assert "d" in data["blocked"] and data["critical_path"][0] == "a"
    rows = {row["id"]: row for row in data["rows"]}
    assert rows["c"]["evidence"] == ["ev-1"] and rows["c"]["why"] == "not needed"
    tree = run_forge("graph", "show", "--tree").stdout
    assert "└─ b [evaluation] pending" in tree
    r = run_forge("graph", "rework", "a", "--reason", "redo", "--json")
    assert json.loads(r.stdout) == {"a": ["a"]}
