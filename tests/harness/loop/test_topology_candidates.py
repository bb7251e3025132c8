"""Topology and parallelism as candidate dimensions: a candidate applied to a point is a new
whole point (validated), impossible combinations are refused naming the dimension, and what a
candidate changed is stated dimension by dimension (ledger/candidates.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from infer_forge.ledger.candidates import applicable, differences, shown_differences
from infer_forge.ledger.specs import (
    SpecError,
    TaskDefinition,
    apply_candidate,
    effective_digest,
    load_point,
    load_profile,
)

from tests.conftest import REPO

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
    # a role one side lacks is one dimension, not a None per leaf
    assert paths == ["engine.chunked_prefill_size", "topology.architecture",
                     "topology.roles.decode", "topology.roles.prefill"]
    by = {d["path"]: d for d in diffs}
    assert by["topology.architecture"] == {"path": "topology.architecture",
                                           "baseline": "colocated", "candidate": "pd"}
    assert by["topology.roles.prefill"] == {
        "path": "topology.roles.prefill", "baseline": None,
        "candidate": {"count": 1, "parallelism": {"tp": 4, "pp": 1, "dp": 1, "ep": 1}}}
    assert by["engine.chunked_prefill_size"]["baseline"] == 8192
    pd, _ = apply_candidate(pt, pr, cand)
    assert [(d["path"], d["baseline"], d["candidate"]) for d in differences(
        pd, pr, {"prefill.tp": 8, "decode.count": 2})] == [
        ("topology.roles.decode.count", 1, 2), ("topology.roles.prefill.parallelism.tp", 4, 8)]
    assert differences(pt, pr, {}) == []
    line = shown_differences(diffs, limit=2)
    assert line == ('engine.chunked_prefill_size 8192→4096, topology.architecture '
                    '"colocated"→"pd" (and 2 more)')


def _sweep(task, pt, pr, n=6):
    from infer_forge.harness.loop.executors import SweepExecutor
    from infer_forge.projections.memory import TaskMemory

    mem = TaskMemory(task_id="t")
    ex = SweepExecutor("grid")
    seen = []
    for _ in range(n):
        d = ex.decide(mem, task, pt, pr)
        if d.action == "stop":
            return seen, d.reason
        seen.append(d.candidate)
        mem.tried.append(effective_digest(pt, pr, d.candidate))
    return seen, None


def test_scope_with_topology_keys_and_sweep_skips_impossible(qwen):
    from infer_forge.harness.loop.decision import out_of_scope

    pt, pr = qwen
    task = TaskDefinition.model_validate({
        "type": "deployment-tuning", "goal": "g", "point": "p.yaml",
        "scope": {"topology.architecture": ["colocated", "pd"], "prefill.tp": [1, 2],
                  "engine.tp_size": [None]},
        "contract": {"gates": [{"name": "t", "metric": "output_throughput",
                                "vs_baseline": "ratio", "at_least": 1.0}]}})
    four = pt.model_copy(update={"accelerator": pt.accelerator.model_copy(update={"count": 4})})
    seen, reason = _sweep(task, four, pr)
    # colocated once (prefill.tp does not apply to it), then PD with each prefill TP
    assert seen == [{"topology.architecture": "colocated", "engine.tp_size": None},
                    {"topology.architecture": "pd", "prefill.tp": 1, "engine.tp_size": None},
                    {"topology.architecture": "pd", "prefill.tp": 2, "engine.tp_size": None}]
    assert reason is not None and reason.startswith("scope exhausted") and "skipped" not in reason
    # On the point's one H200, PD (two servers) does not fit: skipped, and the stop says why.
    seen, reason = _sweep(task, pt, pr)
    assert seen == [{"topology.architecture": "colocated", "engine.tp_size": None}]
    assert reason is not None and "2 impossible combinations skipped" in reason
    assert "topology.architecture=\"pd\"" in reason and "prefill" in reason
    cand = {"topology.architecture": "pd", "prefill.tp": 1, "engine.tp_size": None}
    problem = out_of_scope(task, pt, pr, cand)
    assert problem is not None and "prefill" in problem, problem
    assert out_of_scope(task, four, pr, cand) is None


# --- a candidate switching colocated -> PD, deployed and compared by the loop -------------


def _pd_task(d, fake, fake_router):
    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.yaml").write_text(yaml.safe_dump({
        "service": "stand-in", "rev": 1, "engine": "sglang",
        "config": {"launcher": fake, "router_launcher": fake_router, "startup_timeout_s": 60},
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    (d / "point.yaml").write_text(yaml.safe_dump({
        "name": "stand-in-colocated",
        "model": {"name": "tiny-llama", "source": "forge:tiny-llama", "revision": "1"},
        "scenario": {"traffic": {"input_len": 16, "output_len": 8, "concurrency": 2,
                                 "num_prompts": 4}},
        "topology": {"architecture": "colocated"},
        "runtime_profile": {"service": "stand-in", "rev": 1, "file": "profile.yaml"},
        "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}}))
    (d / "task.yaml").write_text(yaml.safe_dump({
        "id": "to-pd", "type": "deployment-tuning", "goal": "colocated or PD?",
        "point": "point.yaml", "profile": "profile.yaml",
        "scope": {"topology.architecture": ["colocated", "pd"], "prefill.tp": [1]},
        "contract": {"gates": [
            {"name": "throughput", "metric": "output_throughput", "vs_baseline": "ratio",
             "at_least": 0.01},
            {"name": "correctness", "metric": "token_match", "at_least": 0.99},
            {"name": "stability", "repeats": 2, "max_cv": 5.0, "max_failed_requests": 0}]},
        "verification": ["baseline", "measure", "gates", "decide"],
        "exit": {"when": "all_gates_pass", "max_blocks": 3, "no_progress_blocks": 3},
        "executor": {"kind": "sweep", "strategy": "grid"}}))
    return d / "task.yaml"


@pytest.mark.slow
def test_colocated_to_pd_candidate_is_deployed_and_compared(workspace, tmp_path):
    import sys

    from infer_forge.harness.loop.define import define_task
    from infer_forge.harness.loop.run import run_task
    from infer_forge.harness.models.weights import pull
    from infer_forge.ledger.streams import ENGINES_STREAM, task_stream

    from tests.conftest import run_forge

    fake = [sys.executable, str(REPO / "tests" / "data" / "sglang" / "fake_server.py")]
    router = [sys.executable, str(REPO / "harness" / "testing" / "fake_router.py")]
    pull(workspace, "tiny-llama")
    define_task(workspace, _pd_task(tmp_path / "spec", fake, router))
    result = run_task(workspace, "to-pd")
    assert result.exit_state == "delivered", (result.exit_state, result.exit_reason)
    base, cand = result.memory.execution_record[:2]
    assert base.is_baseline and cand.candidate == {"topology.architecture": "pd",
                                                   "prefill.tp": 1}
    deployed = [m["meta"]["deployment"] for m in cand.measurements]
    assert deployed[0]["architecture"] == "pd"
    assert deployed[0]["processes"] == ["prefill-0", "decode-0", "router"]
    assert base.measurements[0]["meta"]["deployment"]["processes"] == ["sglang"]
    assert all(m["success"] and m["metrics"]["completed"] == 4 for m in cand.measurements)
    # The plan went on the engines stream, naming the task and the block, before its servers.
    recs = [r.event for r in workspace.ledger.stream(ENGINES_STREAM)]
    planned = [e for e in recs if e.TYPE == "LaunchPlanned"]
    assert [(e.architecture, e.task_id, e.block_id) for e in planned] == [
        ("pd", "to-pd", cand.block_id)]
    # The comparison states every dimension that differed.
    ver = [r.event for r in workspace.ledger.stream(task_stream("to-pd"))
           if r.type == "VerificationRecorded" and r.event.block_id == cand.block_id][0]
    by = {d.path: d for d in ver.differs}
    assert by["topology.architecture"].baseline == "colocated"
    assert by["topology.architecture"].candidate == "pd"
    assert by["topology.roles.prefill"].baseline is None
    assert by["topology.roles.prefill"].candidate["parallelism"]["tp"] == 1
    assert cand.handoff["findings"][0].startswith(
        'differs from the baseline: topology.architecture "colocated"→"pd"')
    shown = run_forge("task", "show", "to-pd", home=workspace.home)
    assert shown.returncode == 0, shown.stderr
    assert 'differs from the baseline: topology.architecture "colocated"→"pd"' in shown.stdout
    as_json = run_forge("task", "show", "to-pd", "--json", home=workspace.home)
    blocks = json.loads(as_json.stdout)["blocks"]
    assert blocks[0]["differs"] == [] and blocks[1]["differs"][0]["path"] == \
        "topology.architecture"


def test_example_topology_task_sweeps_what_fits_the_node():
    from infer_forge.ledger.specs import load_task

    t = load_task(REPO / "examples/tasks/tune-qwen3-235b-topology.yaml")
    pt = load_point(EX / "points/qwen3-235b-pd-h200.yaml")
    pr = load_profile(EX / "profiles/qwen3-235b-pd-sglang.yaml")
    seen, reason = _sweep(t, pt, pr, 10)
    assert seen[1:] == [
        {"topology.architecture": "pd", "prefill.tp": 2, "prefill.count": 1},
        {"topology.architecture": "pd", "prefill.tp": 2, "prefill.count": 2},
        {"topology.architecture": "colocated", "colocated.tp": 8}]
    assert seen[0] == {"topology.architecture": "pd", "prefill.tp": 4, "prefill.count": 1}
    assert differences(pt, pr, seen[0]) == []  # the baseline: the loop skips it after b1
    assert reason is not None and "the point needs 12 devices (prefill 8, decode 4) but 8 " \
        "are available" in reason


def test_other_engines_deploy_one_colocated_server_only():
    from infer_forge.harness.engines.whole import placement_problem

    pt = load_point(EX / "points/tiny-cpu.yaml")
    pr = load_profile(EX / "profiles/tiny-cpu.yaml")
    assert placement_problem(pt, pr) is None
    pd, _ = apply_candidate(pt, pr, {"topology.architecture": "pd"})
    assert placement_problem(pd, pr) == ("engine hf serves one colocated server; architecture "
                                         "pd with 2 servers is deployed for sglang only")
    two, _ = apply_candidate(pt, pr, {"colocated.count": 2})
    assert "with 2 servers" in (placement_problem(two, pr) or "")
