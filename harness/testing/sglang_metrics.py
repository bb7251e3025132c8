"""Prometheus `/metrics` text shaped like SGLang 0.5.23's (`sglang:` gauges, counters and
histograms with its labels), for tests and benchmarks of `forge diagnose` and `forge monitor`.

Checked against the page SGLang 0.5.23's own collectors render
(tests/data/sglang/golden/metrics/0.5.23-healthy.0.txt, test_sglang_golden_metrics.py): the
same family names, types and label names. The scheduler's gauges carry its rank labels
(`engine_type`, `model_name`, `moe_ep_rank`, `pp_rank`, `tp_rank`; `num_retracted_reqs`, a
gauge without a multiprocess mode, also the process's `pid`); the tokenizer's counters and
histograms carry `engine_type`, `model_name` and, for a finished request's, `is_streaming`.
TPOT is SGLang's per-request `request_time_per_output_token_seconds` (0.5.22+), next to the
per-token `inter_token_latency_seconds`.

`sglang_metrics(...)` renders one scrape from the values given: the gauges as they are, the
counters as totals, and the TTFT / TPOT histograms from per-request latencies (seconds) put
into SGLang's bucket bounds. `pad_families` adds that many extra labelled series (to make a
page of a given size, as a server with many models or ranks serves).
"""

from __future__ import annotations

from collections.abc import Sequence

LABELS = 'engine_type="unified",model_name="scripted",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
TOKENIZER = 'engine_type="unified",model_name="scripted"'
STREAMING = TOKENIZER + ',is_streaming="true"'
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1,
                0.25, 0.5, 1.0)


def _gauge(name: str, help_: str, value: float, labels: str = LABELS) -> str:
    return (f"# HELP sglang:{name} {help_}\n# TYPE sglang:{name} gauge\n"
            f"sglang:{name}{{{labels}}} {float(value)}\n")


def _counter(name: str, help_: str, value: float, labels: str = STREAMING) -> str:
    # prometheus_client's exposition names a counter's HELP/TYPE with the `_total` (a
    # parser reads `sglang:X_total` under the counter family `sglang:X`)
    return (f"# HELP sglang:{name}_total {help_}\n# TYPE sglang:{name}_total counter\n"
            f"sglang:{name}_total{{{labels}}} {float(value)}\n")


def _histogram(name: str, help_: str, bounds: Sequence[float], values: Sequence[float],
               labels: str = STREAMING) -> str:
    lines = [f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} histogram"]
    for b in bounds:
        n = sum(1 for v in values if v <= b)
        lines.append(f'sglang:{name}_bucket{{{labels},le="{b}"}} {float(n)}')
    lines.append(f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(len(values))}')
    lines.append(f"sglang:{name}_count{{{labels}}} {float(len(values))}")
    lines.append(f"sglang:{name}_sum{{{labels}}} {float(sum(values))}")
    return "\n".join(lines) + "\n"


def sglang_metrics(*, running: float = 2, queue: float = 0, token_usage: float = 0.3,
                   gen_tokens: float = 1000, prompt_tokens: float = 4000,
                   requests: float = 10, aborted: float = 0, gen_throughput: float = 500,
                   ttft_s: Sequence[float] = (0.05,) * 10,
                   tpot_s: Sequence[float] = (0.01,) * 10,
                   retracted: float | None = None, pad_families: int = 0) -> str:
    """One scrape's text (module docstring)."""
    parts = [
        _gauge("num_running_reqs", "The number of running requests.", running),
        _gauge("num_queue_reqs", "The number of requests in the waiting queue.", queue),
        _gauge("token_usage", "The token usage.", token_usage),
        _gauge("gen_throughput", "The generation throughput (token/s).", gen_throughput),
        _gauge("cache_hit_rate", "The prefix cache hit rate.", 0.0),
        _counter("prompt_tokens", "Number of prefill tokens processed.", prompt_tokens),
        _counter("generation_tokens", "Number of generation tokens processed.", gen_tokens),
        _counter("num_requests", "Number of requests processed.", requests),
        _counter("num_aborted_requests", "Number of requests aborted.", aborted, TOKENIZER),
        _histogram("time_to_first_token_seconds", "Histogram of time to first token in "
                   "seconds.", TTFT_BUCKETS, ttft_s),
        _histogram("inter_token_latency_seconds", "Histogram of inter-token latency in "
                   "seconds.", TPOT_BUCKETS, tpot_s, TOKENIZER),
        _histogram("request_time_per_output_token_seconds", "Per-request TPOT in seconds.",
                   TPOT_BUCKETS, tpot_s),
    ]
    if retracted is not None:
        parts.append(_gauge("num_retracted_reqs", "The number of retracted requests.",
                            retracted, LABELS + ',pid="0"'))
    if pad_families:
        body = "".join(f'sglang:pad_series{{{LABELS},series="{i}"}} {float(i)}\n'
                       for i in range(pad_families))
        parts.append("# HELP sglang:pad_series Padding.\n# TYPE sglang:pad_series gauge\n"
                     + body)
    return "".join(parts)
