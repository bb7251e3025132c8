"""The serving-project's production endpoint, as a stand-in server that `forge monitor` scrapes.

No engine serves here, so the scripted OpenAI-compatible server
(harness/testing/scripted_server.py) stands in for it, and its `GET /metrics` replays the
one-hour production record (metrics.json beside this file) as SGLang 0.5.23's own metric
families (harness/testing/sglang_metrics.py): scrape k is minute k mod 60 of the record (the
hour loops, the counters and histograms keep counting, so any 60 consecutive scrapes see every
minute once) — `sglang:num_queue_reqs` and `num_running_reqs` that
minute's gauges, `num_requests_total` counting round(arrivals_per_s * 60) requests a minute,
and the TTFT histogram those requests' first-token times spread up to the minute's p99.

    python serve.py [--port 30990]      prints `listening on http://127.0.0.1:PORT`, then serves

The kernel timings in metrics.json (`moe_kernel_us_h20`, a profiler capture, not a
Prometheus metric) stay a file that diag-moe-path reads.
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

from infer_forge.harness.testing.scripted_server import Script, ScriptedServer
from infer_forge.harness.testing.sglang_metrics import sglang_metrics

RECORD = Path(__file__).resolve().with_name("metrics.json")
SAMPLES = json.loads(RECORD.read_text())["samples"]


def minute_requests(m: dict) -> tuple[int, list[float]]:
    """(requests finished in that minute, their TTFTs in seconds: evenly spread from a third
    of the minute's p99 up to it, so the minute's p99 is its recorded one)."""
    n = max(1, round(m["arrivals_per_s"] * 60))
    p99 = m["ttft_p99_ms"] / 1000.0
    return n, [p99 * (1 / 3 + (2 / 3) * i / max(1, n - 1)) for i in range(n)]


@cache
def page(k: int) -> str:
    """The /metrics text of scrape k (minute k mod 60 of the record)."""
    ttft: list[float] = []
    total = 0
    for i in range(k + 1):
        n, t = minute_requests(SAMPLES[i % len(SAMPLES)])
        total += n
        ttft += t
    now = SAMPLES[k % len(SAMPLES)]
    return sglang_metrics(running=now["running"], queue=now["queue_depth"], requests=total,
                          ttft_s=ttft, tpot_s=[0.03] * len(ttft))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30990)
    a = ap.parse_args()
    ScriptedServer(Script(metrics=page), a.host, a.port).serve_until_interrupted()


if __name__ == "__main__":
    main()
