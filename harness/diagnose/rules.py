"""The diagnosis rules: pure functions over a window of `/metrics` scrapes and a log's lines.

Each rule takes `(scrapes, log, slo, limits)` and returns a `DiagnosisFinding` (the rule's
name, one sentence, and its evidence: the metric values over the window that made it fire,
one per scrape in order, None where a scrape lacked the metric; the log lines with their
numbers, at most `limits.log_evidence` of them) or None. `apply_rules` runs them all, in the
order of `RULES`. Metric names are the `summarize()` short names of SGLang's `sglang:`
families (`num_queue_reqs`, `token_usage`, `generation_tokens_total`, ...).

What fires (the thresholds are `Limits`):
- `queue_growing`: at least 3 scrapes, `num_queue_reqs` never falls and grows by at least
  `queue_growth` requests from the first scrape to the last.
- `kv_cache_full`: `token_usage` ≥ `kv_full` (0.98) in every scrape.
- `ttft_over_slo`, `tpot_over_slo`: the window's quantile (from the histogram buckets'
  increase between the first and last scrape; a single scrape: since the server started)
  over the SLO's milliseconds. TPOT reads `time_per_output_token_seconds`, else
  `inter_token_latency_seconds`. No request finished in the window: not judged.
- `retractions`: a `*retract*`/`*preempt*` gauge above 0 or counter increasing in the
  window, or log lines saying requests were retracted or preempted.
- `oom`: log lines `CUDA out of memory`, `OutOfMemoryError`, `CUDA error: out of memory`.
- `nccl_timeout`: log lines naming NCCL with a timeout, or the watchdog's `Watchdog caught
  collective operation timeout`.
- `cuda_error`: log lines `CUDA error` or `illegal memory access` (an OOM is `oom`'s only).
- `scheduler_stalled`: requests running in every scrape while `generation_tokens_total` did
  not move across a window of at least 2 scrapes, or log lines saying the scheduler hangs
  (SGLang's `Scheduler watchdog timeout`).
- `nonfinite_metrics`: a scrape held `NaN`/`+Inf`/`-Inf` samples (legal Prometheus); they
  were left out of every value above (collect.to_scrape), and are named here.
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


@dataclass(frozen=True)
class LogLine:
    number: int  # 1-based, in the whole file
    text: str


@dataclass(frozen=True)
class Limits:
    queue_growth: float = 5.0
    kv_full: float = 0.98
    log_evidence: int = 20


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


LATENCY_HISTOGRAMS = {"ttft_ms": ("time_to_first_token_seconds",),
                      "tpot_ms": ("time_per_output_token_seconds", "inter_token_latency_seconds")}


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


def retractions(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    names = sorted({k for s in scrapes for k in s.values if _RETRACT.search(k)})
    moved = {}
    for k in names:
        vals = series(scrapes, k)
        xs = [v for v in vals if v is not None]
        if not xs:
            continue
        if (k.endswith("_total") and len(xs) > 1 and xs[-1] > xs[0]) or (
                not k.endswith("_total") and max(xs) > 0):
            moved[k] = vals
    n, ev = _grep(log, lambda t: bool(_RETRACT.search(t)), limits)
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


def nonfinite_metrics(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                      slo: Mapping[str, float], limits: Limits) -> DiagnosisFinding | None:
    seen: dict[str, int] = {}
    for s in scrapes:
        for name in s.nonfinite:
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

_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")
_NCCL_TIMEOUT = re.compile(r"time[d ]?\s?out", re.I)
_HANG = re.compile(r"scheduler\b.*\b(hang|hangs|hung|stuck|watchdog timeout)", re.I)


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
        lambda t: ("CUDA error" in t or "illegal memory access" in t) and not _OOM.search(t),
        limits)


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
