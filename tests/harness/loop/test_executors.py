"""Executors and the command evaluator, driven for real (subprocess scripts)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.command_evaluator import (
    CommandEvaluator,
    make_evaluator,
    parse_metrics_line,
)
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
from infer_forge.harness.loop.evaluator_protocol import EvalContext
from infer_forge.harness.loop.executors import CommandExecutor, ManualExecutor, SweepExecutor, grid
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger.specs import Range, effective_digest, load_point, load_profile, load_task
from infer_forge.projections.memory import TaskMemory

from tests.conftest import REPO

from .test_loop import command_executor, make_task_dir

EX = REPO / "examples"


@pytest.fixture
def specs():
    return (load_task(EX / "tasks/tune-tiny-cpu.yaml"), load_point(EX / "points/tiny-cpu.yaml"),
            load_profile(EX / "profiles/tiny-cpu.yaml"))


def test_sweep_grid_skips_baseline_and_tried(specs):
    task, point, profile = specs
    assert len(grid(task.scope)) == 8
    ex = SweepExecutor("grid")
    mem = TaskMemory(tried=[effective_digest(point, profile, {})])
    d = ex.decide(mem, task, point, profile)
    # (false, sdpa, float32) is the profile's own config: skipped.
    assert d.action == "try" and d.candidate == {"engine.continuous_batching": False,
                                                 "engine.attn_implementation": "sdpa",
                                                 "engine.dtype": "bfloat16"}
    mem.tried = [effective_digest(point, profile, c) for c in grid(task.scope)]
    d = ex.decide(mem, task, point, profile)
    assert d.action == "stop" and "exhausted" in d.reason


def test_sweep_random_is_seeded(specs):
    task, point, profile = specs
    a = SweepExecutor("random", seed=1, samples=4).candidates(task)
    assert a == SweepExecutor("random", seed=1, samples=4).candidates(task)
    assert a != SweepExecutor("random", seed=2, samples=4).candidates(task)
    assert len(a) == 4 and all(c in grid(task.scope) for c in a)
    q = load_task(EX / "tasks/tune-qwen-h200.yaml")
    assert {c["engine.cuda_graph_max_bs"] for c in grid(q.scope)} == {32, 64, 96, 128}
    cont = q.model_copy(update={"scope": {"engine.mem_fraction_static":
                                          Range(min=0.7, max=0.9)}})
    xs = SweepExecutor("random", seed=0, samples=5).candidates(cont)
    assert len(xs) == 5 and all(0.7 <= c["engine.mem_fraction_static"] <= 0.9 for c in xs)


def test_command_executor_answers(tmp_path, specs):
    task, point, profile = specs
    script = tmp_path / "policy.py"
    script.write_text(
        "import json, sys\n"
        "m = json.load(sys.stdin)\n"
        "n = len(m['memory']['execution_record'])\n"
        "assert 'engine.dtype' in m['scope']\n"
        "if n == 0:\n"
        "    print(json.dumps({'action': 'try', 'candidate': {'engine.dtype': 'bfloat16'},"
        " 'sub_goal': 'try bf16', 'model': 'm1'}))\n"
        "elif n == 1:\n"
        "    print(json.dumps({'action': 'stop', 'reason': 'enough', 'handoff': 'h'}))\n"
        "else:\n"
        "    print('not json')\n")
    ex = CommandExecutor([sys.executable, str(script)])
    d = ex.decide(TaskMemory(), task, point, profile)
    assert (d.action, d.candidate, d.sub_goal) == ("try", {"engine.dtype": "bfloat16"}, "try bf16")
    assert d.actor.model == "m1" and d.tool_event.exit_code == 0
    mem = TaskMemory.model_validate({"execution_record": [{"block_id": "b1", "index": 1,
                                                           "sub_goal": "x"}]})
    d = ex.decide(mem, task, point, profile)
    assert (d.action, d.reason, d.handoff) == ("stop", "enough", "h")
    mem.execution_record.append(mem.execution_record[0].model_copy())
    d = ex.decide(mem, task, point, profile)
    assert d.action == "stop" and "no valid action" in d.reason
    assert ManualExecutor().decide(mem, task, point, profile).action == "wait"


def test_command_evaluator_failures_are_data(tmp_path):
    s = tmp_path / "e.py"
    s.write_text("import json, os, sys\nc = json.load(sys.stdin)\n"
                 "assert json.loads(os.environ['FORGE_CANDIDATE']) == c\n"
                 "r = int(os.environ['FORGE_REPEAT'])\n"
                 "if r == 1: sys.exit('boom')\n"
                 "if r == 2: print('no json here'); sys.exit(0)\n"
                 "print(json.dumps({'output_throughput': 10 + r, 'ok': True, 'name': 'x',"
                 " 'outputs': ['a']}))\n")
    ctx = EvalContext(None, "t", "b1", None, None)
    res = CommandEvaluator([sys.executable, str(s)]).evaluate({"engine.dtype": "x"}, repeats=3,
                                                               ctx=ctx)
    assert res[0].success and res[0].metrics == {"output_throughput": 10.0, "ok": 1.0}
    assert res[0].meta["outputs"] == ["a"]
    assert not res[1].success and "exited 1: boom" in res[1].error
    assert not res[2].success and "not JSON" in res[2].error
    with pytest.raises(ValueError, match="JSON list"):
        parse_metrics_line("[1]\n")


def test_loop_with_command_executor_end_to_end(workspace, tmp_path):
    script = tmp_path / "policy.py"
    script.write_text(
        "import json, sys\nm = json.load(sys.stdin)['memory']\n"
        "if m['rejected']:\n"
        "    print(json.dumps({'action': 'try', 'candidate': {'engine.continuous_batching':"
        " True, 'engine.attn_implementation': 'eager'}}))\n"
        "else:\n"
        "    print(json.dumps({'action': 'try', 'candidate': {'engine.continuous_batching':"
        " True}}))\n")
    path = make_task_dir(tmp_path / "s", "cmd", executor=command_executor(script))
    define_task(workspace, path)
    r = run_task(workspace, "cmd")
    assert (r.exit_state, r.blocks) == ("delivered", 3)
    assert r.memory.rejected[0]["candidate"] == {"engine.continuous_batching": True}
    assert r.memory.execution_record[1].routing["model_tier"] == "small"


def test_out_of_scope_candidate_is_rejected_without_running(workspace, tmp_path, monkeypatch):
    script = tmp_path / "policy.py"
    script.write_text("import json, sys\njson.load(sys.stdin)\n"
                      "print(json.dumps({'action': 'try', "
                      "'candidate': {'engine.dtype': 'int4'}}))\n")
    path = make_task_dir(tmp_path / "s", "oos", no_progress=1,
                         executor=command_executor(script))
    log = workspace.home / "scratch" / "oos" / "eval.log"  # where the task's calls may write
    monkeypatch.setenv("EVAL_LOG", str(log))
    define_task(workspace, path)
    r = run_task(workspace, "oos")
    assert r.exit_state == "failed-no-progress"
    assert "out of scope: engine.dtype is not in the task's scope" in r.memory.rejected[0]["reason"]
    assert log.read_text().count("\n") == 3  # only the baseline's repeats ran


def test_make_evaluator_dispatches_on_the_task_and_the_engine(specs, workspace, tmp_path):
    task, point, profile = specs
    for engine, extra in (("hf", {}), ("sglang", {}),
                          ("external", {"endpoint": "http://127.0.0.1:9/v1"})):
        prof = profile.model_copy(update={"engine": engine, "config": {}, **extra})
        assert isinstance(make_evaluator(workspace, task, prof), EngineEvaluator)
    cmd = task.model_copy(update={"evaluator": task.evaluator.model_copy(
        update={"kind": "command", "argv": ["x"]})})
    ev = make_evaluator(workspace, cmd, profile, base_dir=tmp_path)
    assert isinstance(ev, CommandEvaluator) and ev.cwd == str(tmp_path)
    with pytest.raises(HarnessError, match="no evaluator for engine None"):
        make_evaluator(workspace, task, None)


def test_a_task_whose_evaluator_cannot_be_made_records_nothing(workspace, monkeypatch):
    from infer_forge.harness.loop import run as loop_run
    from infer_forge.ledger.streams import task_stream

    def refuse(*_a, **_k):
        raise HarnessError("no evaluator for engine 'hf'")

    monkeypatch.setattr(loop_run, "make_evaluator", refuse)
    define_task(workspace, EX / "tasks/tune-tiny-cpu.yaml")
    v = workspace.ledger.version(task_stream("tune-tiny-cpu"))
    with pytest.raises(HarnessError, match="no evaluator for engine 'hf'"):
        run_task(workspace, "tune-tiny-cpu")
    assert workspace.ledger.version(task_stream("tune-tiny-cpu")) == v


def test_engine_evaluator_launches_exactly_the_context_profile(specs, workspace, tmp_path,
                                                              scripted_server,
                                                              tiny_tokenizer_dir):
    """The loop applies the candidate to the profile it hands over (EvalContext); the engine
    evaluator launches that configuration as it is, and nothing else."""
    task, point, _ = specs
    model = tmp_path / "model"
    shutil.copytree(tiny_tokenizer_dir, model)
    (model / "config.json").write_text("{}")
    traffic = point.scenario.traffic.model_copy(update={
        "num_prompts": 3, "input_len": 8, "output_len": 3, "concurrency": 2})
    pt = point.model_copy(update={
        "model": point.model.model_copy(update={"source": str(model)}),
        "scenario": point.scenario.model_copy(update={"traffic": traffic})})
    url = scripted_server("--tokens", "3")
    prof = load_profile(EX / "profiles/tiny-cpu.yaml").model_copy(update={
        "engine": "external", "endpoint": url, "config": {"model": "from-the-context"}})
    ctx = EvalContext(workspace, "t", "b2", pt, prof)
    runs = EngineEvaluator(workspace, task).evaluate({"engine.model": "from-the-context"},
                                                   repeats=1, ctx=ctx)
    assert [r.success for r in runs] == [True], runs
    desc = json.loads(workspace.artifacts.get(runs[0].meta["server_info_digest"]))
    assert desc["base_url"] == url and desc["model"] == "from-the-context"
    assert desc["resolved_args"] == {"base_url": url, "model": "from-the-context"}
    # A context without a profile is a broken setup, not a run.
    with pytest.raises(HarnessError, match="needs a deployment point and a runtime profile"):
        EngineEvaluator(workspace, task).evaluate({}, repeats=1,
                                                  ctx=EvalContext(workspace, "t", "b2", pt, None))


def test_routing_is_recorded_and_escalates(specs):
    from infer_forge.harness.loop.routing import route

    task, _, _ = specs
    assert route(task) == {"executor": "sweep", "model_tier": "none", "agent_topology": "single"}
    cmd = task.model_copy(update={"executor": task.executor.model_copy(
        update={"kind": "command", "argv": ["x"]}), "routing": task.routing.model_copy(
        update={"escalate_after": 2})})
    assert route(cmd, 1, {"small": "qwen-7b"})["model"] == "qwen-7b"
    r = route(cmd, 2, {"large": "big-model"})
    assert (r["model_tier"], r["agent_topology"], r["model"]) == ("large", "executor-reviewer",
                                                                  "big-model")


def test_tool_calls_record_without_secret_values(workspace, tmp_path, monkeypatch):
    from infer_forge.harness.tool_calls.calls import env_digest, run_tool

    assert env_digest({"HF_TOKEN": "a", "X": "1"}) == env_digest({"HF_TOKEN": "b", "X": "1"})
    assert env_digest({"X": "1"}) != env_digest({"X": "2"})
    monkeypatch.setenv("HF_TOKEN", "hf_" + "s" * 34)
    # A secret reaches a tool call only when given to it (the sandbox's allowlist).
    run = run_tool(workspace, [sys.executable, "-c", "import os; print(os.environ['HF_TOKEN']);"
                                                     "raise SystemExit(2)"], cwd=tmp_path,
                   env={"HF_TOKEN": "hf_" + "s" * 34})
    ev = run.event
    assert ev.exit_code == 2 and ev.cwd == str(tmp_path.resolve()) and ev.repo_digest is None
    assert "s" * 34 not in workspace.artifacts.text(ev.stdout_digest)
    assert run_tool(workspace, ["true"], cwd=REPO).event.repo_digest.startswith("sha256:")
    missing = run_tool(workspace, ["/nonexistent/tool"]).event
    assert missing.exit_code is None and "cannot start" in missing.error


def test_the_baseline_a_candidate_is_handed_is_typed_and_its_json_unchanged():
    from infer_forge.harness.loop.evaluator_protocol import Baseline, BaselineRun, baseline_of
    from infer_forge.ledger import events as E
    from infer_forge.projections.memory import build_memory

    c = {"task_id": "t"}
    m = [E.MeasurementRecorded(run_id=f"r{i}", source="x", metrics={"tput": 1.0 + i},
                               meta={"outputs_digest": f"sha256:{i}"}, block_id="b1",
                               artifact_digest=f"sha256:a{i}", success=i != 1, **c)
         for i in range(3)]
    mem = build_memory([
        E.TaskDefined(title="t", task_type="x", goal="g", definition={}, definition_hash="h",
                      **c),
        E.LoopBlockStarted(index=1, sub_goal="base", block_id="b1", **c), *m,
        E.MeasurementInvalidated(measurement_event_id=m[2].event_id, reason="r",
                                 block_id="b1", **c),
        E.LoopBlockHandedOff(block_id="b1", **c),
        E.LoopBlockStarted(index=2, sub_goal="cand", block_id="b2", candidate={"a": 1}, **c)])
    base = baseline_of(mem)
    assert isinstance(base, Baseline) and base.block_id == "b1"
    assert base.runs[1] == BaselineRun({"tput": 2.0}, False, {"outputs_digest": "sha256:1"},
                                       "sha256:a1")
    # What a command evaluator reads in FORGE_BASELINE: every recorded run, as before.
    assert base.to_json() == {"block_id": "b1", "runs": [
        {"metrics": {"tput": 1.0 + i}, "success": i != 1,
         "meta": {"outputs_digest": f"sha256:{i}"}, "artifact_digest": f"sha256:a{i}"}
        for i in range(3)]}
    assert baseline_of(build_memory([])) is None
