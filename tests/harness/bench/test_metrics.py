"""compute_metrics against constructed timelines (definitions of sglang.bench_serving)."""

from __future__ import annotations

import numpy as np
import pytest
from infer_forge.harness.bench.metrics import (
    RequestRecord,
    compute_metrics,
    numeric_metrics,
    parse_slo,
)
from infer_forge.harness.errors import HarnessError

# The key names bench_serving writes (0.5.x), which ours must match exactly.
SGLANG_KEYS = {
    "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput", "concurrency", "duration",
    "max_itl_ms",
    *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p90", "p95", "p99")
      for m in ("ttft", "tpot", "itl", "e2e_latency")),
}


def rec(ttft, itl, output_len, prompt_len=10, success=True, start=None, **kw):
    return RequestRecord(success=success, prompt_len=prompt_len, output_len=output_len,
                         ttft=ttft, itl=list(itl), e2e=ttft + sum(itl), start_time=start, **kw)


def test_constructed_timeline_gives_bench_serving_definitions():
    # Three requests that succeeded, one that failed (its numbers must not count).
    rs = [
        rec(0.100, [0.010, 0.020, 0.030], 4, prompt_len=10),  # e2e 0.160, tpot 0.020
        rec(0.200, [0.040], 2, prompt_len=20),  # e2e 0.240, tpot 0.040
        rec(0.300, [], 1, prompt_len=30),  # e2e 0.300, single token: no tpot
        RequestRecord(success=False, error="HTTP 500", prompt_len=99, output_len=0,
                      ttft=9.0, e2e=9.0),
    ]
    m = compute_metrics(rs, duration_s=2.0)
    assert SGLANG_KEYS <= m.keys()
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 7)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(30.0)
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["total_throughput"] == pytest.approx(33.5)
    ttfts = np.array([0.1, 0.2, 0.3])
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(np.std(ttfts) * 1000)
    assert m["p90_ttft_ms"] == pytest.approx(280.0)  # linear interpolation
    assert m["p99_ttft_ms"] == pytest.approx(298.0)
    # TPOT = (E2E − TTFT)/(output_len − 1), only for output_len > 1.
    assert m["mean_tpot_ms"] == pytest.approx(30.0)
    assert m["median_tpot_ms"] == pytest.approx(30.0)
    # ITL pooled over requests: [10, 20, 30, 40] ms.
    assert m["mean_itl_ms"] == pytest.approx(25.0)
    assert m["median_itl_ms"] == pytest.approx(25.0)
    assert m["p95_itl_ms"] == pytest.approx(np.percentile([10, 20, 30, 40], 95))
    assert m["max_itl_ms"] == pytest.approx(40.0)
    # E2E and concurrency = Σ E2E / duration.
    assert m["mean_e2e_latency_ms"] == pytest.approx((160 + 240 + 300) / 3)
    assert m["concurrency"] == pytest.approx(0.7 / 2.0)
    assert "request_goodput" not in m


def test_empty_samples_are_zero_and_all_failed_is_reported():
    m = compute_metrics([RequestRecord(success=False, error="boom")], 1.0)
    assert m["completed"] == 0 and m["failed"] == 1
    assert m["mean_ttft_ms"] == 0.0 and m["p99_itl_ms"] == 0.0 and m["concurrency"] == 0.0


def test_warmup_records_are_excluded():
    rs = [rec(5.0, [1.0], 2, warmup=True), rec(0.1, [0.01], 2)]
    m = compute_metrics(rs, 1.0)
    assert m["completed"] == 1 and m["mean_ttft_ms"] == pytest.approx(100.0)


def test_peaks_from_start_times():
    rs = [rec(0.1, [0.1], 2, start=0.0),  # in flight [0.0, 0.2]
          rec(0.1, [0.1], 2, start=0.1),  # [0.1, 0.3]
          rec(0.1, [0.1], 2, start=0.2),  # [0.2, 0.4]: starts as the first ends
          rec(0.1, [0.1], 2, start=1.5)]
    m = compute_metrics(rs, 2.0)
    # bench_serving's definition: requests active during one second (not at one instant)
    assert m["max_concurrent_requests"] == 3.0
    assert m["max_output_tokens_per_s"] == 6.0  # six chunks in second 0, two in second 1


def test_mappings_with_bench_serving_names_are_accepted():
    m = compute_metrics([{"success": True, "ttft": 0.1, "latency": 0.3, "itl": [0.2],
                          "output_len": 2, "prompt_len": 5}], 1.0)
    assert m["mean_e2e_latency_ms"] == pytest.approx(300.0)
    assert m["mean_tpot_ms"] == pytest.approx(200.0)


# The goodput case of sglang's own unit test (test_bench_serving_goodput): ttft / tpot / e2el
# in ms: 100/100/900, 500/100/900, 200/200/2200, 200/0/200 (single token), one failed request.
GOODPUT_OUTPUTS = [
    RequestRecord(success=True, ttft=0.1, e2e=0.9, output_len=9),
    RequestRecord(success=True, ttft=0.5, e2e=0.9, output_len=5),
    RequestRecord(success=True, ttft=0.2, e2e=2.2, output_len=11),
    RequestRecord(success=True, ttft=0.2, e2e=0.2, output_len=1),
    RequestRecord(success=False, ttft=0.0, e2e=0.0, output_len=0),
]


def test_goodput_matches_sglang_definition():
    m = compute_metrics(GOODPUT_OUTPUTS, 10.0, slo={"ttft": 300, "tpot": 150, "e2el": 1000})
    assert m["request_goodput"] == pytest.approx(2 / 10)
    assert m["slo_attainment"] == pytest.approx(2 / 5)  # the failed request stays counted
    assert m["slo_attainment_by_metric"] == pytest.approx({"ttft": 3 / 5, "tpot": 3 / 5,
                                                           "e2el": 3 / 5})
    only = compute_metrics(GOODPUT_OUTPUTS, 10.0, slo=["ttft:300"])
    assert only["request_goodput"] == pytest.approx(3 / 10)
    assert only["slo_attainment_by_metric"] == pytest.approx({"ttft": 3 / 5})


@pytest.mark.parametrize("pairs", [["itl:10"], ["ttft"], ["ttft:fast"], ["ttft:0"], ["ttft:-5"],
                                   ["ttft:inf"], ["ttft:100", "ttft:200"]])
def test_invalid_slos_are_rejected(pairs):
    with pytest.raises(HarnessError):
        parse_slo(pairs)


def test_bad_duration_is_an_error():
    with pytest.raises(HarnessError, match="duration_s"):
        compute_metrics([], 0)


def test_numeric_metrics_flattens_for_events():
    m = compute_metrics(GOODPUT_OUTPUTS, 10.0, slo={"ttft": 300})
    flat = numeric_metrics(m)
    assert flat["slo_attainment_by_metric.ttft"] == pytest.approx(0.6)
    assert flat["goodput_slos_ms.ttft"] == 300.0
    assert all(isinstance(v, float) for v in flat.values())
