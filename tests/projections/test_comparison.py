"""The compare view's function (projections/comparison.py) and `forge compare`, on ledgers
built by the real code: the hand-built index ledger (tests/helpers/index_ledger.py) and a
task whose runs stored per-request records through the bench's writer and `forge bench
import` (tests/helpers/compare_records.py); the deployment point history
(projections/history.py) on the first."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest
from infer_forge.projections import comparison as C
from infer_forge.projections.history import history
from infer_forge.projections.index import open_index

from tests.conftest import run_forge
from tests.helpers.compare_records import BENCH_SERVING, TASK, build_records, recorded
from tests.helpers.index_ledger import build


@pytest.fixture
def planted(workspace):
    build(workspace)
    return workspace


@pytest.fixture
def records(workspace):
    build_records(workspace)
    return workspace


def _by_metric(rows):
    return {r["metric"]: r for r in rows}


def test_gated_metrics_first_with_intervals_deltas_and_the_better_side(planted):
    r = C.comparison_ws(planted, "tune-qwen-h200/b1", "tune-qwen-h200/b2")
    assert [d["dimension"] for d in r["differing_dimensions"]] == ["candidate_key"]
    # The contract's gates name output_throughput and token_match; median TTFT is not gated.
    assert [g["metric"] for g in r["gated"]] == ["output_throughput", "token_match"]
    assert [m["metric"] for m in r["other_metrics"]] == ["median_ttft_ms"]
    tput = _by_metric(r["gated"])["output_throughput"]
    assert (tput["a"], tput["b"], tput["a_n"], tput["b_n"]) == (2000.0, 2200.0, 3, 3)
    assert tput["delta"] == 200.0 and tput["delta_pct"] == pytest.approx(10.0)
    assert tput["ratio"] == pytest.approx(1.1)
    assert tput["direction"] == "higher" and tput["better"] == "b"
    # Bootstrap intervals of the median lie within the samples and hold the median.
    assert 1990.0 <= tput["a_ci"][0] <= 2000.0 <= tput["a_ci"][1] <= 2010.0
    assert 2190.0 <= tput["b_ci"][0] <= 2200.0 <= tput["b_ci"][1] <= 2210.0
    lo, hi = tput["ratio_ci"]
    assert 2190 / 2010 <= lo <= 1.1 <= hi <= 2210 / 1990 and tput["beyond_noise"] is True
    assert tput["gates"] == ["throughput"]
    assert tput["verdicts"] == {"a": {}, "b": {"throughput": "pass"}}  # b1 was not verified
    tm = _by_metric(r["gated"])["token_match"]
    assert tm["better"] == "same" and tm["delta"] == 0.0 and tm["beyond_noise"] is False
    ttft = _by_metric(r["other_metrics"])["median_ttft_ms"]
    assert ttft["delta"] == 20.0 and ttft["better"] is None  # no gate says which way is better
    # The terms of queries.compare stay (forge compare --json kept its keys).
    assert {m["metric"] for m in r["metrics"]} == {"output_throughput", "token_match",
                                                  "median_ttft_ms"}
    assert {g["gate"] for g in r["gates"]["b"]} == {"throughput", "correctness"}


def test_a_worse_side_two_tasks_and_runs_without_records(planted):
    r = C.comparison_ws(planted, "deepgemm-moe-h20/b2", "deepgemm-moe-h20/b1")
    tm = _by_metric(r["gated"])["token_match"]
    assert (tm["a"], tm["b"], tm["better"]) == (0.61, 1.0, "b")
    tput = _by_metric(r["gated"])["output_throughput"]
    assert tput["better"] == "a" and tput["ratio"] == pytest.approx(900 / 1100)
    # Each side's verdicts of the gates on the metric (b2's verification failed on
    # correctness; b1 was not verified).
    assert tput["verdicts"] == {"a": {"throughput": "pass"}, "b": {}}
    assert tm["verdicts"] == {"a": {"correctness": "fail"}, "b": {}}
    # Two tasks: each by its deliverable; the hand-built runs stored no records.
    r = C.comparison_ws(planted, "tune-qwen-h200", "deepgemm-moe-h20")
    assert r["a"]["scope"] == "accepted block b2"
    assert {d["dimension"] for d in r["differing_dimensions"]} >= {"accelerator", "task_type"}
    for key, _ in C.LATENCIES:
        assert r["latency"][key]["a"]["n"] == r["latency"][key]["b"]["n"] == 0
    assert r["latency"]["runs"] == {"a": {"runs": 3, "with_records": 0},
                                    "b": {"runs": 3, "with_records": 0}}
    assert {m["why"] for side in "ab" for m in r["latency"]["missing"][side]} == {
        "the run stored no records artifact"}


def test_latency_distributions_from_the_per_request_records(records):
    r = C.comparison_ws(records, f"{TASK}/b1", f"{TASK}/b2")
    lat = r["latency"]
    # A: two bench runs of 20 measured requests (the failed and the warm-up one left out).
    ttft_a = lat["ttft_ms"]["a"]
    assert ttft_a["n"] == 40
    assert (ttft_a["p50"], ttft_a["p90"], ttft_a["p99"]) == pytest.approx((145.0, 185.0, 195.0))
    assert ttft_a["cdf"][0] == pytest.approx([100.0, 1 / 40]) and ttft_a["cdf"][-1][1] == 1.0
    assert lat["itl_ms"]["a"]["n"] == 160 and lat["itl_ms"]["a"]["p99"] == pytest.approx(20.0)
    assert lat["e2e_ms"]["a"]["n"] == 40 and lat["e2e_ms"]["a"]["p50"] == pytest.approx(225.0)
    assert lat["runs"]["a"] == {"runs": 3, "with_records": 2}
    assert lat["missing"]["a"] == [{"run_id": "b1-m3", "source": "manual",
                                    "why": "the run stored no records artifact"}]
    # B: one bench run and the bench_serving file's three result lines (their details).
    lines = [json.loads(x) for x in BENCH_SERVING.read_text().splitlines()]
    serving = [t * 1e3 for d in lines for t, e in zip(d["ttfts"], d["errors"], strict=True)
               if not e]
    ours = [50.0 + 2.0 * i for i in range(20)]
    ttft_b = lat["ttft_ms"]["b"]
    assert ttft_b["n"] == len(serving) + 20 == 44
    want = sorted(serving + ours)
    assert [x for x, _ in ttft_b["cdf"]] == pytest.approx(want)
    assert ttft_b["p50"] == pytest.approx(want[21])
    assert lat["itl_ms"]["b"]["n"] == 80 + sum(len(g) for d in lines for g in d["itls"])
    assert lat["e2e_ms"]["b"]["n"] == 20  # bench_serving stores no per-request E2E
    assert lat["runs"]["b"] == {"runs": 4, "with_records": 4}
    assert [m["why"] for m in lat["missing"]["b"]] == [
        "bench_serving stores no per-request E2E latency"] * 3
    # The gated metrics of the example's contract, each side's median of its runs' values.
    gated = _by_metric(r["gated"])
    assert list(gated) == ["median_ttft_ms", "output_throughput", "token_match"]
    for m in ("median_ttft_ms", "output_throughput"):
        a, b = recorded(records, "b1", m), recorded(records, "b2", m)
        assert (gated[m]["a"], gated[m]["b"]) == (statistics.median(a), statistics.median(b))
        assert (gated[m]["a_n"], gated[m]["b_n"]) == (len(a), len(b)) == (3, 4)
    assert gated["median_ttft_ms"]["direction"] == "lower"
    assert gated["median_ttft_ms"]["better"] == "b"  # b2's TTFT is lower: better
    assert gated["token_match"]["a_n"] == gated["token_match"]["b_n"] == 0
    assert gated["token_match"]["better"] is None and gated["token_match"]["a_ci"] == [None,
                                                                                        None]


def test_two_deployment_points(planted):
    with open_index(planted) as s:
        a, b = (s.con.execute("SELECT point_hash FROM points WHERE name = ?", [n]).fetchone()[0]
                for n in ("qwen-h200", "qwen-h200-r2"))
    r = C.comparison_ws(planted, a[7:19], b[7:19])  # hash prefixes, as forge compare takes
    assert (r["a"]["kind"], r["b"]["kind"]) == ("point", "point")
    assert {d["dimension"] for d in r["differing_dimensions"]} == {"runtime_profile",
                                                                  "point_hash", "candidate_key"}
    tput = _by_metric(r["gated"])["output_throughput"]
    # Point a: both blocks of tune-qwen-h200 (six runs); b: qwen-h200-rev2's three.
    assert (tput["a_n"], tput["b_n"], tput["a"], tput["b"]) == (6, 3, 2100.0, 2200.0)
    assert tput["better"] == "b" and tput["gates"] == ["throughput"]


def test_a_records_artifact_that_cannot_be_read_is_named(records):
    digests = {r.event.run_id: r.event.artifact_digest
               for r in records.ledger.log(types=["MeasurementRecorded"])}
    gone = digests["b2-bench-0"]  # (b1's two runs stored the same records: one artifact)
    h = gone.removeprefix("sha256:")
    path = records.artifacts.root / "sha256" / h[:2] / h[2:]  # the store's layout
    path.chmod(0o644)
    path.write_bytes(b"tampered")
    r = C.comparison_ws(records, f"{TASK}/b1", f"{TASK}/b2")
    [bad] = [m for m in r["latency"]["missing"]["b"] if m["run_id"] == "b2-bench-0"]
    assert bad["why"] == "its artifact is corrupt (its bytes no longer match its digest)"
    assert r["latency"]["ttft_ms"]["b"]["n"] == 24  # the bench_serving lines' requests only
    assert r["latency"]["e2e_ms"]["b"]["n"] == 0 and r["latency"]["ttft_ms"]["a"]["n"] == 40
    path.unlink()  # gone from the store
    r = C.comparison_ws(records, f"{TASK}/b1", f"{TASK}/b2")
    [bad] = [m for m in r["latency"]["missing"]["b"] if m["run_id"] == "b2-bench-0"]
    assert bad["why"] == "its artifact is not in the artifact store"


def test_request_latencies_of_what_is_not_records():
    got, why = C.request_latencies(b'{"output_throughput": 1.0}\n', "r1")
    assert why == "its artifact holds no per-request latency records"
    assert all(v == [] for v in got.values())
    got, why = C.request_latencies(BENCH_SERVING.read_bytes(), "sglang-0.5.1.jsonl:9")
    assert why == "no bench_serving result line 9 with per-request details"
    got, why = C.request_latencies(b'{"ttft": 0.1, "success": false}\n', "r1")
    assert why == "no successful measured request in its records" and got["ttft_ms"] == []
    d = C.distribution([3.0, 1.0, 2.0, math.inf])
    assert d["n"] == 3 and d["cdf"] == [[1.0, 1 / 3], [2.0, 2 / 3], [3.0, 1.0]]
    many = C.distribution(float(i) for i in range(1, 1001))
    assert len(many["cdf"]) == C.CDF_POINTS - 1 and many["cdf"][-1] == [1000.0, 1.0]
    assert many["p50"] == 500.0 and many["p99"] == 990.0


def test_task_pairs_and_history(planted):
    with open_index(planted) as s:
        pairs = C.task_pairs(s.con)
        series = history(s.con)
    assert pairs == [
        {"task_id": "deepgemm-moe-h20", "a": "b1", "b": "b2", "b_is": "best"},
        {"task_id": "tune-qwen-h200", "a": "b1", "b": "b2", "b_is": "accepted"},
        {"task_id": "tune-tiny-cpu", "a": "b1", "b": "b2", "b_is": "best"},
    ]  # qwen-h200-rev2 measured one block: nothing to compare
    assert len(series) == 3
    qwen = next(x for x in series if x["key"]["service"] == "qwen-h200")
    assert qwen["metric"] == "output_throughput" and qwen["direction"] == "higher"
    assert qwen["tasks"] == ["qwen-h200-rev2", "tune-qwen-h200"]
    assert [(p["task_id"], p["block_id"], p["runtime_profiles"], p["median"], p["n"],
             p["verdict"]) for p in qwen["points"]] == [
        ("tune-qwen-h200", "b1", ["qwen-h200@1"], 2000.0, 3, "baseline"),
        ("tune-qwen-h200", "b2", ["qwen-h200@1"], 2200.0, 3, "accepted"),
        ("qwen-h200-rev2", "b1", ["qwen-h200@2"], 2200.0, 3, "baseline")]
    assert all(p["repo_snapshots"] == ["sha256:repo-snapshot-1"] for p in qwen["points"])
    assert [p["position"] for p in qwen["points"]] == sorted(p["position"]
                                                             for p in qwen["points"])
    tiny = next(x for x in series if x["key"]["service"] == "tiny-cpu")
    assert [p["verdict"] for p in tiny["points"]] == ["baseline", "rejected"]


def test_forge_compare_prints_in_order_and_json_is_the_result(records):
    home = records.home
    r = run_forge("compare", f"{TASK}/b1", f"{TASK}/b2", home=home)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    heads = ["what differed:", "gated metrics (medians):", "other metrics (medians):",
             "gates A:", "latency from per-request records (ms):"]
    at = [out.index(h) for h in heads]
    assert at == sorted(at), out
    differed = out[at[0]:at[1]]
    assert "candidate  baseline  continuous batching on; baseline" in differed, differed
    assert "candidate_key" not in differed and "engine.continuous_batching" not in differed
    assert not re.search(r"\d\.?\d*e[+-]\d", out), out  # numbers never in e-notation
    gated = out[at[1]:at[2]].splitlines()
    assert [ln.split()[0] for ln in gated[3:6]] == ["median_ttft_ms", "output_throughput",
                                                     "token_match"], out
    assert "median_ttft_ms" not in out[at[2]:at[3]]  # gated: not among the rest
    lat = out[at[4]:]
    assert "TTFT  " in lat and "b1-m3: the run stored no records artifact" in lat
    assert "bench_serving stores no per-request E2E latency" in lat
    j = run_forge("compare", f"{TASK}/b1", f"{TASK}/b2", "--json", home=home)
    assert j.returncode == 0, j.stderr
    got = json.loads(j.stdout, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    want = json.loads(json.dumps(C.comparison_ws(records, f"{TASK}/b1", f"{TASK}/b2")))
    assert got == want
    assert [g["metric"] for g in got["gated"]][0] == "median_ttft_ms"
    assert got["latency"]["ttft_ms"]["a"]["n"] == 40


def test_history_of_a_metric_no_gate_names(workspace):
    """A series whose contracts' metric was never measured (nor output throughput) plots the
    metric most of its runs measured."""
    for args in (("task", "new", "examples/tasks/tune-tiny-cpu.yaml"),
                 ("block", "start", TASK, "--sub-goal", "base"),
                 ("measure", TASK, "--metric", "decode_ms=3", "--metric", "prefill_ms=9"),
                 ("measure", TASK, "--metric", "decode_ms=5"),
                 ("measure", TASK, "--metric", "decode_ms=4")):
        r = run_forge(*args, home=workspace.home)
        assert r.returncode == 0, r.stderr
    with open_index(workspace) as s:
        [series] = history(s.con)
    assert (series["metric"], series["direction"]) == ("decode_ms", None)
    assert [(p["block_id"], p["median"], p["n"]) for p in series["points"]] == [("b1", 4.0, 3)]
