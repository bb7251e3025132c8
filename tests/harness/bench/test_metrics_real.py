"""Our serving metrics against SGLang's own: the same records through the released bench
clients' `calculate_metrics` (and 0.5.23's `calculate_goodput`), run under the kit, and through
`compute_metrics`; every key both have must agree."""

from __future__ import annotations

import json
import math
import random

import pytest
from infer_forge.harness.bench.metrics import compute_metrics

from ...conftest import TESTS
from ...helpers import real_sglang

SCRIPT = TESTS / "data" / "sglang" / "kit" / "calculate_metrics.py"
# Theirs → ours, for the keys named differently.
RENAMED = {"total_input": "total_input_tokens", "total_output": "total_output_tokens"}


def records(seed: int, n: int = 40) -> tuple[list[dict], float]:
    """Mixed outcomes: failures, single-token outputs (no TPOT), overlapping and back-to-back
    requests (the peaks' one-second buckets), arrival gaps over a second."""
    rnd = random.Random(seed)
    out, t = [], 100.0
    for _ in range(n):
        ok = rnd.random() > 0.15
        k = rnd.choice([1, 2, 5, 17])
        ttft = rnd.uniform(0.01, 0.9)
        itl = [rnd.uniform(0.001, 0.3) for _ in range(k - 1)]
        out.append({"success": ok, "error": "" if ok else "HTTP 500", "prompt_len":
                    rnd.randint(1, 50), "output_len": k if ok else 0,
                    "ttft": ttft if ok else 0.0, "itl": itl if ok else [],
                    "e2e": ttft + sum(itl) + rnd.uniform(0, 0.01) if ok else 0.0,
                    "start_time": t, "generated_text": "a b c"})
        t += rnd.choice([0.0, rnd.uniform(0, 0.4), rnd.uniform(1.0, 2.5)])
    return out, t - 100.0 + 1.0


def theirs(version: str, cases: list[dict], tmp_path) -> list[dict]:
    f = tmp_path / f"{version}.json"
    f.write_text(json.dumps(cases))
    return json.loads(real_sglang.run(version, SCRIPT, str(f)))  # one child for all cases


def agree(real: dict, ours: dict) -> list[str]:
    bad = []
    for key, value in real.items():
        mine = ours.get(RENAMED.get(key, key))
        if mine is None or isinstance(value, dict) or key.endswith("_retokenized") \
                or key.startswith("total_input_"):
            continue  # retokenized and text/vision counts need the tokenizer and dataset
        if not math.isclose(float(mine), float(value), rel_tol=1e-9, abs_tol=1e-9):
            bad.append(f"{key}: sglang {value} vs ours {mine}")
    return bad


@pytest.mark.parametrize("version", [real_sglang.LATEST, "0.5.6", "0.4.0"])
def test_every_shared_metric_equals_the_release_calculate_metrics(version, tmp_path):
    cases = [dict(zip(("records", "duration"), records(seed), strict=True), slo=None)
             for seed in (1, 2)]
    if version == real_sglang.LATEST:  # goodput arrived in the client with 0.5.23
        cases[1]["slo"] = {"ttft": 500.0, "tpot": 100.0, "e2el": 2000.0}
    for case, real in zip(cases, theirs(version, cases, tmp_path), strict=True):
        ours = compute_metrics(case["records"], case["duration"], case["slo"])
        assert agree(real, ours) == []
        shared = {RENAMED.get(k, k) for k in real} & ours.keys()
        assert {"max_concurrent_requests", "max_output_tokens_per_s", "p99_itl_ms",
                "concurrency"} <= shared or version == "0.4.0"
        if case["slo"]:
            assert real["slo_attainment_by_metric"] == pytest.approx(
                ours["slo_attainment_by_metric"])
            assert real["request_goodput"] == pytest.approx(ours["request_goodput"])


def test_max_concurrent_requests_counts_requests_active_in_a_second():
    """bench_serving's definition (checked above against the release): two requests one after
    the other inside one second count 2, though at most one was ever in flight."""
    rs = [{"success": True, "output_len": 2, "ttft": 0.1, "itl": [0.1], "e2e": 0.2,
           "start_time": 0.0},
          {"success": True, "output_len": 2, "ttft": 0.1, "itl": [0.1], "e2e": 0.2,
           "start_time": 0.5}]
    assert compute_metrics(rs, 1.0)["max_concurrent_requests"] == 2.0
