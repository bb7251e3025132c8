"""Accuracy gate (issue 15, item 4): the pure non-inferiority judgement, the shipped offline
task set, and lm_eval end to end against scripted engines (one answering right, one
altering one answer in five)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner
from infer_forge.cli import main
from infer_forge.harness.bench.accuracy import (
    TASKS_DIR,
    AccuracyRun,
    arith_jsonl,
    judge_accuracy,
    run_task,
    task_config,
)
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.testing.scripted_arith import ScriptedArith, solve
from infer_forge.ledger.task import Run

from tests.conftest import need

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None


def _run(correct: list[bool]) -> AccuracyRun:
    return AccuracyRun("t", sum(correct) / len(correct), list(enumerate(correct)))


# --- the pure judgement -------------------------------------------------------------------

def test_identical_answers_pass():
    r = judge_accuracy(_run([True] * 80 + [False] * 20), _run([True] * 80 + [False] * 20))
    assert r.verdict == "pass" and r.kind == "accuracy"
    assert r.ci == [0.0, 0.0] and r.ratio == 0.0 and r.n == 100 and r.threshold == -0.02


def test_one_in_five_lost_fails():
    base = [True] * 100
    cand = [i % 5 != 4 for i in range(100)]  # every fifth answer wrong
    r = judge_accuracy(_run(base), _run(cand), margin=0.02)
    assert r.verdict == "fail", r.reason
    assert r.median == 0.8 and r.baseline_median == 1.0 and r.ratio == pytest.approx(-0.2)
    assert r.ci is not None and r.ci[1] < -0.02
    assert "20 lost" in r.reason


def test_one_lost_of_few_items_is_inconclusive():
    # one answer lost in 20 items: the interval reaches both sides of -margin
    r = judge_accuracy(_run([True] * 20), _run([True] * 19 + [False]), margin=0.02)
    assert r.verdict == "inconclusive", r.reason
    assert r.ci is not None and r.ci[0] < -0.02 < r.ci[1]


def test_a_small_loss_inside_a_wide_margin_passes_and_gains_pass():
    base = [True] * 200
    cand = [True] * 199 + [False]
    assert judge_accuracy(_run(base), _run(cand), margin=0.05).verdict == "pass"
    assert judge_accuracy(_run(cand), _run(base), margin=0.0).verdict == "pass"


def test_judgement_is_seeded_and_pairs_items():
    b = _run([i % 3 != 0 for i in range(90)])
    c = _run([i % 4 != 0 for i in range(90)])
    assert judge_accuracy(b, c, seed=3) == judge_accuracy(b, c, seed=3)
    with pytest.raises(HarnessError, match="same items"):
        judge_accuracy(b, AccuracyRun("t", 1.0, [(0, True)]))
    with pytest.raises(HarnessError, match="margin"):
        judge_accuracy(b, c, margin=-0.1)


# --- the shipped task set -----------------------------------------------------------------

def test_shipped_items_are_the_seeded_ones_and_all_solvable():
    path = TASKS_DIR / "arith.jsonl"
    assert path.read_bytes() == arith_jsonl()
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 300 and len({r["question"] for r in rows}) == 300
    for r in rows:
        solved = solve(r["question"])
        assert solved is not None and str(solved[1]) == r["answer"]


def test_task_config_resolves_data_files_against_its_folder(tmp_path):
    cfg = task_config("arith", TASKS_DIR)
    assert cfg is not None
    assert cfg["dataset_kwargs"]["data_files"]["test"] == str(TASKS_DIR / "arith.jsonl")
    assert task_config("gsm8k", TASKS_DIR) is None  # lm_eval's registry decides
    with pytest.raises(HarnessError, match="not a directory"):
        task_config("arith", tmp_path / "missing")


def test_scripted_server_alters_exactly_one_in_five():
    srv = ScriptedArith(corrupt_every=5)
    texts = [srv._answer(f"Question: What is {i} + 1?\nAnswer:") for i in range(50)]
    assert len(srv.altered) == 10
    assert sum(t != f" {i + 1}" for i, t in enumerate(texts)) == 10
    assert srv._answer("Question: What is 4 + 1?\nAnswer:") == texts[4]  # same on a retry
    with pytest.raises(ValueError, match="corrupt_every"):
        ScriptedArith(corrupt_every=1)


# --- lm_eval end to end -------------------------------------------------------------------

@pytest.mark.slow
def test_lm_eval_gate_rejects_a_server_altering_one_answer_in_five():
    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    with ScriptedArith() as good, ScriptedArith(corrupt_every=5) as bad:
        base = run_task(good.url, "scripted-arith", "arith", limit=60)
        cand = run_task(bad.url + "/v1", "scripted-arith", "arith", limit=60)
        assert len(bad.altered) == 12 and bad.requests >= 60
    assert base.accuracy == 1.0 and len(base.items) == 60
    assert cand.accuracy == pytest.approx(48 / 60)
    r = judge_accuracy(base, cand, margin=0.02)
    assert r.verdict == "fail", r.reason
    assert judge_accuracy(base, base).verdict == "pass"


@pytest.mark.slow
def test_forge_eval_accuracy_records_and_rejects(tmp_path):
    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    home = str(tmp_path / "home")
    runner = CliRunner()
    assert runner.invoke(main, ["--home", home, "init"]).exit_code == 0
    with ScriptedArith() as good, ScriptedArith(corrupt_every=5) as bad:
        res = runner.invoke(main, ["--home", home, "eval", "accuracy", "--url", bad.url,
                                   "--baseline-url", good.url, "--model", "scripted-arith",
                                   "--endpoint", "chat", "--limit", "40", "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["gate"]["verdict"] == "fail" and out["gate"]["kind"] == "accuracy"
    assert out["accuracy"] == pytest.approx(32 / 40) and out["baseline_accuracy"] == 1.0
    assert out["event_id"]


def test_forge_eval_accuracy_refuses_a_bad_margin(tmp_path):
    res = CliRunner().invoke(main, ["--home", str(tmp_path), "eval", "accuracy", "--url",
                                    "http://127.0.0.1:9", "--model", "m", "--margin", "-1"])
    assert res.exit_code != 0 and "margin" in res.output


# --- the accuracy gate of a contract --------------------------------------------------------

def _contract(**acc):
    from infer_forge.ledger.specs import Contract

    return Contract.model_validate({"gates": [
        {"name": "tput", "metric": "output_throughput", "vs_baseline": "ratio", "at_least": 0.9},
        {"name": "acc", "kind": "accuracy", "task": "arith", **acc}]})


def _block(correct: list[bool] | None, *, tput: float = 100.0, error: str | None = None):
    """Three runs of a block; the accuracy results ride in every run (as the evaluator's meta)."""
    acc = {"acc": {"task": "arith", "error": error}} if error else {} if correct is None else {
        "acc": {"task": "arith", "accuracy": sum(correct) / len(correct),
                "items": [[i, int(c)] for i, c in enumerate(correct)]}}
    return [Run({"output_throughput": tput + i}, accuracy=acc or None) for i in range(3)]


def test_contract_accuracy_gate_shape_and_hash():
    from infer_forge.ledger.specs import Contract, spec_hash

    c = _contract(margin=0.05, limit=100, endpoint="chat")
    g = c.gates[1]
    assert g.kind == "accuracy" and g.margin_or_default == 0.05 and c.primary.name == "tput"
    assert "kind" not in g.model_dump() and g.model_dump()["task"] == "arith"
    # a gate without the accuracy fields keeps its stored shape (and so its hash)
    plain = Contract.model_validate({"gates": [{"name": "t", "metric": "m", "at_least": 1}]})
    assert set(plain.gates[0].model_dump()) == {"name", "metric", "vs_baseline", "at_least",
                                                "at_most", "repeats", "max_cv",
                                                "max_failed_requests"}
    assert spec_hash(Contract.model_validate(c.model_dump())) == spec_hash(c)
    assert _contract().gates[1].margin_or_default == 0.02


@pytest.mark.parametrize("gate, field", [
    ({"kind": "accuracy", "task": "arith", "margin": 1.5}, "margin"),
    ({"kind": "accuracy", "task": "arith", "limit": 0}, "limit"),
    ({"kind": "accuracy"}, "task"),
    ({"kind": "accuracy", "task": "arith", "metric": "m"}, "metric"),
    ({"kind": "relative", "metric": "m", "at_least": 1}, "kind"),
    ({"metric": "m", "at_least": 1, "margin": 0.1}, "margin"),
    ({"kind": "accuracy", "task": "arith", "endpoint": "grpc"}, "endpoint"),
])
def test_contract_accuracy_gate_errors_name_the_field(gate, field):
    from infer_forge.ledger.errors import SpecError
    from infer_forge.ledger.specs import parse_spec

    with pytest.raises(SpecError) as ei:
        parse_spec("task", {"type": "deployment-tuning", "goal": "x", "point": "p.yaml",
                            "contract": {"gates": [{"name": "a", **gate}]}})
    assert len(ei.value.problems) == 1 and field in ei.value.problems[0]
    assert "\n" not in ei.value.problems[0]


def test_gates_judge_the_accuracy_gate_on_per_item_runs():
    from infer_forge.harness.loop.gates import judge

    c = _contract()
    base = _block([True] * 100)
    same = judge(c, _block([True] * 100), base)
    assert same.verdict == "pass", same.reason()
    acc = same.gates[1]
    assert acc.kind == "accuracy" and acc.n == 100 and acc.ci == [0.0, 0.0]
    lost = judge(c, _block([i % 5 != 4 for i in range(100)]), base)
    assert lost.verdict == "fail" and [g.verdict for g in lost.gates] == ["pass", "fail"]
    assert "20 lost" in lost.gates[1].reason
    # a wide margin takes the loss
    assert judge(_contract(margin=0.5), _block([i % 5 != 4 for i in range(100)]),
                 base).verdict == "pass"
    # missing items on either side, an evaluation error, or other items: inconclusive
    for runs, baseline, why in [
        (_block(None), base, "no per-item results"),
        (_block([True] * 100), _block(None), "baseline: no per-item results"),
        (_block(None, error="lm_eval missing"), base, "lm_eval missing"),
        (_block([True] * 100), None, "baseline"),
        (_block([True] * 50), base, "same items"),
    ]:
        v = judge(c, runs, baseline)
        assert v.verdict == "inconclusive" and v.gates[1].verdict == "inconclusive", why
        assert why in v.gates[1].reason
    # the baseline block is not judged against itself
    own = judge(c, base, base, skip_relative=True)
    assert [g.name for g in own.gates] == []


def test_task_memory_runs_carry_the_accuracy_meta():
    from infer_forge.projections.memory import BlockRecord

    acc = {"acc": {"task": "arith", "accuracy": 1.0, "items": [[0, 1]]}}
    rec = {"event_id": "e", "run_id": "r", "repeat": None, "error": None, "source": "s",
           "artifact_digest": None}
    b = BlockRecord(block_id="b", index=0, sub_goal="s", measurements=[
        {**rec, "metrics": {"x": 1.0}, "success": True, "meta": {"accuracy": acc}},
        {**rec, "metrics": {"x": 2.0}, "success": True, "meta": {"engine": "hf"}},
        {**rec, "metrics": {"x": 3.0}, "success": True, "meta": {"accuracy": acc},
         "invalidated": "bad"}])
    assert b.runs() == [Run({"x": 1.0}, True, acc), Run({"x": 2.0})]


@pytest.mark.slow
def test_engine_evaluator_runs_the_accuracy_gate_and_the_gate_rejects(tmp_path):
    # The evaluator's accuracy step against scripted servers (a full loop needs a local model's
    # tokenizer for its prompts: the step is exercised here on its own).
    from types import SimpleNamespace

    from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
    from infer_forge.harness.loop.gates import judge

    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    c = _contract(limit=40)
    ev = EngineEvaluator(None, SimpleNamespace(contract=c))  # type: ignore[arg-type]
    said: list[str] = []
    with ScriptedArith() as good, ScriptedArith(corrupt_every=5) as bad:
        base = ev._accuracy(good.url, "scripted-arith", "internal", said.append)
        cand = ev._accuracy(bad.url, "scripted-arith", "internal", said.append)
        prod = ev._accuracy(bad.url, "scripted-arith", "production", said.append)
        assert bad.requests >= 40
    assert list(base) == ["acc"] and base["acc"]["accuracy"] == 1.0
    assert len(base["acc"]["items"]) == 40 and {c for _, c in base["acc"]["items"]} == {1}
    assert cand["acc"]["accuracy"] == pytest.approx(32 / 40)
    # ids and 0/1, digests and timing, never text
    assert set(cand["acc"]) == {"task", "accuracy", "items", "items_digest", "revisions",
                                "runtime_s"}
    assert cand["acc"]["items_digest"] == base["acc"]["items_digest"]  # the same documents
    assert "error" in prod["acc"] and "production" in prod["acc"]["error"]
    assert any("accuracy gate acc" in s for s in said)
    assert any(s.startswith("accuracy gate acc: 1.0000 over 40 items in ") for s in said)
    assert 0 < base["acc"]["runtime_s"] < 120

    def runs(acc):
        return [Run({"output_throughput": 100.0}, accuracy=acc)]

    v = judge(c, runs(cand), runs(base))
    assert v.verdict == "fail" and v.gates[1].verdict == "fail", v.reason()
    assert judge(c, runs(prod), runs(base)).gates[1].verdict == "inconclusive"


def test_eval_accuracy_against_a_production_endpoint_is_refused_before_any_request(tmp_path):
    from infer_forge.harness.bench.accuracy import evaluate_accuracy
    from infer_forge.harness.guard.production import ProductionRefusedError
    from infer_forge.ledger.streams import GUARD_STREAM
    from infer_forge.ledger.workspace import open_workspace

    from ..guard.test_production import configure
    with ScriptedArith() as prod:
        home = tmp_path / "home"
        configure(home, [prod.url])
        ws = open_workspace(home)
        try:
            with pytest.raises(ProductionRefusedError, match="refused"):
                evaluate_accuracy(ws, prod.url, "scripted-arith", limit=10)
            assert prod.requests == 0
            (ev,) = [r.event for r in ws.ledger.stream(GUARD_STREAM)]
            assert ev.action == "POST /v1/completions" and "probe budget" in ev.reason
        finally:
            ws.close()


def test_forge_eval_accuracy_checks_each_url_answers_before_lm_eval(tmp_path):
    """It used to start lm_eval (seconds of imports and task loading, then retries) against
    a URL where nothing listens."""
    import socket

    from tests.conftest import run_forge

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    with ScriptedArith() as good:
        for args in (["--url", dead, "--baseline-url", good.url],
                     ["--url", good.url, "--baseline-url", dead]):
            r = run_forge("eval", "accuracy", *args, "--model", "scripted-arith",
                          "--limit", "5", home=home)
            assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
            (line,) = r.stderr.strip().splitlines()
            assert line.startswith(f"Error: {dead} does not answer (GET {dead}/v1/models: ")
            assert line.endswith("; lm_eval not started"), line
        assert good.requests == 0  # no completion sent to the one that answers either
    log = run_forge("log", "--type", "MeasurementRecorded", home=home)
    assert log.returncode == 0 and log.stdout == "", log.stdout
