"""Dummy weights for perf-only sweeps: a runtime profile's `weights: dummy` is SGLang's
`--load-format dummy` (parsed by the real 0.5.23 parser), recorded in the profile's hash and
each run's `meta.deployment`, refused for an engine without it, and refused where a gate
needs real outputs: when the task is defined and again by the engine evaluator."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import yaml
from infer_forge.harness.models.dummy_weights import weights_of
from infer_forge.ledger.specs import SpecError, load_point, load_profile, load_task, spec_hash

from tests.conftest import REPO, run_forge
from tests.helpers import real_sglang

PROFILE = "profiles/qwen-h200-sglang.yaml"


@pytest.fixture
def examples(tmp_path):
    for d in ("points", "profiles", "tasks"):
        shutil.copytree(REPO / "examples" / d, tmp_path / d)
    return tmp_path


def edit(path, **fields):
    data = yaml.safe_load(path.read_text())
    for k, v in fields.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_dummy_weights_are_load_format_dummy_and_the_real_parser_takes_it(examples):
    real_sglang.release(real_sglang.LATEST)  # skips (locally) / fails (CI) without the wheel
    edit(examples / PROFILE, weights="dummy")
    r = run_forge("engine", "up", "--point", str(examples / "points" / "qwen-h200.yaml"),
                  "--plan", "--check-parser", "--json",
                  env={"FORGE_SGLANG_CACHE": str(real_sglang.CACHE)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (proc,) = out["plan"]["processes"]
    i = proc["argv"].index("--load-format")
    assert proc["argv"][i + 1] == "dummy"
    check = out["parser_check"]
    assert (check["version"], check["ok"]) == (real_sglang.LATEST, True), check


def test_the_profile_hash_says_dummy_and_real_keeps_the_old_hash(examples):
    path = examples / PROFILE
    before = spec_hash(load_profile(path))
    assert spec_hash(load_profile(edit(path, weights="real"))) == before
    dummy = load_profile(edit(path, weights="dummy"))
    assert spec_hash(dummy) != before and weights_of(dummy) == "dummy"
    direct = load_profile(edit(path, weights=None, config={"load_format": "dummy"}))
    assert weights_of(direct) == "dummy"  # SGLang's own spelling counts too


@pytest.mark.parametrize("fields, says", [
    ({"engine": "hf", "framework": None, "image": None},
     "weights: dummy: engine hf has no dummy-weights load (only sglang: --load-format dummy)"),
    ({"config": {"load_format": "safetensors"}},
     "weights: dummy contradicts config.load_format: safetensors"),
])
def test_a_profile_that_cannot_load_dummy_weights_is_refused(examples, fields, says):
    path = edit(examples / PROFILE, weights="dummy", **fields)
    with pytest.raises(SpecError) as e:
        load_profile(path)
    assert says in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_gate_on_real_outputs_refuses_dummy_weights_when_the_task_is_defined(examples):
    home = examples / "home"
    assert run_forge("init", home=home).returncode == 0
    task = examples / "tasks" / "tune-qwen-h200.yaml"  # its `correctness` gate: token_match
    edit(examples / PROFILE, weights="dummy")
    r = run_forge("task", "new", str(task), home=home)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "gate correctness (token_match) needs the model's real outputs" in r.stderr
    assert f"runtime profile {examples / PROFILE} loads dummy weights (weights: dummy)" \
        in r.stderr
    # An accuracy gate, with the profile's config spelling SGLang's own flag.
    edit(examples / PROFILE, weights=None, config={"load_format": "dummy"})
    spec = yaml.safe_load(task.read_text())
    spec["contract"]["gates"] = [g for g in spec["contract"]["gates"]
                                 if g["name"] != "correctness"]
    acc = edit(task, contract={**spec["contract"], "gates": [
        *spec["contract"]["gates"], {"name": "gsm8k", "kind": "accuracy", "task": "gsm8k"}]})
    r = run_forge("task", "new", str(acc), home=home)
    assert r.returncode == 1 and "gate gsm8k (accuracy, lm_eval gsm8k)" in r.stderr, r.stderr
    assert "(config.load_format: dummy)" in r.stderr
    # Perf-only gates: dummy weights are what the sweep wants.
    perf = edit(task, contract=spec["contract"])
    r = run_forge("task", "new", str(perf), "--json", home=home)
    assert r.returncode == 0, r.stderr


def _stand_in_task(d, tiny_model, gates):
    fake = [sys.executable, str(REPO / "tests" / "data" / "sglang" / "fake_server.py")]
    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.yaml").write_text(yaml.safe_dump({
        "service": "stand-in", "rev": 1, "engine": "sglang", "weights": "dummy",
        "config": {"launcher": fake, "startup_timeout_s": 60},
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    (d / "point.yaml").write_text(yaml.safe_dump({
        "name": "stand-in", "model": {"name": "tiny-llama", "source": str(tiny_model)},
        "scenario": {"traffic": {"input_len": 16, "output_len": 8, "concurrency": 2,
                                 "num_prompts": 2}},
        "runtime_profile": {"service": "stand-in", "rev": 1, "file": "profile.yaml"},
        "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}}))
    (d / "task.yaml").write_text(yaml.safe_dump({
        "id": "perf", "type": "deployment-tuning", "goal": "perf only",
        "point": "point.yaml", "profile": "profile.yaml",
        "contract": {"gates": gates},
        "exit": {"when": "all_gates_pass", "max_blocks": 1},
        "executor": {"kind": "sweep", "strategy": "grid"}}))
    return d


def test_the_engine_evaluator_records_dummy_and_refuses_it_under_a_real_output_gate(
        workspace, tmp_path, tiny_model):
    """The stand-in server (tests/data/sglang/fake_server.py: SGLang's flags parsed and
    echoed in /server_info) is launched with the profile's flags; the refusal launches
    nothing."""
    from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
    from infer_forge.harness.loop.evaluator_protocol import EvalContext

    def evaluate(d):
        task = load_task(d / "task.yaml")
        ctx = EvalContext(workspace=workspace, task_id="perf", block_id="b1",
                          point=load_point(d / "point.yaml"),
                          profile=load_profile(d / "profile.yaml"))
        return EngineEvaluator(workspace, task, base_dir=d).evaluate({}, repeats=1, ctx=ctx)

    throughput = {"name": "throughput", "metric": "output_throughput", "at_least": 0.0}
    (run,) = evaluate(_stand_in_task(tmp_path / "perf", tiny_model, [throughput]))
    assert run.success, run.error
    assert run.meta["deployment"]["weights"] == "dummy"
    cmd = run.meta["launch_command"]
    assert cmd[cmd.index("--load-format") + 1] == "dummy"

    gates = [throughput, {"name": "outputs", "metric": "token_match", "at_least": 0.99}]
    (refused,) = evaluate(_stand_in_task(tmp_path / "gated", tiny_model, gates))
    assert not refused.success and refused.meta == {}
    assert refused.error.startswith("gate outputs (token_match) needs the model's real "
                                    "outputs, but runtime profile stand-in rev 1 loads dummy")
