"""Parsing a server's Prometheus `/metrics` text (prometheus_client's own parser).

`parse_prometheus(text)` -> families `{name: {"type", "help", "samples": [...]}}`;
malformed text is a one-line HarnessError naming the source. `summarize(families, prefix)`
-> flat `{short_name: float}`: counters summed over their label sets (under `<name>_total`),
histograms as `<name>_count`, `_sum`, `_mean` and `_p50/_p90/_p99` estimated from the
cumulative buckets the way Prometheus' histogram_quantile does, summaries as `_count`, `_sum`
and `_mean`, and gauges combined per
`gauge_kind` over the scheduler ranks that emit them (SGLang's collector gives every
scheduler process its own series, labelled `tp_rank`, `dp_rank`, `pp_rank`, ...):
- a count (`*_reqs`, `*_tokens`, `num_*`, `gen_throughput`) is summed over the ranks;
- a fill level (`*usage*`, `utilization`, `*occupancy*`) is the fullest rank's (max): one
  rank whose KV cache is full queues and retracts its own requests whatever its peers hold;
- any other level (hit rate, accept length, balancedness, a constant like `context_len`) is
  the mean over the ranks: summing a ratio over 4 ranks made 0.3 read 1.2.
With `--enable-priority-scheduling` a gauge's total is the series labelled `priority=""` and
its per-priority breakdown the series `priority="<n>"` (SGLang's `_log_gauge_queue_count`):
the breakdown is left out of the gauge's value, not counted twice. (Counters and histograms
carry the request's own priority, one series each: summed.) `per_rank(families, name)` gives a
gauge's value per rank, for the rules that compare ranks. A value
that is not finite (a `NaN` or `+Inf` sample, legal in Prometheus text, or a sum that
overflowed) is left out of the summary: forge computes and records only finite numbers
(ledger/numbers.py); `nonfinite(families)` names the samples that were not.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import HarnessError

QUANTILES = (0.5, 0.9, 0.99)


def parse_prometheus(text: str, source: str = "/metrics") -> dict[str, dict[str, Any]]:
    from prometheus_client.parser import text_string_to_metric_families

    if not isinstance(text, str):
        raise HarnessError(f"{source}: expected Prometheus text, got {type(text).__name__}")
    families: dict[str, dict[str, Any]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            entry = families.setdefault(fam.name, {"type": fam.type, "help": fam.documentation,
                                                   "samples": []})
            for s in fam.samples:
                entry["samples"].append({"name": s.name, "labels": dict(s.labels),
                                         "value": float(s.value)})
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise HarnessError(f"{source}: malformed Prometheus text: {' '.join(str(e).split())[:160]}"
                           ) from None
    return families


_COUNT_SUFFIXES = ("_reqs", "_tokens", "_requests")
_FILL_WORDS = ("usage", "utilization", "occupancy")
# Labels that do not tell one scheduler rank from another (the model, the role, a request's
# priority class, a histogram bucket).
_NOT_RANK = frozenset({"model_name", "engine_type", "priority", "le"})


def gauge_kind(short: str) -> str:
    """How a gauge combines over ranks: "count" (sum), "fill" (max) or "level" (mean)."""
    if short.startswith("num_") or short.endswith(_COUNT_SUFFIXES) or short == "gen_throughput":
        return "count"
    return "fill" if any(w in short for w in _FILL_WORDS) else "level"


def rank_key(labels: dict[str, str]) -> str:
    """The rank a sample comes from: its labels but the model, role, priority and bucket
    (`""` on a single-process server)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _NOT_RANK)


def per_rank(families: dict[str, dict[str, Any]], name: str) -> dict[str, float]:
    """Gauge `name`'s finite value per rank (its priority breakdown left out)."""
    fam = families.get(name)
    if fam is None or fam["type"] not in ("gauge", "untyped", "unknown"):
        return {}
    out: dict[str, float] = {}
    for s in fam["samples"]:
        if s["name"] == name and not s["labels"].get("priority") and math.isfinite(s["value"]):
            k = rank_key(s["labels"])
            out[k] = out.get(k, 0.0) + s["value"]  # one series per rank; a sum if more
    return out


def summarize(families: dict[str, dict[str, Any]], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for name, fam in families.items():
        if prefix and not name.startswith(prefix):
            continue
        short = name[len(prefix):]
        kind, samples = fam["type"], fam["samples"]
        if kind in ("gauge", "untyped", "unknown"):
            ranks = [s["value"] for s in samples
                     if s["name"] == name and not s["labels"].get("priority")]
            how = gauge_kind(short)
            if any(not math.isfinite(v) for v in ranks):
                out[short] = math.nan  # left out below, as a sum with it would be
            elif ranks:
                out[short] = (sum(ranks) if how == "count" else max(ranks) if how == "fill"
                              else sum(ranks) / len(ranks))
        elif kind == "counter":
            vals = [s["value"] for s in samples if s["name"] == name + "_total"]
            if vals:
                out[short + "_total"] = sum(vals)
        elif kind == "histogram":
            out.update(_histogram(short, name, samples))
        elif kind == "summary":  # e.g. SGLang's eplb_balancedness: count, sum and mean
            count = sum(s["value"] for s in samples if s["name"] == name + "_count")
            total = sum(s["value"] for s in samples if s["name"] == name + "_sum")
            out.update({f"{short}_count": count, f"{short}_sum": total}
                       | ({f"{short}_mean": total / count} if count > 0 else {}))
    return {k: v for k, v in out.items() if math.isfinite(v)}


def nonfinite(families: dict[str, dict[str, Any]], prefix: str = "") -> list[str]:
    """The sample names (under `prefix`) holding a NaN or infinite value, sorted."""
    return sorted({s["name"] for name, fam in families.items() if name.startswith(prefix)
                   for s in fam["samples"] if not math.isfinite(s["value"])})


def _histogram(short: str, name: str, samples: list[dict[str, Any]]) -> dict[str, float]:
    count = sum(s["value"] for s in samples if s["name"] == name + "_count")
    total = sum(s["value"] for s in samples if s["name"] == name + "_sum")
    buckets: dict[float, float] = {}
    for s in samples:
        if s["name"] == name + "_bucket":
            le = bucket_bound(s["labels"])
            if le is not None and math.isfinite(s["value"]):
                buckets[le] = buckets.get(le, 0.0) + s["value"]
    out = {f"{short}_count": count, f"{short}_sum": total}
    if count > 0:
        out[f"{short}_mean"] = total / count
        for q in QUANTILES:
            v = bucket_quantile(q, buckets)
            if not math.isnan(v):
                out[f"{short}_p{round(q * 100)}"] = v
    return out


def bucket_bound(labels: dict[str, str]) -> float | None:
    """A bucket's `le` as a number (`+Inf` included); None when absent, NaN or not one."""
    try:
        le = float(labels.get("le", "nan"))
    except ValueError:
        return None
    return None if math.isnan(le) else le


def bucket_quantile(q: float, buckets: dict[float, float]) -> float:
    """Quantile from cumulative buckets {upper bound: count}, linear within a bucket."""
    bounds = sorted(buckets)
    if not bounds or math.isnan(bounds[0]):
        return math.nan
    total = buckets[bounds[-1]]
    if total <= 0:
        return math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return prev_bound  # in the +Inf bucket: the largest finite bound
            if c == prev_count:
                return b
            return prev_bound + (b - prev_bound) * (rank - prev_count) / (c - prev_count)
        prev_bound, prev_count = b, c
    return bounds[-1]
