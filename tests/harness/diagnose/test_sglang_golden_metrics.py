"""`/metrics` pages rendered by real SGLang releases' own collector classes (one process per
scheduler rank, prometheus_client's multiprocess mode, as the server renders them) against
the golden pages, and the verdicts diagnose gives on them; the project's metrics stand-in
checked against the real page."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from infer_forge.harness.diagnose.collect import to_scrape
from infer_forge.harness.diagnose.rules import apply_rules
from infer_forge.harness.engines.metrics import parse_prometheus, summarize
from infer_forge.harness.testing.sglang_metrics import sglang_metrics

from ...helpers import real_sglang
from .sglang_golden import GOLDEN, GOLDEN_VERSIONS, metrics_path, render_metrics

# case -> the rules that must fire on its pages (all releases that have the case), and the
# releases where the case looks different
VERDICTS: dict[str, set[str]] = {
    "healthy": set(), "dp4_decode": set(), "priority": set(), "spec_healthy": set(),
    "eplb_healthy": set(), "queue_growing": {"queue_growing"}, "kv_full": {"kv_cache_full"},
    "retracting": {"retractions"}, "dp4_imbalance": {"dp_rank_imbalance"},
    "spec_collapse": {"spec_accept_collapse"}, "eplb_imbalance": {"eplb_imbalance"},
    "pd_transfer_failed": {"pd_transfer_failures"},
}
# 0.4.0 labels its gauges with the model only (and sums or keeps the latest rank's value in
# multiprocess mode): ranks cannot be told apart, so an imbalance is not seen.
NOT_SEEN = {("0.4.0", "dp4_imbalance")}


def _golden(version: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for case in VERDICTS:
        k = 0
        while metrics_path(version, case, k).exists():
            out.setdefault(case, []).append(metrics_path(version, case, k).read_text())
            k += 1
    return out


def _scrapes(pages: list[str]) -> list:
    return [to_scrape(5.0 * k, page, f"golden page {k}") for k, page in enumerate(pages)]


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, list[str] | str]]:
    """Every golden release's pages, rendered now from its wheel (one child per release)."""
    for v in GOLDEN_VERSIONS:
        real_sglang.release(v)  # skip or fail here, not in a worker thread
    with ThreadPoolExecutor(len(GOLDEN_VERSIONS)) as pool:
        pages = pool.map(lambda v: render_metrics(v, real_sglang.run), GOLDEN_VERSIONS)
        return dict(zip(GOLDEN_VERSIONS, pages, strict=True))


def test_golden_pages_are_what_the_releases_render(rendered):
    for v, cases in rendered.items():
        golden = _golden(v)
        for case, pages in cases.items():
            if isinstance(pages, str):  # the release lacks the case's metric
                assert case not in golden, f"{v} {case}: golden pages but {pages}"
                continue
            assert golden.get(case) == pages, (
                f"{v} {case}: the golden page differs from what the release renders now; "
                "regenerate: python tests/harness/diagnose/sglang_golden.py regen")
        assert set(golden) <= set(cases)
    files = {p.name for p in (GOLDEN / "metrics").glob("*.txt")}
    assert files == {metrics_path(v, c, k).name for v in rendered for c, pages in
                     rendered[v].items() if isinstance(pages, list) for k in range(len(pages))}


@pytest.mark.parametrize("version", GOLDEN_VERSIONS)
def test_each_golden_page_gets_exactly_its_verdict(version):
    golden = _golden(version)
    assert {"healthy", "dp4_decode", "queue_growing", "kv_full"} <= set(golden)
    for case, pages in golden.items():
        want = set() if (version, case) in NOT_SEEN else VERDICTS[case]
        got = {f.rule for f in apply_rules(_scrapes(pages))}
        assert got == want, f"{version} {case}: fired {sorted(got)}, expected {sorted(want)}"


@pytest.mark.parametrize("version", ["0.5.6", "0.5.23"])
def test_ratios_are_per_rank_and_priority_totals_count_once(version):
    """4 attention-DP ranks at 30 % KV each read 0.3, not 1.2; with priority scheduling the
    running count is the `priority=""` total, not total + per-priority breakdown."""
    dp4 = summarize(parse_prometheus(metrics_path(version, "dp4_decode", 0).read_text()),
                    "sglang:")
    assert dp4["token_usage"] == pytest.approx(0.3)
    assert dp4["cache_hit_rate"] == pytest.approx(0.45)
    assert dp4["num_running_reqs"] == 32  # 8 on each of 4 ranks: a count adds up
    imbalance = to_scrape(0.0, metrics_path(version, "dp4_imbalance", 0).read_text(), "p")
    assert imbalance.values["token_usage"] == pytest.approx(0.93)  # the fullest rank
    assert sorted(imbalance.ranks["num_running_reqs"].values()) == [2, 3, 3, 48]
    if version == "0.5.23":
        prio = summarize(parse_prometheus(metrics_path(version, "priority", 0).read_text()),
                         "sglang:")
        assert prio["num_running_reqs"] == 8 and prio["num_queue_reqs"] == 0


def test_tpot_reads_the_releases_own_tpot_family():
    """0.5.22+ TPOT is `request_time_per_output_token_seconds` (per request, here <= 30 ms);
    its per-token gaps, with prefill stalls, have a p99 far above. 0.4.0 has
    `time_per_output_token_seconds`; 0.5.0-0.5.21 only the per-token gaps."""
    slo = {"tpot_ms.p99": 50.0}
    for version, fires in (("0.4.0", False), ("0.5.6", True), ("0.5.23", False)):
        pages = [metrics_path(version, "healthy", k).read_text() for k in range(2)]
        got = {f.rule for f in apply_rules(_scrapes(pages), slo=slo)}
        assert ("tpot_over_slo" in got) is fires, (version, got)


def _shape(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Family -> (type, label names of its samples but `le`)."""
    return {name: (fam["type"], frozenset(k for s in fam["samples"] for k in s["labels"]
                                          if k != "le"))
            for name, fam in parse_prometheus(text).items()}


def test_the_stand_in_page_has_the_real_families_types_and_labels():
    real = _shape(metrics_path("0.5.23", "healthy", 0).read_text())
    ours = _shape(sglang_metrics(retracted=0))
    for name, (kind, labels) in ours.items():
        assert name in real, f"stand-in family {name} is not in SGLang 0.5.23's page"
        assert real[name] == (kind, labels), f"{name}: stand-in {kind} {sorted(labels)}, " \
            f"SGLang 0.5.23 {real[name][0]} {sorted(real[name][1])}"


def _collector_source(version: str) -> str:
    root = real_sglang.release(version) / "sglang" / "srt"
    path = next(p for p in (root / "observability" / "metrics_collector.py",
                            root / "metrics" / "collector.py") if p.exists())
    return path.read_text()


# Every `sglang:` family a rule reads, and the first kit release whose collector has it.
RULE_FAMILIES = {
    "num_queue_reqs": "0.4.0", "num_running_reqs": "0.4.0", "token_usage": "0.4.0",
    "generation_tokens_total": "0.4.0", "time_to_first_token_seconds": "0.4.0",
    "spec_accept_length": "0.5.1", "spec_accept_rate": "0.5.6",
    "num_transfer_failed_reqs": "0.5.1", "num_bootstrap_failed_reqs": "0.5.1",
    "num_retracted_reqs": "0.5.6", "eplb_balancedness": "0.5.13",
}


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@pytest.mark.parametrize("version", real_sglang.KIT_VERSIONS)
def test_the_rules_read_families_the_release_has(version):
    """Names from the release's collector source: a rule reading a name no release emits
    (or TPOT read from the wrong family of a release) fails here."""
    from infer_forge.harness.diagnose.rules import LATENCY_HISTOGRAMS

    src = _collector_source(version)
    for fam, since in RULE_FAMILIES.items():
        assert (f'"sglang:{fam}' in src) is (_v(version) >= _v(since)), (version, fam)
    tpot = next(h for h in LATENCY_HISTOGRAMS["tpot_ms"] if f'"sglang:{h}"' in src)
    want = ("time_per_output_token_seconds" if _v(version) < (0, 5, 0) else
            "inter_token_latency_seconds" if _v(version) < (0, 5, 22) else
            "request_time_per_output_token_seconds")
    assert tpot == want, version
