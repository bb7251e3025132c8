"""Topology and parallelism as candidate dimensions: a candidate applied to a point is a new
whole point (validated), impossible combinations are refused naming the dimension, and what a
candidate changed is stated dimension by dimension (ledger/candidates.py)."""

from __future__ import annotations

import pytest
from infer_forge.ledger.candidates import applicable, differences, shown_differences
from infer_forge.ledger.specs import (
    SpecError,
    TaskDefinition,
    apply_candidate,
    effective_digest,
    load_point,
    load_profile,
)

from .conftest import REPO

EX = REPO / "examples"


@pytest.fixture
def qwen():
    return load_point(EX / "points/qwen-h200.yaml"), load_profile(
        EX / "profiles/qwen-h200-sglang.yaml")


def test_switch_colocated_to_pd_builds_the_roles(qwen):
    pt, pr = qwen
    p2, r2 = apply_candidate(pt, pr, {"topology.architecture": "pd", "prefill.tp": 4,
                                      "prefill.count": 2, "decode.tp": 8})
    assert p2.topology.architecture == "pd"
    roles = [(r.role, r.count, r.parallelism.tp) for r in p2.topology.roles]
    assert roles == [("prefill", 2, 4), ("decode", 1, 8)]
    assert pt.topology.architecture == "colocated" and pt.topology.roles == []  # pure
    assert r2 == pr
    # Roles not given by the candidate take the topology's parallelism, one server each.
    p3, _ = apply_candidate(pt, pr, {"topology.architecture": "pd"})
    assert [(r.role, r.count, r.parallelism.tp) for r in p3.topology.roles] == [
        ("prefill", 1, 1), ("decode", 1, 1)]


def test_switch_pd_back_to_colocated_drops_the_roles(qwen):
    pt, pr = qwen
    pd, _ = apply_candidate(pt, pr, {"topology.architecture": "pd", "decode.count": 3})
    back, _ = apply_candidate(pd, pr, {"topology.architecture": "colocated"})
    assert back.topology.architecture == "colocated" and back.topology.roles == []
    # On a PD point, role keys change the roles in place.
    pd2, _ = apply_candidate(pd, pr, {"decode.parallelism.ep": 1, "decode.count": 2})
    assert [(r.role, r.count) for r in pd2.topology.roles] == [("prefill", 1), ("decode", 2)]


@pytest.mark.parametrize("cand, problem", [
    ({"prefill.tp": 4}, "candidate prefill.tp=4: architecture colocated has no prefill role "
                        "(its roles: colocated)"),
    ({"topology.architecture": "pd", "encode.count": 1},
     "candidate encode.count=1: architecture pd has no encode role"),
    ({"topology.architecture": "pd", "prefill.speed": 2},
     "candidate prefill.speed: a role's dimensions are count, tp, pp, dp, ep"),
    ({"topology.architecture": "pd", "prefill.tp": 0},
     "topology.roles[0].parallelism.tp (prefill.tp): Input should be greater than or equal to 1"),
    ({"topology.architecture": "xpd"}, "not an architecture"),
])
def test_impossible_combinations_name_the_dimension(qwen, cand, problem):
    pt, pr = qwen
    with pytest.raises(SpecError, match="candidate") as e:
        apply_candidate(pt, pr, cand)
    assert problem in str(e.value)


def test_ambiguous_role_is_refused(qwen):
    pt, pr = qwen
    data = pt.model_dump(mode="json")
    data["topology"] = {"architecture": "pd", "roles": [
        {"role": "prefill", "parallelism": {"tp": 4}}, {"role": "prefill"}, {"role": "decode"}]}
    two = type(pt).model_validate(data)
    with pytest.raises(SpecError, match="lists 2 prefill roles"):
        apply_candidate(two, pr, {"prefill.tp": 8})
    # decode is not ambiguous
    assert apply_candidate(two, pr, {"decode.tp": 8})[0].topology.roles[2].parallelism.tp == 8


def test_applicable_drops_role_keys_of_absent_roles(qwen):
    pt, _ = qwen
    cand = {"topology.architecture": "colocated", "prefill.tp": 4, "engine.x": 1}
    assert applicable(cand, pt) == {"topology.architecture": "colocated", "engine.x": 1}
    pd = {"topology.architecture": "pd", "prefill.tp": 4}
    assert applicable(pd, pt) == pd


def test_differences_state_every_dimension(qwen):
    pt, pr = qwen
    cand = {"topology.architecture": "pd", "prefill.tp": 4, "engine.chunked_prefill_size": 4096}
    diffs = differences(pt, pr, cand)
    paths = [d["path"] for d in diffs]
    assert paths == ["engine.chunked_prefill_size", "topology.architecture",
                     "topology.roles.decode.count", "topology.roles.decode.parallelism.dp",
                     "topology.roles.decode.parallelism.ep",
                     "topology.roles.decode.parallelism.pp",
                     "topology.roles.decode.parallelism.tp",
                     "topology.roles.prefill.count", "topology.roles.prefill.parallelism.dp",
                     "topology.roles.prefill.parallelism.ep",
                     "topology.roles.prefill.parallelism.pp",
                     "topology.roles.prefill.parallelism.tp"]
    by = {d["path"]: d for d in diffs}
    assert by["topology.architecture"] == {"path": "topology.architecture",
                                           "baseline": "colocated", "candidate": "pd"}
    assert by["topology.roles.prefill.parallelism.tp"]["candidate"] == 4
    assert by["engine.chunked_prefill_size"]["baseline"] == 8192
    assert differences(pt, pr, {}) == []
    line = shown_differences(diffs, limit=2)
    assert line == ('engine.chunked_prefill_size 8192→4096, topology.architecture '
                    '"colocated"→"pd" (and 10 more)')


def test_scope_with_topology_keys_and_sweep_skips_impossible(qwen):
    from infer_forge.harness.loop.executors import SweepExecutor
    from infer_forge.projections.memory import TaskMemory

    pt, pr = qwen
    task = TaskDefinition.model_validate({
        "type": "deployment-tuning", "goal": "g", "point": "p.yaml",
        "scope": {"topology.architecture": ["colocated", "pd"], "prefill.tp": [1, 2]},
        "contract": {"gates": [{"name": "t", "metric": "output_throughput",
                                "vs_baseline": "ratio", "at_least": 1.0}]}})
    mem = TaskMemory(task_id="t")
    ex = SweepExecutor("grid")
    seen = []
    for _ in range(5):
        d = ex.decide(mem, task, pt, pr)
        if d.action == "stop":
            break
        seen.append(d.candidate)
        mem.tried.append(effective_digest(pt, pr, d.candidate))
    # colocated once (prefill.tp does not apply to it), then PD with each prefill TP
    assert seen == [{"topology.architecture": "colocated"},
                    {"topology.architecture": "pd", "prefill.tp": 1},
                    {"topology.architecture": "pd", "prefill.tp": 2}]
