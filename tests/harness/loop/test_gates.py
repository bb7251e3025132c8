"""Gates on synthetic samples with known answers (pure, seeded)."""

from __future__ import annotations

import sys

import pytest
from infer_forge.harness.loop.gates import bootstrap_ci, judge, judge_gate
from infer_forge.ledger.specs import Contract, Gate
from infer_forge.ledger.task import Run

C = Contract(gates=[Gate(name="stability", repeats=3, max_cv=0.1)])


def runs(values, metric="output_throughput", **extra):
    return [Run({metric: v, **extra}) for v in values]


def rel(at_least=None, at_most=None, metric="output_throughput"):
    return Gate(name="g", metric=metric, vs_baseline="ratio", at_least=at_least, at_most=at_most)


def test_relative_gate_pass_fail_and_inconclusive():
    base = runs([100, 101, 99])
    g = rel(at_least=1.05)
    r = judge_gate(g, runs([120, 121, 119]), base, contract=C)
    assert r.verdict == "pass" and r.ratio == 1.2 and r.ci[0] >= 1.05
    assert "ratio 1.2" in r.reason and "needs >= 1.05" in r.reason
    assert judge_gate(g, runs([101, 102, 100]), base, contract=C).verdict == "fail"
    # Spread straddles the threshold: the interval contains 1.05 → no guess.
    r = judge_gate(g, runs([98, 106, 112]), base, contract=C)
    assert r.verdict == "inconclusive" and r.ci[0] < 1.05 < r.ci[1]


def test_relative_at_most_for_latency():
    g = rel(at_most=1.1, metric="median_ttft_ms")
    base = runs([50, 51, 49], metric="median_ttft_ms")
    assert judge_gate(g, runs([52, 52, 51], metric="median_ttft_ms"), base,
                      contract=C).verdict == "pass"
    assert judge_gate(g, runs([80, 82, 81], metric="median_ttft_ms"), base,
                      contract=C).verdict == "fail"


def test_absolute_gates_and_missing_metric():
    slo = Gate(name="ttft", metric="median_ttft_ms", at_most=500)
    ok = judge_gate(slo, runs([400, 410, 405], metric="median_ttft_ms"), None, contract=C)
    assert ok.verdict == "pass" and ok.median == 405
    assert judge_gate(slo, runs([600, 610, 605], metric="median_ttft_ms"), None,
                      contract=C).verdict == "fail"
    assert judge_gate(slo, runs([450, 560, 480], metric="median_ttft_ms"), None,
                      contract=C).verdict == "inconclusive"
    tm = Gate(name="correctness", metric="token_match", at_least=0.99)
    r = judge_gate(tm, runs([100, 100, 100]), None, contract=C)
    assert r.verdict == "inconclusive" and "not measured" in r.reason
    assert judge_gate(tm, runs([0.8, 0.8, 0.8], metric="token_match"), None,
                      contract=C).verdict == "fail"
    # No baseline for a relative gate: inconclusive, never a guess.
    assert judge_gate(rel(at_least=1.0), runs([1, 2, 3]), None, contract=C).verdict == \
        "inconclusive"


def test_stability():
    g = Gate(name="stability", repeats=3, max_cv=0.1, max_failed_requests=0)
    kw = {"contract": C, "default_metric": "output_throughput"}
    r = judge_gate(g, runs([100, 101, 99]), None, **kw)
    assert r.verdict == "pass" and r.cv < 0.02
    r = judge_gate(g, runs([100, 150, 60]), None, **kw)
    assert r.verdict == "fail" and "CV" in r.reason
    # A run with failed requests cannot pass stability.
    rs = runs([100, 101, 99])
    rs[1] = Run({**rs[1].metrics, "failed": 1})
    assert judge_gate(g, rs, None, **kw).verdict == "fail"
    rs = runs([100, 101, 99])
    rs[2] = Run({}, success=False)
    r = judge_gate(g, rs, None, **kw)
    assert r.verdict == "fail" and r.failed_runs == 1
    r = judge_gate(g, runs([100, 101]), None, **kw)
    assert r.verdict == "inconclusive" and "needs 3" in r.reason


def test_overall_verdict_and_reason_and_determinism():
    c = Contract(gates=[rel(at_least=1.05),
                        Gate(name="ttft", metric="median_ttft_ms", at_most=500),
                        Gate(name="stability", repeats=3, max_cv=0.1)], seed=7)
    base = runs([100, 101, 99], median_ttft_ms=100)
    good = runs([120, 121, 119], median_ttft_ms=100)
    v = judge(c, good, base)
    assert v.verdict == "pass" and v.passed and v.reason() == "all gates pass"
    v = judge(c, runs([98, 112, 106], median_ttft_ms=100), base)  # not a trend
    assert v.verdict == "inconclusive" and v.reason().startswith("g inconclusive")
    v = judge(c, runs([98, 106, 112], median_ttft_ms=900), base)
    assert v.verdict == "fail"
    # The baseline judged against itself skips relative gates.
    assert [g.name for g in judge(c, base, base, skip_relative=True).gates] == ["ttft",
                                                                                 "stability"]
    a = bootstrap_ci([1, 2, 3, 4], seed=3)
    assert a == bootstrap_ci([1, 2, 3, 4], seed=3)
    assert judge(c, good, base).gates[0].to_dict() == judge(c, good, base).gates[0].to_dict()


# --- computed numbers that overflow (issue 27 item 6) ----------------------------------------

BIG = 1.7e308  # finite; the mean of two of them is not


def test_an_overflowing_median_fails_its_gate_naming_the_metric():
    r = judge_gate(Gate(name="t", metric="output_throughput", at_least=1), runs([BIG, BIG]),
                   None, contract=C)
    assert r.verdict == "fail" and r.reason.startswith("output_throughput: computed median")
    assert r.median is None and r.ci is None


def test_an_overflowing_ratio_fails_its_gate():
    r = judge_gate(rel(at_least=1.0), runs([1e300, 1e300, 1e300]),
                   runs([1e-308, 1e-308, 1e-308]), contract=C)
    assert r.verdict == "fail" and "computed ratio" in r.reason and r.ratio is None


def test_an_overflowing_coefficient_of_variation_fails_stability():
    g = Gate(name="stability", repeats=2, max_cv=0.1)
    r = judge_gate(g, runs([BIG, BIG]), None, contract=C, default_metric="output_throughput")
    assert r.verdict == "fail" and "coefficient of variation" in r.reason
    # Failed-request counts that overflow their sum: the worst run fails it, still storable.
    r = judge_gate(g, runs([1, 1], failed=BIG), None, contract=C,
                   default_metric="output_throughput")
    assert r.verdict == "fail" and r.failed_requests == sys.float_info.max


def test_overflowing_gates_make_a_storable_verdict():
    from infer_forge.ledger.numbers import check_finite

    contract = Contract(gates=[Gate(name="t", metric="output_throughput", at_least=1),
                               rel(at_least=1.0),
                               Gate(name="stability", repeats=2, max_cv=0.1)])
    v = judge(contract, runs([BIG, BIG]), runs([1e-308, 1e-308]))
    assert v.verdict == "fail" and all(g.verdict == "fail" for g in v.gates)
    for g in v.gates:
        check_finite(g.model_dump(), g.name)


def test_a_blocks_runs_are_typed_and_leave_invalidated_measurements_out():
    from dataclasses import FrozenInstanceError

    from infer_forge.ledger.task import Block

    def rec(x, **kw):
        return {"event_id": f"e{x}", "run_id": f"r{x}", "repeat": None, "error": None,
                "source": "s", "artifact_digest": None, "metrics": {"output_throughput": x},
                "success": True, "meta": {}, **kw}

    acc = {"acc": {"task": "arith", "accuracy": 1.0, "items": [[0, 1]]}}
    b = Block(block_id="b1", index=1, sub_goal="s", measurements=[
        rec(100.0), rec(300.0, invalidated="noisy"), rec(102.0, meta={"accuracy": acc}),
        rec(0.0, success=False)])
    assert b.runs() == [Run({"output_throughput": 100.0}), Run({"output_throughput": 102.0},
                                                               accuracy=acc),
                        Run({"output_throughput": 0.0}, success=False)]
    assert b.median("output_throughput") == 101.0
    with pytest.raises(FrozenInstanceError):
        b.runs()[0].success = False  # type: ignore[misc]
    # The gates judge them as they are.
    assert judge_gate(Gate(name="t", metric="output_throughput", at_least=50), b.runs(), None,
                      contract=C).verdict == "pass"
