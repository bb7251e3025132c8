"""Per-item accuracy records: what a run stores (the items artifact, the dataset it read, the
runtime), and which items changed between two runs (projections/accuracy_items.py)."""

from __future__ import annotations

import importlib.util

import orjson
import pytest
from infer_forge.harness.bench.accuracy import (
    AccuracyRun,
    evaluate_accuracy,
    items_jsonl,
    judge_accuracy,
    record_accuracy,
)
from infer_forge.harness.testing.scripted_arith import ScriptedArith, solve
from infer_forge.projections.accuracy_items import (
    accuracy_changes,
    changed_items,
    items_of,
)

from tests.conftest import need

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None


def test_changed_items_splits_lost_gained_and_unpaired():
    a = {0: True, 1: True, 2: False, 3: False, 4: True, 9: True}
    b = {0: True, 1: False, 2: True, 3: False, 4: False, 7: False}
    got = changed_items(a, b)
    assert got == {"items": 5, "lost": [1, 4], "gained": [2], "unchanged": 2,
                   "only_a": [9], "only_b": [7], "accuracy_a": 0.6, "accuracy_b": 0.4}
    assert changed_items(a, a)["lost"] == [] and changed_items({}, {})["accuracy_a"] is None
    grouped = changed_items({"mmlu_x/1": True, "mmlu_a/3": True},
                            {"mmlu_x/1": False, "mmlu_a/3": False})
    assert grouped["lost"] == ["mmlu_a/3", "mmlu_x/1"]


def test_items_of_reads_both_recorded_shapes():
    assert items_of({"items": [[0, 1], [1, 0]]}) == {0: True, 1: False}
    engine = {"accuracy": {"acc": {"task": "arith", "items": [[3, 1], ["t/4", 0]]}}}
    assert items_of(engine) == items_of(engine, "acc") == {3: True, "t/4": False}
    with pytest.raises(ValueError, match="no accuracy results for gate 'other'"):
        items_of(engine, "other")
    two = {"accuracy": {"a": {"items": [[0, 1]]}, "b": {"items": [[0, 1]]}}}
    with pytest.raises(ValueError, match="give the gate: the run has accuracy gates a, b"):
        items_of(two)
    with pytest.raises(ValueError, match="gate acc: lm_eval arith: boom"):
        items_of({"accuracy": {"acc": {"task": "arith", "error": "lm_eval arith: boom"}}})
    with pytest.raises(ValueError, match="no per-item results"):
        items_of({"items": []})


def _acc(correct, hashes=True):
    items = list(enumerate(correct))
    return AccuracyRun("arith", sum(correct) / len(correct), items,
                       {i: f"h{i}" for i, _ in items} if hashes else {},
                       {"items_digest": "sha256:x"})


def test_a_recorded_run_keeps_its_items_as_an_artifact_and_the_changes_read_back(workspace):
    base = _acc([True] * 10)
    cand = _acc([i not in (2, 7) for i in range(10)])
    gate = judge_accuracy(base, cand, margin=0.05)
    ev = record_accuracy(workspace, base, cand, gate, url="http://c", baseline_url="http://b",
                         run_id="acc-1", runtime_s={"candidate": 1.5, "baseline": 1.25})
    rows = [orjson.loads(x) for x in workspace.artifacts.get(ev.artifact_digest).splitlines()]
    assert rows[2] == {"id": 2, "doc_hash": "h2", "correct": 0, "baseline": 1}
    assert len(rows) == 10 and sum(r["correct"] for r in rows) == 8
    assert workspace.artifacts.get(ev.artifact_digest) == items_jsonl(base, cand)
    assert ev.metrics["runtime_s_candidate"] == 1.5 and ev.metrics["runtime_s_baseline"] == 1.25
    assert ev.meta["dataset"] == {"items_digest": "sha256:x"}
    alone = record_accuracy(workspace, base, base, None, url="http://b", run_id="acc-0")
    assert "baseline" not in orjson.loads(workspace.artifacts.get(alone.artifact_digest)
                                          .splitlines()[0])
    got = accuracy_changes(workspace.ledger, "acc-0", "acc-1")
    assert got["lost"] == [2, 7] and got["gained"] == [] and got["unchanged"] == 8
    assert got["items_digest_a"] == got["items_digest_b"] == "sha256:x"
    with pytest.raises(ValueError, match="no measurement with run id 'nope'"):
        accuracy_changes(workspace.ledger, "acc-0", "nope")


@pytest.mark.slow
def test_forge_eval_accuracy_records_items_dataset_and_runtime(workspace):
    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    with ScriptedArith() as good, ScriptedArith(corrupt_every=5) as bad:
        out = evaluate_accuracy(workspace, bad.url, "scripted-arith", "arith",
                                baseline_url=good.url, limit=30)
        altered = set(bad.altered)
    assert out["accuracy"] == pytest.approx(24 / 30) and out["gate"]["verdict"] == "fail"
    assert set(out["runtime_s"]) == {"candidate", "baseline"}
    assert all(0 < v < 120 for v in out["runtime_s"].values())
    ident = out["dataset"]
    arith = ident["tasks"]["arith"]
    assert arith["dataset_path"] == "json" and arith["revision"]
    assert ident["n_shot"] == {"arith": 0} and ident["endpoint"] == "completions"
    assert ident["items_digest"].startswith("sha256:")
    rows = [orjson.loads(x) for x in workspace.artifacts.get(out["items_digest"]).splitlines()]
    assert [r["id"] for r in rows] == list(range(30))
    assert all(len(r["doc_hash"]) == 64 for r in rows)
    lost = [r["id"] for r in rows if r["baseline"] and not r["correct"]]
    assert len(lost) == 6 == len(altered)
    # the items that changed are exactly the questions the engine altered
    from infer_forge.harness.bench.accuracy import TASKS_DIR

    questions = [orjson.loads(x)["question"] for x in
                 (TASKS_DIR / "arith.jsonl").read_bytes().splitlines()]
    assert {solve(questions[i])[0] for i in lost} == altered
    ev = next(r.event for r in workspace.ledger.log(types=["MeasurementRecorded"])
              if r.event.event_id == out["event_id"])
    meta = ev.meta
    assert changed_items(items_of({"items": meta["baseline_items"]}), items_of(meta))[
        "lost"] == lost


def test_the_gate_does_not_pair_runs_that_read_other_documents():
    from infer_forge.harness.loop.gates import judge
    from infer_forge.ledger.specs import Contract
    from infer_forge.ledger.task import Run

    c = Contract(gates=[{"name": "acc", "kind": "accuracy", "task": "gsm8k"}])
    items = [[i, 1] for i in range(50)]

    def runs(digest):
        return [Run({}, accuracy={"acc": {"task": "gsm8k", "accuracy": 1.0, "items": items,
                                          "items_digest": digest}})]

    assert judge(c, runs("sha256:a"), runs("sha256:a")).gates[0].verdict == "pass"
    g = judge(c, runs("sha256:b"), runs("sha256:a")).gates[0]
    assert g.verdict == "inconclusive" and "not paired" in g.reason, g.reason
    assert "sha256:b vs sha256:a" in g.reason


@pytest.mark.slow
def test_forge_eval_accuracy_prints_runtime_dataset_and_items(forge_home):
    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    from tests.conftest import run_forge

    assert run_forge("init", home=forge_home).returncode == 0
    with ScriptedArith() as srv:
        res = run_forge("eval", "accuracy", "--url", srv.url, "--model", "scripted-arith",
                        "--limit", "10", home=forge_home)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "arith: accuracy 1.0000 over 10 items"
    assert lines[1].startswith("runtime: candidate ") and lines[1].endswith(" s")
    assert lines[2].startswith("dataset: arith revision ") and len(lines[2].split()[-1]) >= 8
    assert lines[3].startswith("recorded ") and "(items sha256:" in lines[3]


def test_the_compare_view_shows_which_accuracy_items_changed(workspace):
    # Two blocks of a task whose engine runs recorded an accuracy gate's items (as the
    # engine evaluator writes them), compared by the compare view and drawn on its page.
    from pathlib import Path

    from infer_forge.harness.record import record_measurements
    from infer_forge.ledger import events as E
    from infer_forge.projections.comparison import comparison_ws
    from infer_forge.wiki.compare_page import compare_page
    from infer_forge.wiki.plot import PlotCache

    from tests.conftest import run_forge

    home = Path(workspace.home)
    task = "tune-tiny-cpu"

    def cli(*args):
        r = run_forge(*args, home=home)
        assert r.returncode == 0, (args, r.stderr)

    def run(block, rid, correct, digest="sha256:d"):
        acc = {"acc": {"task": "gsm8k", "accuracy": sum(correct) / len(correct),
                       "items": [[i, int(c)] for i, c in enumerate(correct)],
                       "items_digest": digest}}
        ev = E.MeasurementRecorded(task_id=task, block_id=block, run_id=rid, source="engine",
                                   metrics={"output_throughput": 100.0}, success=True,
                                   meta={"accuracy": acc})
        record_measurements(workspace, [ev], task_id=task, command_id=f"t:{rid}")

    cli("task", "new", "examples/tasks/tune-tiny-cpu.yaml")
    cli("block", "start", task, "--sub-goal", "baseline")
    run("b1", "r1", [True] * 30)
    cli("block", "handoff", task, "--state-reached", "baseline measured")
    cli("block", "start", task, "--sub-goal", "batching", "--set",
        "engine.continuous_batching=true")
    run("b2", "r2", [i not in (3, 17) for i in range(29)] + [True])
    cmp = comparison_ws(workspace, f"{task}/b1", f"{task}/b2")
    [row] = cmp["accuracy"]
    assert row["gate"] == "acc" and row["lost"] == [3, 17] and row["gained"] == []
    assert row["items"] == 30 and row["same_documents"] is True
    page = compare_page(cmp, {"task_id": task, "a": "b1", "b": "b2", "b_is": "accepted"}, 1,
                        PlotCache())
    heads = [b[1] for b in page.blocks if b[0] == "h"]
    assert heads.index("Accuracy items") == heads.index("Gated metrics") + 1
    at = page.blocks.index(("h", "Accuracy items"))
    counts, ids = page.blocks[at + 1], page.blocks[at + 2]
    assert counts[2] == [("acc", 30, "1", "0.9333", 2, 0, 28, "yes")]
    assert ids[2] == [("acc", "3, 17", "—")]
    # another dataset revision on one side: shown as not paired
    run("b2", "r3", [True] * 30, digest="sha256:other")
    assert comparison_ws(workspace, f"{task}/b1", f"{task}/b2")["accuracy"][0][
        "same_documents"] is True  # the side's first run holding the gate is kept
    cli("block", "handoff", task, "--state-reached", "batching measured")
    cli("block", "start", task, "--sub-goal", "other data", "--set", "engine.dtype=bfloat16")
    run("b3", "r4", [True] * 30, digest="sha256:other")
    other = comparison_ws(workspace, f"{task}/b1", f"{task}/b3")["accuracy"][0]
    assert other["same_documents"] is False and other["lost"] == []
    shown = run_forge("compare", f"{task}/b1", f"{task}/b2", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "accuracy items acc: 30 shared, 2 lost [3, 17], 0 gained []" in shown.stdout


def test_eval_accuracy_refuses_to_pair_runs_that_read_other_documents(workspace,
                                                                      monkeypatch):
    # The two sides' lm_eval runs (replaced here: the pairing rule is what is tested) read
    # the same ids from other documents, as a dataset revision changed between them would.
    from infer_forge.harness.bench import accuracy as A
    from infer_forge.harness.errors import HarnessError

    runs = {}

    def fake_run(url, model, task, **kw):
        digest = "sha256:cand" if url == runs["cand"] else "sha256:base"
        return A.AccuracyRun(task, 1.0, [(i, True) for i in range(5)], {},
                             {"items_digest": digest})

    monkeypatch.setattr(A, "run_task", fake_run)
    with ScriptedArith() as good, ScriptedArith() as other:
        runs["cand"] = other.url
        with pytest.raises(HarnessError, match="read different items .*sha256:base vs "
                                               "sha256:cand.*not paired"):
            A.evaluate_accuracy(workspace, other.url, "m", "arith", baseline_url=good.url)
    assert not [r for r in workspace.ledger.log(types=["MeasurementRecorded"])]
