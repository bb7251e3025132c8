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

from .conftest import need

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
