"""Typed payloads: gate results are one type (`ledger.payloads.GateResult`) whoever writes
them, and events stored before it (the loop's and the graph's shapes, schema v1 and v2)
are upcast on read: they decode, replay, fold into Task Memory, index and build the wiki."""

from __future__ import annotations

import orjson
import pytest
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import CorruptEventError
from infer_forge.ledger.payloads import GateResult, gates_from_stored
from infer_forge.ledger.replay import replay_task
from infer_forge.ledger.streams import graph_stream, task_stream
from infer_forge.projections import index as I
from infer_forge.projections.memory import read_memory
from infer_forge.wiki import build as B

from tests.conftest import insert_raw_event
from tests.helpers.index_ledger import build as build_ledger

# What the loop stored (GateResult.to_dict of the old dataclass: None fields left out).
LOOP_GATE = {"name": "throughput", "kind": "relative", "verdict": "fail",
             "reason": "output_throughput ratio 0.91 needs >= 1.05",
             "metric": "output_throughput", "threshold": 1.05, "direction": "at_least", "n": 3,
             "median": 412.5, "baseline_median": 453.0, "ratio": 0.91, "ci": [0.88, 0.94],
             "failed_runs": 0, "failed_requests": 0.0, "samples": [410.0, 412.5, 415.0]}
# What graph node work stored: a command check, a metric check with two bounds, a loop task.
GRAPH_CHECKS = [
    {"name": "unit", "passed": True, "detail": "exit 0"},
    {"name": "acc", "passed": False, "metric": "err", "value": 0.5, "at_least": 0.0,
     "at_most": 0.01},
    {"name": "task-loop", "passed": True, "task": "g.tune.a1", "blocks": 3,
     "detail": "done delivered: ok"},
    {"name": "deliverables", "passed": False, "detail": "missing: out.bin"},
]


def _old_verification(task_id: str, block_id: str, gates: list, version: int) -> bytes:
    """A VerificationRecorded as stored at schema `version` (1: no steps; 2: steps)."""
    ev = E.VerificationRecorded(contract_hash="sha256:c", passed=False, verdict="fail",
                                task_id=task_id, block_id=block_id)
    payload = ev.model_dump(mode="json")
    payload["gates"] = gates
    if version == 1:
        del payload["steps"]
    return orjson.dumps({**payload, "_v": version})


def test_both_old_shapes_become_one_type():
    loop = gates_from_stored([LOOP_GATE])
    (g,) = [GateResult.model_validate(x) for x in loop]
    assert g == GateResult.judged("fail", **{k: v for k, v in LOOP_GATE.items()
                                             if k != "verdict"})
    assert not g.passed and g.to_dict() == {**LOOP_GATE, "passed": False}
    graph = [GateResult.model_validate(x) for x in gates_from_stored(GRAPH_CHECKS)]
    assert [(x.name, x.kind, x.verdict, x.passed) for x in graph] == [
        ("unit", "command", "pass", True), ("acc", "metric", "fail", False),
        ("acc", "metric", "fail", False), ("task-loop", "task-loop", "pass", True),
        ("deliverables", "deliverables", "fail", False)]
    low, high = graph[1], graph[2]  # one result per bound
    assert (low.direction, low.threshold, high.direction, high.threshold) == (
        "at_least", 0.0, "at_most", 0.01)
    assert low.median == high.median == 0.5 and low.n == 1
    assert graph[0].reason == "exit 0" and graph[4].reason == "missing: out.bin"
    assert graph[4].task is None and graph[4].threshold is None
    assert graph[3].task == "g.tune.a1" and graph[3].n == 3


@pytest.mark.parametrize("bad", [["not a gate"], [{"passed": True}], {"name": "x"}])
def test_an_old_gate_that_is_no_gate_is_a_corrupt_event(bad):
    state = _old_verification("t1", "b1", bad, 1)
    with pytest.raises(CorruptEventError) as e:
        codec.decode("task:t1", 5, "VerificationRecorded", state)
    msg = str(e.value)
    assert "stream 'task:t1' version 5" in msg and "upcasting VerificationRecorded v2" in msg
    assert "\n" not in msg


def test_a_gate_result_refuses_other_shapes():
    for bad in ({"name": "x", "kind": "absolute", "verdict": "maybe", "passed": False},
                {"name": "x", "kind": "absolute", "verdict": "pass", "passed": True,
                 "observed": 1.0},  # the guessed keys of old readers are not fields
                {"name": "x", "kind": "guess", "verdict": "pass", "passed": True}):
        with pytest.raises(ValueError):
            E.VerificationRecorded(contract_hash="c", passed=True, verdict="pass",
                                   gates=[bad])


def test_planted_old_rows_decode_replay_index_and_build_the_wiki(workspace):
    ws = workspace
    build_ledger(ws)
    tid, bid = "tune-tiny-cpu", "b2"
    stream = task_stream(tid)
    v = ws.ledger.version(stream)
    before = replay_task(ws.ledger, tid)
    # The old shapes, each at the schema version that wrote it.
    insert_raw_event(ws.home, stream, v + 1, "VerificationRecorded",
                     _old_verification(tid, bid, [LOOP_GATE], 1))
    insert_raw_event(ws.home, stream, v + 2, "VerificationRecorded",
                     _old_verification(tid, bid, GRAPH_CHECKS, 2))
    # Decode: typed gates, current schema.
    recs = ws.ledger.stream(stream)[-2:]
    loop_v, graph_v = (r.event for r in recs)
    assert all(isinstance(g, GateResult) for g in [*loop_v.gates, *graph_v.gates])
    assert loop_v.gates[0].median == 412.5 and loop_v.steps == []
    assert [g.kind for g in graph_v.gates] == ["command", "metric", "metric", "task-loop",
                                               "deliverables"]
    # Replay (the fast path hands these to decode) and Task Memory fold them.
    after = replay_task(ws.ledger, tid)
    assert after.version == before.version + 2
    assert after.block(bid).verifications[-2:] == ["fail", "fail"]
    mem, version = read_memory(ws.ledger, tid)
    assert version == v + 2
    gates = mem.block(bid).verification["gates"]
    assert gates[1] == {"name": "acc", "kind": "metric", "verdict": "fail", "passed": False,
                        "reason": "", "metric": "err", "threshold": 0.0,
                        "direction": "at_least", "n": 1, "median": 0.5, "failed_runs": 0,
                        "failed_requests": 0.0, "samples": [0.5]}
    # The index reads the typed fields: observed is the median, the threshold, the reason.
    with I.open_index(ws) as s:
        assert s.con.execute("SELECT count(*) FROM skipped").fetchone() == (0,)
        rows = s.con.execute(
            "SELECT gate, metric, verdict, observed, threshold, baseline, reason "
            "FROM gate_verdicts WHERE task_id = ? AND block_id = ? ORDER BY position, gate, "
            "threshold", [tid, bid]).fetchall()
    assert ("throughput", "output_throughput", "fail", 412.5, 1.05, 453.0,
            LOOP_GATE["reason"]) in rows
    assert ("acc", "err", "fail", 0.5, 0.0, None, "") in rows
    assert ("acc", "err", "fail", 0.5, 0.01, None, "") in rows
    assert ("unit", None, "pass", None, None, None, "exit 0") in rows
    # The wiki's task page shows them.
    B.build(ws, embeddings=False)
    page = (ws.home / "wiki" / "tasks" / f"{tid}.md").read_text()
    # (numbers by unit, a relative threshold against the baseline: wiki/numbers.py)
    assert ("| b2 | fail | throughput | output_throughput | fail | 412 tok/s | 1.05× baseline | "
            "output_throughput ratio 0.91 needs >= 1.05 |") in page
    assert "| b2 | fail | deliverables |  | fail | — | — | missing: out.bin |" in page


def test_planted_old_node_verified_decodes_typed(workspace):
    ws = workspace
    gs = graph_stream("g1")
    ws.ledger.append(gs, [E.GraphDefined(graph_id="g1", spec_hash="h")])
    ev = E.NodeVerified(node="a", attempt=1, passed=False)
    payload = {**ev.model_dump(mode="json"), "checks": GRAPH_CHECKS, "_v": 1}
    insert_raw_event(ws.home, gs, 2, "NodeVerified", orjson.dumps(payload))
    got = ws.ledger.stream(gs)[-1].event
    assert [(c.name, c.passed) for c in got.checks] == [
        ("unit", True), ("acc", False), ("acc", False), ("task-loop", True),
        ("deliverables", False)]


def test_new_gates_take_the_fast_replay_path():
    """A current VerificationRecorded (nested GateResult models) passes the codec's strict
    check, so replay folds it without building objects; an old one goes to decode."""
    g = GateResult.judged("pass", name="t", kind="absolute", metric="m", median=1.0,
                          threshold=0.5, direction="at_least", n=1, samples=[1.0], ci=[0.9, 1.1])
    ev = E.VerificationRecorded(contract_hash="c", passed=True, verdict="pass", gates=[g],
                                task_id="t1", block_id="b1")
    state = codec.encode("task:t1", 1, ev, None).state
    assert codec.load_current("VerificationRecorded", state) is not None
    assert codec.load_current("VerificationRecorded", _old_verification("t1", "b1",
                                                                       [LOOP_GATE], 2)) is None
