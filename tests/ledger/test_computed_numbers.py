"""Every number forge computes is checked like an input (issue 27 item 6): finite inputs
whose median or ratio overflow make a verdict, not a traceback; JSON output is valid JSON."""

from __future__ import annotations

import json
import math

import pytest
from infer_forge.ledger.numbers import json_safe
from infer_forge.ledger.store import Ledger

from tests.conftest import run_forge


def _strict(text: str):
    """json.loads that refuses NaN and Infinity (Python's own reader accepts them)."""
    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def _start(home) -> None:
    for args in (("init",), ("task", "new", "examples/tasks/tune-tiny-cpu.yaml")):
        assert run_forge(*args, home=home).returncode == 0


def _measure(home, **metrics: str) -> None:
    args = [a for k, v in metrics.items() for a in ("--metric", f"{k}={v}")]
    res = run_forge("measure", "tune-tiny-cpu", *args, home=home)
    assert res.returncode == 0, res.stderr


def test_block_verify_turns_overflowing_medians_and_ratios_into_a_recorded_verdict(
        forge_home):
    _start(forge_home)
    # Baseline: two finite runs whose TTFT median overflows (1.7e308 + 1.7e308).
    assert run_forge("block", "start", "tune-tiny-cpu", "--sub-goal", "base",
                     home=forge_home).returncode == 0
    for _ in range(3):
        _measure(forge_home, output_throughput="1e-308", median_ttft_ms="1.7e308",
                 token_match="1")
    _measure(forge_home, output_throughput="1e-308", median_ttft_ms="1.7e308",
             token_match="1")
    res = run_forge("block", "verify", "tune-tiny-cpu", home=forge_home)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "median_ttft_ms: computed median inf is not a finite number" in res.stdout
    assert run_forge("block", "handoff", "tune-tiny-cpu", "--state-reached", "base",
                     home=forge_home).returncode == 0
    # A candidate 1e300 times the baseline's throughput: the ratio overflows.
    assert run_forge("block", "start", "tune-tiny-cpu", "--sub-goal", "cb",
                     "--set", "engine.continuous_batching=true",
                     home=forge_home).returncode == 0
    for _ in range(3):
        _measure(forge_home, output_throughput="1e300", median_ttft_ms="100",
                 token_match="1")
    res = run_forge("block", "verify", "tune-tiny-cpu", "--json", home=forge_home)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    out = _strict(res.stdout)
    assert out["verdict"] == "fail"
    gates = {g["name"]: g for g in out["gates"]}
    assert gates["throughput"]["verdict"] == "fail"
    assert "output_throughput: computed ratio inf" in gates["throughput"]["reason"]
    # Recorded: the block is verified and the ledger checks.
    with Ledger.open(forge_home) as ledger:
        kinds = [r.event.TYPE for r in ledger.events(task="tune-tiny-cpu")]
    assert kinds.count("VerificationRecorded") == 2
    assert run_forge("check", home=forge_home).returncode == 0
    # The point's noise band over these runs: the overflowing group is left out.
    res = run_forge("task", "noise", "tune-tiny-cpu", home=forge_home)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_a_noise_band_leaves_out_groups_whose_spread_overflows():
    from infer_forge.projections.noise import learn

    band = learn("m", [[1.7e308, 1.7e308, 1.7e308], [100.0, 110.0, 90.0], [50.0, 55.0]])
    assert band is not None and (band.groups, band.runs) == (2, 5)
    assert learn("m", [[1.7e308, 1.7e308], [1.7e308, -1.7e308]]) is None


def test_sql_json_is_valid_json_with_null_for_non_finite_numbers(forge_home):
    assert run_forge("init", home=forge_home).returncode == 0
    res = run_forge("sql", "SELECT 'nan'::DOUBLE AS x, 'inf'::DOUBLE AS y, "
                    "['-inf'::DOUBLE, 1.0] AS l, {'a': 'nan'::DOUBLE} AS s, 2.5::DOUBLE AS z",
                    "--json", home=forge_home)
    assert res.returncode == 0, res.stderr
    assert _strict(res.stdout) == [{"x": None, "y": None, "l": [None, 1.0], "s": {"a": None},
                                    "z": 2.5}]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_json_safe_leaves_only_finite_numbers(value):
    got = json_safe({"a": [1, value, (value, "x")], "b": {"c": value}, "d": 1.5, "e": True})
    assert got == {"a": [1, None, [None, "x"]], "b": {"c": None}, "d": 1.5, "e": True}
    json.dumps(got, allow_nan=False)


def test_compare_gives_no_delta_where_the_difference_overflows(forge_home, workspace):
    from infer_forge.projections.queries import compare_ws

    cmds = [("task", "new", "examples/tasks/tune-tiny-cpu.yaml"),
            ("block", "start", "tune-tiny-cpu", "--sub-goal", "base"),
            ("measure", "tune-tiny-cpu", "--metric", "median_ttft_ms=1.7e308"),
            ("block", "handoff", "tune-tiny-cpu", "--state-reached", "x"),
            ("block", "start", "tune-tiny-cpu", "--sub-goal", "cb",
             "--set", "engine.continuous_batching=true"),
            ("measure", "tune-tiny-cpu", "--metric", "median_ttft_ms=-1.7e308")]
    for args in cmds:
        res = run_forge(*args, home=forge_home)
        assert res.returncode == 0, res.stderr
    r = compare_ws(workspace, "tune-tiny-cpu/b1", "tune-tiny-cpu/b2")
    [m] = [x for x in r["metrics"] if x["metric"] == "median_ttft_ms"]
    assert (m["a"], m["b"]) == (1.7e308, -1.7e308)
    assert m["delta"] is None and m["delta_pct"] is None  # -inf is no difference to report
    res = run_forge("compare", "tune-tiny-cpu/b1", "tune-tiny-cpu/b2", "--json",
                    home=forge_home)
    assert res.returncode == 0, res.stderr
    [m] = [x for x in _strict(res.stdout)["metrics"] if x["metric"] == "median_ttft_ms"]
    assert m["delta"] is None


def test_serving_metrics_of_overflowing_times_are_left_out_not_raised():
    from infer_forge.harness.bench.metrics import compute_metrics, numeric_metrics

    rec = {"success": True, "prompt_len": 4, "output_len": 3, "ttft": 1.7e308,
           "itl": [1.7e308, 1.7e308], "e2e": 1.7e308, "start_time": 0.0}
    m = compute_metrics([rec, rec], 1.0)  # raised OverflowError bucketing the chunks
    omitted: dict[str, str] = {}
    kept = numeric_metrics(m, omitted)
    assert omitted["mean_ttft_ms"] == "Infinity is not a finite number"
    assert kept["completed"] == 2.0 and kept["max_concurrent_requests"] == 2.0
    assert all(math.isfinite(v) for v in kept.values())
