"""The diagnosis rules: pure functions over a window of `/metrics` scrapes and a log's lines.

Each rule takes `(scrapes, log, slo, limits)` and returns a `DiagnosisFinding` (the rule's
name, one sentence, and its evidence: the metric values over the window that made it fire,
one per scrape in order, None where a scrape lacked the metric; the log lines with their
numbers, at most `limits.log_evidence` of them) or None. `apply_rules` runs them all, in the
order of `RULES`. Metric names are the `summarize()` short names of SGLang's `sglang:`
families (`num_queue_reqs`, `token_usage`, `generation_tokens_total`, ...).

Every metric name and log string below is SGLang's own, checked against its released
collectors and format strings (tests/data/sglang/golden/, test_sglang_golden_*.py: the golden
healthy pages and lines fire nothing, each unhealthy one exactly its rule). Gauges are
combined over scheduler ranks as metrics.summarize says (counts summed, fill levels the
fullest rank's, other levels the mean; a priority breakdown not counted twice).

What fires (the thresholds are `Limits`):
- `queue_growing`: at least 3 scrapes, `num_queue_reqs` never falls and grows by at least
  `queue_growth` requests from the first scrape to the last.
- `kv_cache_full`: `token_usage` (the fullest rank's) ≥ `kv_full` (0.98) in every scrape.
- `ttft_over_slo`, `tpot_over_slo`: the window's quantile (from the histogram buckets'
  increase between the first and last scrape; a single scrape: since the server started)
  over the SLO's milliseconds. TPOT reads the first family the page has of
  `request_time_per_output_token_seconds` (per request, 0.5.22+),
  `time_per_output_token_seconds` (0.4.x), `inter_token_latency_seconds` (per token gap,
  0.5.0-0.5.21: the only one they have). No request finished in the window: not judged.
- `retractions`: a `*retract*`/`*preempt*` gauge above 0 (`num_retracted_reqs`, 0.5.2+) or
  cumulative one rising (`num_retracted_requests_total`; 0.5.1's `total_retracted_reqs`
  gauge), or SGLang's retraction lines: `KV cache pool is full. Retract requests.`, 0.4.0's
  `Decode out of memory happened.` (a retraction there), a PD decode line's
  `#retracted-req: N` with N > 0 (`#retracted-req: 0` is every healthy line), or a line
  saying requests were preempted.
- `oom`: PyTorch's and CUDA's (`CUDA out of memory`, `OutOfMemoryError`, `CUDA error: out
  of memory`) and SGLang's own: `Prefill|Decode out of memory. Try to lower your batch
  size.`, `Out of memory. Try to lower your batch size.`, `alloc_req_slots runs out of
  memory.`, `Out of memory even after retracting`, `Not enough memory. Please try to
  increase --mem-fraction-static.` (at start).
- `nccl_timeout`: log lines naming NCCL with a timeout, or the watchdog's `Watchdog caught
  collective operation timeout`.
- `cuda_error`: log lines `CUDA error` or `illegal memory access` (an OOM is `oom`'s only,
  a failed graph capture `cuda_graph_capture_failed`'s).
- `scheduler_stalled`: requests running in every scrape while `generation_tokens_total` did
  not move across a window of at least 2 scrapes, or SGLang's watchdog: `Watchdog timeout
  (self.watchdog_timeout=…)` (to 0.5.6), `Scheduler watchdog timeout (self.watchdog_timeout=
  …, self.soft=…)` (0.5.7+), or a line saying the scheduler hangs.
- `dp_rank_imbalance` (attention DP; the per-rank `num_running_reqs` and `token_usage`,
  labelled `dp_rank`/`tp_rank`, 0.5.x): in every scrape the ranks' token usage `dp_usage_spread`
  (0.5) apart, or the busiest rank running `dp_running_ratio` (4) x the ranks' mean and
  `dp_running_gap` (8) more than the idlest. 0.4.x pages have no rank labels: not judged.
- `pd_transfer_failures`: `num_transfer_failed_reqs_total` or `num_bootstrap_failed_reqs_total`
  rising in the window (above 0 in a single scrape), or SGLang's PD lines: `Decode|Prefill
  transfer|bootstrap|handshake failed for request`, `Some requests timed out when
  bootstrapping`, `Some requests fail to receive KV Cache transfer done signal`, `Lost
  connection with prefill instance`.
- `cuda_graph_capture_failed`: `Capture cuda graph failed: …` (any runner's) in the log.
- `spec_accept_collapse`: `spec_accept_length` above 0 (speculative decoding on; 0 is off)
  and under `spec_accept_min` (1.3 tokens per verify step) in every scrape.
- `eplb_imbalance`: the `eplb_balancedness` summary's mean over the window (mean over max
  expert-GPU load; 0.5.7+, exported with `SGLANG_ENABLE_EPLB_BALANCEDNESS_METRIC` (to 0.5.20) or
  `--expert-balancedness-report-mode prometheus` (0.5.21+)) under `eplb_balancedness_min` (0.6).
- `nonfinite_metrics`: a scrape held `NaN`/`+Inf`/`-Inf` samples (legal Prometheus); they
  were left out of every value above (collect.to_scrape), and are named here, but for the
  gauges SGLang sets to NaN meaning "no sample yet" (`NAN_MEANS_UNSET`: `fwd_occupancy`).

Router health (worker removals, circuit breaker) is not judged here: a router's `smg_*`
metrics are on its own Prometheus port, not a server's `/metrics`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ...ledger.events import DiagnosisFinding, LogEvidence
from ..engines.metrics import bucket_quantile


@dataclass(frozen=True)
class Scrape:
    """One scrape: when (epoch seconds), the summarised values, and each histogram's
    cumulative buckets {upper bound: count} summed over its label sets."""

    t: float
    values: Mapping[str, float]
    buckets: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    nonfinite: tuple[str, ...] = ()  # samples that were NaN or infinite (left out)
    # RANK_METRICS' values per scheduler rank (metrics.per_rank), when the page has ranks
    ranks: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class LogLine:
    number: int  # 1-based, in the whole file
    text: str


@dataclass(frozen=True)
class Limits:
    queue_growth: float = 5.0
    kv_full: float = 0.98
    log_evidence: int = 20
    dp_usage_spread: float = 0.5  # busiest minus idlest rank's token_usage
    dp_running_ratio: float = 4.0  # busiest rank's running requests over the ranks' mean
    dp_running_gap: float = 8.0  # ... and at least this many more than the idlest rank
    spec_accept_min: float = 1.3  # accepted tokens per verify step (1.0: no draft accepted)
    eplb_balancedness_min: float = 0.6  # mean/max expert load (1.0: perfectly balanced)


RANK_METRICS = ("num_running_reqs", "token_usage")


Rule = Callable[[Sequence[Scrape], Sequence[LogLine], Mapping[str, float], Limits],
                DiagnosisFinding | None]


def series(scrapes: Sequence[Scrape], name: str) -> tuple[float | None, ...]:
    return tuple(s.values.get(name) for s in scrapes)


def _grep(log: Sequence[LogLine], match: Callable[[str], bool], limits: Limits
          ) -> tuple[int, tuple[LogEvidence, ...]]:
    hits = [ln for ln in log if match(ln.text)]
    return len(hits), tuple(LogEvidence(line=h.number, text=h.text[:500])
                            for h in hits[:limits.log_evidence])


def _log_finding(rule: str, what: str, log: Sequence[LogLine], match: Callable[[str], bool],
                 limits: Limits) -> DiagnosisFinding | None:
    n, ev = _grep(log, match, limits)
    if not n:
        return None
    first = ev[0].line
    return DiagnosisFinding(rule=rule, summary=f"{what}: {n} log line(s), first at line "
                                               f"{first}", log_lines=ev)


# --- metric rules -------------------------------------------------------------------------


def queue_growing(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                  slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    q = series(scrapes, "num_queue_reqs")
    vals = [v for v in q if v is not None]
    if len(vals) < 3 or len(vals) != len(q):
        return None
    if any(b < a for a, b in zip(vals, vals[1:], strict=False)):
        return None
    growth = vals[-1] - vals[0]
    if growth < limits.queue_growth:
        return None
    span = scrapes[-1].t - scrapes[0].t
    rate = f" ({growth / span:.2f}/s)" if span > 0 else ""
    return DiagnosisFinding(
        rule="queue_growing", summary=f"the waiting queue grew in every scrape, from "
        f"{vals[0]:g} to {vals[-1]:g} requests{rate}: arrivals exceed what the server serves",
        metrics={"num_queue_reqs": q, "num_running_reqs": series(scrapes, "num_running_reqs")})


def kv_cache_full(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                  slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    u = series(scrapes, "token_usage")
    if not u or any(v is None or v < limits.kv_full for v in u):
        return None
    low = min(v for v in u if v is not None)
    return DiagnosisFinding(
        rule="kv_cache_full", summary=f"KV cache usage at or above {limits.kv_full:g} in "
        f"every scrape (lowest {low:.3f}): new requests wait or running ones are retracted",
        metrics={"token_usage": u, "num_queue_reqs": series(scrapes, "num_queue_reqs")})


def _window_latency_ms(scrapes: Sequence[Scrape], hist: str, stat: str) -> float | None:
    """The window's `stat` (p50/p90/p95/p99/mean) of histogram `hist`, in milliseconds."""
    first, last = scrapes[0], scrapes[-1]
    single = len(scrapes) == 1
    count = last.values.get(f"{hist}_count")
    total = last.values.get(f"{hist}_sum")
    if count is None or total is None:
        return None
    if not single:
        count -= first.values.get(f"{hist}_count", 0.0)
        total -= first.values.get(f"{hist}_sum", 0.0)
    if count <= 0:
        return None
    if stat == "mean":
        return _finite(total / count * 1000)
    b_last = last.buckets.get(hist, {})
    b_first = {} if single else first.buckets.get(hist, {})
    delta = {le: c - b_first.get(le, 0.0) for le, c in b_last.items()}
    return _finite(bucket_quantile(float(stat[1:]) / 100, delta) * 1000)  # NaN: no buckets


def _finite(v: float) -> float | None:
    """`v`, or None when it is NaN or overflowed: a number forge computes is checked too."""
    return v if math.isfinite(v) else None


# The first family a page has is read: SGLang's per-request TPOT (0.5.22+), 0.4.x's TPOT,
# else (0.5.0-0.5.21, which have no per-request TPOT) the per-token gaps.
LATENCY_HISTOGRAMS = {"ttft_ms": ("time_to_first_token_seconds",),
                      "tpot_ms": ("request_time_per_output_token_seconds",
                                  "time_per_output_token_seconds", "inter_token_latency_seconds")}


def window_latency_ms(scrapes: Sequence[Scrape], key: str, stat: str) -> float | None:
    """`key`'s (ttft_ms, tpot_ms) `stat` over the requests finished between the first and
    last scrape (one scrape: since the server started); None when none finished."""
    if not scrapes:
        return None
    hist = next((h for h in LATENCY_HISTOGRAMS[key] if f"{h}_count" in scrapes[-1].values),
                None)
    return None if hist is None else _window_latency_ms(scrapes, hist, stat)


def _slo_rule(rule: str, what: str, key: str, hists: tuple[str, ...]) -> Rule:
    def check(scrapes: Sequence[Scrape], log: Sequence[LogLine], slo: Mapping[str, float],
              limits: Limits) -> DiagnosisFinding | None:
        if not scrapes:
            return None
        hist = next((h for h in hists if f"{h}_count" in scrapes[-1].values), None)
        if hist is None:
            return None
        over = []
        for name, limit in sorted(slo.items()):
            metric, _, stat = name.partition(".")
            if metric != key:
                continue
            got = _window_latency_ms(scrapes, hist, stat or "p99")
            if got is not None and got > limit:
                over.append(f"{stat} {got:.1f} ms > {limit:g} ms")
        if not over:
            return None
        return DiagnosisFinding(
            rule=rule, summary=f"{what} over the SLO in the window: {', '.join(over)}",
            metrics={f"{hist}_{s}": series(scrapes, f"{hist}_{s}")
                     for s in ("count", "sum", "p50", "p99")})

    check.__name__ = rule
    return check


ttft_over_slo = _slo_rule("ttft_over_slo", "time to first token", "ttft_ms",
                          LATENCY_HISTOGRAMS["ttft_ms"])
tpot_over_slo = _slo_rule("tpot_over_slo", "time per output token", "tpot_ms",
                          LATENCY_HISTOGRAMS["tpot_ms"])

_RETRACT = re.compile(r"retract|preempt", re.I)
# SGLang's retraction lines: the scheduler's `KV cache pool is full. Retract requests.
# #retracted_reqs: N` (0.4.0: `Decode out of memory happened. #retracted_reqs: N`), and a
# PD decode server's periodic `#retracted-req: N` when N > 0 (`#retracted-req: 0` is every
# healthy line). Other wording: a line saying requests were preempted.
_RETRACT_LOG = re.compile(r"Retract requests\.|Decode out of memory happened|"
                          r"#retracted[_-]reqs?: *[1-9]|\bpreempt(ed|ing|ion|s)?\b", re.I)


def _is_cumulative(name: str) -> bool:
    """A counter, or 0.5.1's `total_retracted_reqs` gauge that holds a running total."""
    return name.endswith("_total") or name.startswith("total_")


def retractions(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    names = sorted({k for s in scrapes for k in s.values if _RETRACT.search(k)})
    moved = {}
    for k in names:
        vals = series(scrapes, k)
        xs = [v for v in vals if v is not None]
        if not xs or "token" in k:  # retracted tokens move with retracted requests
            continue
        if (_is_cumulative(k) and len(xs) > 1 and xs[-1] > xs[0]) or (
                not _is_cumulative(k) and max(xs) > 0):
            moved[k] = vals
    n, ev = _grep(log, lambda t: bool(_RETRACT_LOG.search(t)), limits)
    if not moved and not n:
        return None
    parts = ([f"{', '.join(moved)} above zero or rising"] if moved else []) + (
        [f"{n} log line(s) of retracted or preempted requests"] if n else [])
    return DiagnosisFinding(rule="retractions", summary="requests retracted or preempted "
                            f"(KV cache too small for the load): {'; '.join(parts)}",
                            metrics=moved, log_lines=ev)


def scheduler_stalled(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                      slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    running = series(scrapes, "num_running_reqs")
    gen = series(scrapes, "generation_tokens_total")
    metrics_stalled = (len(scrapes) >= 2 and scrapes[-1].t > scrapes[0].t
                       and all(r is not None and r > 0 for r in running)
                       and all(g is not None for g in gen) and gen[0] == gen[-1])
    n, ev = _grep(log, lambda t: bool(_HANG.search(t)), limits)
    if not metrics_stalled and not n:
        return None
    parts = ([f"{running[-1]:g} requests running but no token generated in "
              f"{scrapes[-1].t - scrapes[0].t:.1f} s"] if metrics_stalled else []) + (
        [f"{n} log line(s) of a hung scheduler"] if n else [])
    return DiagnosisFinding(
        rule="scheduler_stalled", summary=f"the scheduler is stalled: {'; '.join(parts)}",
        metrics={"num_running_reqs": running, "generation_tokens_total": gen}
        if metrics_stalled else {}, log_lines=ev)


def dp_rank_imbalance(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                      slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    """Attention-DP ranks unevenly loaded in every scrape: their token usage apart by
    `dp_usage_spread`, or the busiest running `dp_running_ratio` x the mean and
    `dp_running_gap` more than the idlest."""
    def skewed(s: Scrape) -> bool:
        usage = list(s.ranks.get("token_usage", {}).values())
        run = list(s.ranks.get("num_running_reqs", {}).values())
        by_usage = len(usage) > 1 and max(usage) - min(usage) >= limits.dp_usage_spread
        by_run = (len(run) > 1 and max(run) >= limits.dp_running_ratio * sum(run) / len(run)
                  and max(run) - min(run) >= limits.dp_running_gap)
        return by_usage or by_run

    if not scrapes or not all(skewed(s) for s in scrapes):
        return None
    last = scrapes[-1].ranks
    shown = "; ".join(f"{m} " + ", ".join(f"{v:g}" for _, v in sorted(last[m].items()))
                      for m in RANK_METRICS if m in last)
    return DiagnosisFinding(
        rule="dp_rank_imbalance", summary="the attention-DP ranks are unevenly loaded in "
        f"every scrape (per rank, last scrape: {shown}): one rank queues and retracts while "
        "the others idle; check the router's DP balancing (--load-balance-method)",
        metrics={f"{m}_max_rank": tuple(max(s.ranks[m].values()) if s.ranks.get(m) else None
                                        for s in scrapes) for m in RANK_METRICS})


def spec_accept_collapse(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                         slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    """Speculative decoding on (`spec_accept_length` above 0) and accepting under
    `spec_accept_min` tokens per step in every scrape: the draft model no longer helps."""
    a = series(scrapes, "spec_accept_length")
    if not a or any(v is None or not 0 < v < limits.spec_accept_min for v in a):
        return None
    return DiagnosisFinding(
        rule="spec_accept_collapse", summary="speculative decoding accepts "
        f"{max(v for v in a if v is not None):.2f} tokens per step at most (under "
        f"{limits.spec_accept_min:g}): the draft costs more than it saves; check the draft "
        "model against the target and the workload",
        metrics={"spec_accept_length": a, "spec_accept_rate": series(scrapes,
                                                                      "spec_accept_rate")})


def eplb_imbalance(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                   slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    """MoE expert load balancedness (SGLang's `eplb_balancedness` summary: mean over max
    load of the experts' GPUs) under `eplb_balancedness_min` over the window."""
    if not scrapes:
        return None
    last, first = scrapes[-1].values, scrapes[0].values
    count, total = last.get("eplb_balancedness_count"), last.get("eplb_balancedness_sum")
    if count is None or total is None:
        return None
    if len(scrapes) > 1:
        count -= first.get("eplb_balancedness_count", 0.0)
        total -= first.get("eplb_balancedness_sum", 0.0)
    if count <= 0 or total / count >= limits.eplb_balancedness_min:
        return None
    return DiagnosisFinding(
        rule="eplb_imbalance", summary=f"MoE expert load balancedness {total / count:.2f} "
        f"over the window (under {limits.eplb_balancedness_min:g}; 1.0 is even): the "
        "busiest expert GPU sets the pace; enable or retune EPLB (--enable-eplb, "
        "--ep-num-redundant-experts)",
        metrics={k: series(scrapes, k) for k in ("eplb_balancedness_count",
                                                 "eplb_balancedness_sum")})


# Gauges SGLang sets to NaN on purpose, meaning "no sample yet": 0.5.2x's
# `fwd_occupancy` is NaN on every server without its device timer (the default), and after
# an idle spell. Not a fault: left out of the numbers, not named.
NAN_MEANS_UNSET = frozenset({"fwd_occupancy"})


def nonfinite_metrics(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                      slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    seen: dict[str, int] = {}
    for s in scrapes:
        for name in s.nonfinite:
            if name.rpartition(":")[2] not in NAN_MEANS_UNSET:
                seen[name] = seen.get(name, 0) + 1
    if not seen:
        return None
    names = sorted(seen)
    shown = ", ".join(f"{n} ({seen[n]} of {len(scrapes)} scrapes)" for n in names[:10])
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return DiagnosisFinding(
        rule="nonfinite_metrics", summary="the server reported NaN or infinite values, left "
        f"out of every number computed here: {shown}{more}")


# --- log rules ----------------------------------------------------------------------------

# PyTorch's and CUDA's OOM, and SGLang's own: `Prefill/Decode out of memory. Try to lower
# your batch size.` (0.4.0: `{phase} out of memory. ...`), `Out of memory. Try to lower ...`,
# `alloc_req_slots runs out of memory.`, `Out of memory even after retracting ...`, and at
# start `Not enough memory. Please try to increase --mem-fraction-static.` (not 0.4.0's
# `Decode out of memory happened.`: that is a retraction).
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|"
                  r"(?i:out of memory\. Try to lower your batch size)|runs out of memory\.|"
                  r"Out of memory even after retracting|"
                  r"Not enough memory\. Please try to increase --mem-fraction-static")
_NCCL_TIMEOUT = re.compile(r"time[d ]?\s?out", re.I)
# A hung forward: SGLang's watchdog, `Watchdog timeout (self.watchdog_timeout=...)` to
# 0.5.6 and `Scheduler watchdog timeout (self.watchdog_timeout=..., self.soft=...)` after
# (any component's watchdog), or a line saying the scheduler hangs.
_HANG = re.compile(r"scheduler\b.*\b(hang|hangs|hung|stuck|watchdog timeout)|"
                   r"watchdog timeout \(self\.watchdog_timeout=", re.I)
# CUDA graph capture failed at start: `Capture cuda graph failed: {e}` (every release; the
# draft and MTP runners: `Capture ... cuda graph failed`).
_CUDA_GRAPH = re.compile(r"Capture .*cuda graph failed", re.I)
# PD disaggregation: a request's KV transfer or bootstrap failed (`Decode transfer failed
# for request ...`, `Prefill bootstrap failed for request ...`, `Decode handshake failed`),
# or timed out (`Some requests timed out when bootstrapping`, `Some requests fail to receive
# KV Cache transfer done signal`), or the prefill peer was lost.
_PD_FAIL = re.compile(r"(Decode|Prefill) (transfer|bootstrap|handshake) failed for request|"
                      r"Some requests timed out when bootstrapping|"
                      r"Some requests fail to receive KV Cache transfer done signal|"
                      r"Lost connection with prefill instance")
PD_FAILURE_COUNTERS = ("num_transfer_failed_reqs_total", "num_bootstrap_failed_reqs_total")


def oom(scrapes: Sequence[Scrape], log: Sequence[LogLine], slo: Mapping[str, float],
        limits: Limits) -> DiagnosisFinding | None:
    return _log_finding("oom", "GPU out of memory", log, lambda t: bool(_OOM.search(t)),
                        limits)


def _is_nccl_timeout(t: str) -> bool:
    return ("Watchdog caught collective operation timeout" in t
            or ("NCCL" in t and bool(_NCCL_TIMEOUT.search(t))))


def nccl_timeout(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                 slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    return _log_finding("nccl_timeout", "NCCL collective timed out (a rank hung or died)",
                        log, _is_nccl_timeout, limits)


def cuda_error(scrapes: Sequence[Scrape], log: Sequence[LogLine], slo: Mapping[str, float],
               limits: Limits) -> DiagnosisFinding | None:
    return _log_finding(
        "cuda_error", "CUDA error", log,
        lambda t: ("CUDA error" in t or "illegal memory access" in t) and not _OOM.search(t)
        and not _CUDA_GRAPH.search(t), limits)


def cuda_graph_capture_failed(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                              slo: Mapping[str, float], limits: Limits
                              ) -> DiagnosisFinding | None:
    return _log_finding("cuda_graph_capture_failed", "CUDA graph capture failed at start "
                        "(the server does not come up; lower --cuda-graph-max-bs or "
                        "--mem-fraction-static, or --disable-cuda-graph)", log,
                        lambda t: bool(_CUDA_GRAPH.search(t)), limits)


def pd_transfer_failures(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                         slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    moved = {}
    for k in PD_FAILURE_COUNTERS:
        vals = series(scrapes, k)
        xs = [v for v in vals if v is not None]
        if xs and ((len(xs) > 1 and xs[-1] > xs[0]) or (len(scrapes) == 1 and xs[0] > 0)):
            moved[k] = vals
    n, ev = _grep(log, lambda t: bool(_PD_FAIL.search(t)), limits)
    if not moved and not n:
        return None
    parts = ([f"{', '.join(moved)} rising"] if moved else []) + (
        [f"{n} log line(s) of failed or timed-out KV transfers"] if n else [])
    return DiagnosisFinding(rule="pd_transfer_failures", summary="PD disaggregation: KV "
                            f"transfers between prefill and decode failed or timed out: "
                            f"{'; '.join(parts)}", metrics=moved, log_lines=ev)


RULES: dict[str, Rule] = {
    "queue_growing": queue_growing,
    "kv_cache_full": kv_cache_full,
    "ttft_over_slo": ttft_over_slo,
    "tpot_over_slo": tpot_over_slo,
    "retractions": retractions,
    "oom": oom,
    "nccl_timeout": nccl_timeout,
    "cuda_error": cuda_error,
    "scheduler_stalled": scheduler_stalled,
    "dp_rank_imbalance": dp_rank_imbalance,
    "pd_transfer_failures": pd_transfer_failures,
    "cuda_graph_capture_failed": cuda_graph_capture_failed,
    "spec_accept_collapse": spec_accept_collapse,
    "eplb_imbalance": eplb_imbalance,
    "nonfinite_metrics": nonfinite_metrics,
}


def apply_rules(scrapes: Sequence[Scrape], log: Sequence[LogLine] = (),
                slo: Mapping[str, float] | None = None, limits: Limits | None = None
                ) -> list[DiagnosisFinding]:
    """Every rule's finding, in `RULES` order (empty: healthy)."""
    lim = limits or Limits()
    out = []
    for rule in RULES.values():
        f = rule(scrapes, log, slo or {}, lim)
        if f is not None:
            out.append(f)
    return out
