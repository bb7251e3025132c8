"""Serving metrics, defined and named exactly as `sglang.bench_serving` defines them.

`compute_metrics(records, duration_s, slo=None)` is a pure function of per-request records:

- Only successful requests count toward latencies and token totals; `failed` counts the rest.
- TTFT: time from just before the POST to the first chunk with non-empty text.
- ITL: gaps between consecutive non-empty chunks, pooled over all requests (chunk level).
- E2E latency: time to the last SSE line. TPOT per request: (E2E − TTFT) / (output_len − 1),
  only for output_len > 1.
- Throughputs divide by `duration_s` (the measured run, warmup excluded);
  `concurrency` = Σ E2E / duration.
- Statistics: numpy mean / median / std (population) / linear-interpolated percentiles;
  an empty sample gives 0 (as bench_serving's `np.mean(x or 0)`).
- Goodput (when `slo` is given, keys ttft / tpot / e2el in ms): a request is good if it
  succeeded and met every listed SLO (a single-token request has TPOT 0); failed requests stay
  in the attainment denominator. Adds `request_goodput`, `slo_attainment`,
  `slo_attainment_by_metric` and `goodput_slos_ms`.
- Peaks (when records carry `start_time`), over one-second buckets from the first start:
  `max_concurrent_requests` (most requests active during one second — bench_serving's
  definition, not the most in flight at one instant) and `max_output_tokens_per_s` (most
  chunks received in one second). tests/harness/bench/test_metrics_real.py checks every key
  against the `calculate_metrics` of SGLang's released bench clients.
- Finite inputs whose sums or products overflow (times of 1.7e308 s) give inf, never an
  exception: `numeric_metrics` leaves such a metric out with its reason (a chunk whose
  arrival time overflows is in no one-second bucket).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ...ledger.numbers import metric_value
from ..errors import HarnessError

if TYPE_CHECKING:
    pass

STATS = ("mean", "median", "std", "p90", "p95", "p99")
LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")
SLO_KEYS = ("ttft", "tpot", "e2el")
_SLO_ALIASES = {
    "ttft": "ttft", "ttft_ms": "ttft",
    "tpot": "tpot", "tpot_ms": "tpot",
    "e2el": "e2el", "e2el_ms": "e2el", "e2e": "e2el", "e2e_latency": "e2el",
    "e2e_latency_ms": "e2el",
}


@dataclass
class RequestRecord:
    """One measured request. Times are seconds; `start_time` is the client's perf_counter
    just before the POST (only its differences mean anything)."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    start_time: float | None = None
    generated_text: str = ""
    output_ids: list[int] | None = None
    index: int = 0
    warmup: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> RequestRecord:
        # `latency` is bench_serving's name for E2E.
        e2e = m.get("e2e", m.get("latency", 0.0))
        return cls(
            success=bool(m.get("success", False)),
            error=str(m.get("error") or ""),
            prompt_len=int(m.get("prompt_len", 0) or 0),
            output_len=int(m.get("output_len", 0) or 0),
            ttft=float(m.get("ttft", 0.0) or 0.0),
            itl=[float(x) for x in (m.get("itl") or [])],
            e2e=float(e2e or 0.0),
            start_time=m.get("start_time"),
            generated_text=str(m.get("generated_text") or ""),
            output_ids=m.get("output_ids"),
            index=int(m.get("index", 0) or 0),
            warmup=bool(m.get("warmup", False)),
        )


def parse_slo(slo: Mapping[str, Any] | Iterable[str] | None) -> dict[str, float] | None:
    """Normalize SLOs to {"ttft"|"tpot"|"e2el": ms}. Accepts a mapping or bench_serving's
    `KEY:MS` strings. Raises HarnessError naming the bad entry."""
    if slo is None:
        return None
    if isinstance(slo, Mapping):
        items = list(slo.items())
    else:
        items = []
        for pair in slo:
            key, sep, value = str(pair).partition(":")
            if not sep:
                raise HarnessError(f"SLO {pair!r} is not KEY:MS (keys: ttft, tpot, e2el)")
            items.append((key, value))
    if not items:
        return None
    out: dict[str, float] = {}
    for key, value in items:
        name = _SLO_ALIASES.get(str(key).strip().lower())
        if name is None:
            raise HarnessError(f"SLO key {key!r} is not one of ttft, tpot, e2el")
        if name in out:
            raise HarnessError(f"SLO key {key!r} given twice")
        try:
            ms = float(value)
        except (TypeError, ValueError):
            raise HarnessError(f"SLO {key}={value!r} is not a number of milliseconds") from None
        if not math.isfinite(ms) or ms <= 0:
            raise HarnessError(f"SLO {key}={value!r} must be a positive finite number of ms")
        out[name] = ms
    return out


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    import numpy as np  # here: most commands that import the bench never compute metrics

    a = np.asarray(values, dtype=np.float64) if len(values) else np.zeros(1)
    # Finite samples may overflow here (a mean of 1.7e308s): inf, left out by
    # numeric_metrics with its reason, not a warning.
    with np.errstate(over="ignore", invalid="ignore"):
        p90, p95, p99 = np.percentile(a, [90, 95, 99])
        return {
            f"mean_{name}_ms": float(np.mean(a) * 1000),
            f"median_{name}_ms": float(np.median(a) * 1000),
            f"std_{name}_ms": float(np.std(a) * 1000),
            f"p90_{name}_ms": float(p90 * 1000),
            f"p95_{name}_ms": float(p95 * 1000),
            f"p99_{name}_ms": float(p99 * 1000),
        }


def request_tpot(r: RequestRecord) -> float | None:
    """TPOT of one request in seconds, None when output_len ≤ 1."""
    if r.output_len > 1:
        return (r.e2e - r.ttft) / (r.output_len - 1)
    return None


def _peaks(ok: Sequence[RequestRecord]) -> dict[str, float]:
    """bench_serving's two peaks, over one-second buckets counted from the first start:
    `max_output_tokens_per_s`, the most chunks (≈ tokens) received in one bucket, and
    `max_concurrent_requests`, the most requests *active during* one bucket (a request counts
    in every second from its start's to its end's, so two short requests one after the other
    in one second count 2: not the most in flight at one instant). The same arithmetic as its
    `calculate_metrics`, without its array (a sweep over the buckets' edges), so an overflowing
    time is skipped instead of sizing an array."""
    timed = [(r.start_time, r) for r in ok if r.start_time is not None]
    if not timed:
        return {}
    t0 = min(s for s, _ in timed)
    span = max(s + r.e2e for s, r in timed) - t0
    n = int(math.ceil(span)) + 1 if math.isfinite(span) else None  # buckets [0, n)
    buckets: dict[int, int] = {}

    def count(t: float) -> None:
        if math.isfinite(t - t0) and 0 <= int(t - t0) and (n is None or int(t - t0) < n):
            buckets[int(t - t0)] = buckets.get(int(t - t0), 0) + 1

    edges: list[tuple[int, int]] = []  # (second, +1 from it on / -1 from it on)
    for s, r in timed:
        t = s + r.ttft
        count(t)
        for gap in r.itl:
            t += gap
            count(t)
        end = s + r.e2e - t0
        if math.isfinite(end):
            edges += [(int(s - t0), 1), (int(end) + 1, -1)]
    cur = peak = 0
    for _, d in sorted(edges):  # at one second, the ends (-1) before the starts
        cur += d
        peak = max(peak, cur)
    return {"max_concurrent_requests": float(peak),
            "max_output_tokens_per_s": float(max(buckets.values(), default=0))}


def compute_metrics(
    records: Iterable[RequestRecord | Mapping[str, Any]],
    duration_s: float,
    slo: Mapping[str, Any] | Iterable[str] | None = None,
) -> dict[str, Any]:
    """bench_serving's metrics of `records` over a run of `duration_s` seconds (module doc)."""
    if not (isinstance(duration_s, int | float) and math.isfinite(duration_s) and duration_s > 0):
        raise HarnessError(f"duration_s={duration_s!r} must be a positive number of seconds")
    recs = [r if isinstance(r, RequestRecord) else RequestRecord.from_mapping(r) for r in records]
    recs = [r for r in recs if not r.warmup]
    slos = parse_slo(slo)
    ok = [r for r in recs if r.success]
    ttfts = [r.ttft for r in ok]
    e2es = [r.e2e for r in ok]
    tpots = [t for t in (request_tpot(r) for r in ok) if t is not None]
    itls = [gap for r in ok for gap in r.itl]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    completed = len(ok)
    m: dict[str, Any] = {
        "duration": float(duration_s),
        "completed": completed,
        "failed": len(recs) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / duration_s,
        "input_throughput": total_in / duration_s,
        "output_throughput": total_out / duration_s,
        "total_throughput": (total_in + total_out) / duration_s,
    }
    for name, values in (("e2e_latency", e2es), ("ttft", ttfts), ("tpot", tpots), ("itl", itls)):
        m.update(_stats(name, values))
    m["max_itl_ms"] = float(max(itls, default=0.0) * 1000)
    m["concurrency"] = float(sum(e2es) / duration_s)
    m.update(_peaks(ok))
    if slos:
        m.update(_goodput(recs, duration_s, slos))
    return m


def _goodput(recs: Sequence[RequestRecord], duration_s: float,
             slos: Mapping[str, float]) -> dict[str, Any]:
    passed = dict.fromkeys(slos, 0)
    good = 0
    for r in recs:
        if not r.success:
            continue  # a miss on every SLO, still in the denominator
        tpot = request_tpot(r)
        observed = {"ttft": r.ttft * 1000, "tpot": (tpot or 0.0) * 1000, "e2el": r.e2e * 1000}
        met = {k: observed[k] <= limit for k, limit in slos.items()}
        for k, v in met.items():
            passed[k] += v
        good += all(met.values())
    n = len(recs)
    return {
        "goodput_slos_ms": dict(slos),
        "request_goodput": good / duration_s,
        "slo_attainment": good / n if n else 0.0,
        "slo_attainment_by_metric": {k: (passed[k] / n if n else 0.0) for k in slos},
    }


def numeric_metrics(metrics: Mapping[str, Any],
                    omitted: dict[str, str] | None = None) -> dict[str, float]:
    """Flatten a metrics dict to name -> float for a MeasurementRecorded event: nested dicts
    become `<key>.<sub>` (e.g. `slo_attainment_by_metric.ttft`); None and text are dropped.
    A number that is not finite (NaN, infinity, too large) is left out, and when `omitted`
    is given it gets the name and the reason (callers keep it in the event's meta)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, int | float):
            f, why = metric_value(v)
            if f is not None:
                out[k] = f
            elif omitted is not None:
                omitted[str(k)] = str(why)
        elif isinstance(v, Mapping):
            sub_omitted: dict[str, str] = {}
            for sub, x in numeric_metrics(v, sub_omitted).items():
                out[f"{k}.{sub}"] = x
            if omitted is not None:
                omitted.update({f"{k}.{sub}": why for sub, why in sub_omitted.items()})
    return out
