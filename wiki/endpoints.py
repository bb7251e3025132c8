"""The journal's page of monitored endpoints (`endpoints`): per endpoint `forge monitor`
sampled, its scrapes and failures, and plots over time of the waiting queue, running
requests, KV cache usage, generation throughput, and TTFT / TPOT p99 of the requests finished
between scrapes with the SLO given to the monitor drawn across. Read from the index
(`projections.endpoints`); a URL is user text: a plain heading and SVG text, never a link.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..projections.endpoints import read_endpoints
from .numbers import count, exact
from .page import Page, text
from .plot import Line, Point, plot_svg

PAGE = "endpoints"
MAX_POINTS = 1500  # per plot: a longer series is thinned evenly (first and last kept)
PLOTS = (("num_queue_reqs", "requests waiting", None),
         ("num_running_reqs", "requests running", None),
         ("token_usage", "KV cache usage (0..1)", None),
         ("gen_throughput", "generation tokens/s", None),
         ("ttft_ms_p99", "TTFT p99 (ms)", "ttft_ms"),
         ("tpot_ms_p99", "TPOT p99 (ms)", "tpot_ms"))


def _thin(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(pts) <= MAX_POINTS:
        return pts
    step = (len(pts) - 1) / (MAX_POINTS - 1)
    return [pts[round(i * step)] for i in range(MAX_POINTS)]


def _when(v: Any) -> str:
    return f"{v:%Y-%m-%d %H:%M:%S} UTC" if isinstance(v, datetime) else str(v)


def endpoints_page(con: Any, position: int) -> Page | None:
    """The page, or None when no endpoint was monitored up to `position`."""
    eps = read_endpoints(con, position)
    if not eps:
        return None
    p = Page(PAGE, "endpoints", "Monitored endpoints", position=position,
             summary=f"{count(len(eps), 'endpoint')} sampled by forge monitor",
             meta={"endpoints": len(eps)})
    p.add("p", "Each endpoint's /metrics as forge monitor sampled it. TTFT and TPOT are the "
               "p99 of the requests that finished between two scrapes; the SLO given to "
               "forge monitor (--slo, or the deployment point's) is drawn across.")
    p.add("table", ["endpoint", "windows", "scrapes", "failed", "from", "to", "SLO (ms)"],
          [(e["url"], e["windows"], e["samples"], e["errors"], _when(e["first"]),
            _when(e["last"]), ", ".join(f"{k} {exact(v)}" for k, v in sorted(e["slo_ms"].items()))
            or "—") for e in eps])
    for e in eps:
        p.add("h", text(e["url"]))
        t0 = min((t for s in e["series"].values() for t, _ in s[:1]), default=0.0)
        since = f"minutes since {datetime.fromtimestamp(t0, UTC):%Y-%m-%d %H:%M:%S} UTC"
        for metric, label, slo_key in PLOTS:
            pts = e["series"].get(metric)
            if not pts:
                continue
            lines = [Line("y", v, f"SLO {k.partition('.')[2] or 'p99'} {exact(v)} ms")
                     for k, v in sorted(e["slo_ms"].items())
                     if slo_key and k.partition(".")[0] == slo_key]
            svg = plot_svg([Point((t - t0) / 60, v, group=label) for t, v in _thin(pts)],
                           xlabel=since, ylabel=label, title=label, lines=lines)
            if svg:
                p.add("svg", svg)
    return p
