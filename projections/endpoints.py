"""Reads of monitored endpoints (`forge monitor`, harness/diagnose/monitor.py) from the index,
for the journal's `endpoints` page: per URL its windows, scrapes and failed scrapes, the SLO
last given (`slo_ms`, {"ttft_ms.p99": ms}), and the series of the plotted metrics as
(epoch seconds, value) pairs in time order, up to ledger position `stop`. An endpoint that
never answered a scrape (windows of failed scrapes only, as forge monitor recorded before it
refused a dead endpoint) was never monitored: it is left out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import duckdb

PLOTTED = ("num_queue_reqs", "num_running_reqs", "token_usage", "gen_throughput",
           "ttft_ms_p99", "tpot_ms_p99")


def read_endpoints(con: duckdb.DuckDBPyConnection, stop: int | None = None
                   ) -> list[dict[str, Any]]:
    stop = stop if stop is not None else 2**62
    out: dict[str, dict[str, Any]] = {}
    for url, windows, samples, errors, first, last, slo in con.execute(
            "SELECT url, count(*), sum(samples), sum(errors), min(start_at), max(end_at), "
            "arg_max(slo_ms, position) FROM endpoint_windows WHERE position <= ? "
            "GROUP BY url HAVING sum(samples) > 0 ORDER BY url", [stop]).fetchall():
        try:
            objective = orjson.loads(slo) if slo else {}
        except orjson.JSONDecodeError:
            objective = {}
        out[url] = {"url": url, "windows": windows, "samples": int(samples or 0),
                    "errors": int(errors or 0), "first": first, "last": last,
                    "slo_ms": objective if isinstance(objective, dict) else {},
                    "series": {}}
    for url, metric, t, value in con.execute(
            "SELECT url, metric, epoch_us(t) / 1e6, value FROM endpoint_samples "
            "WHERE position <= ? AND metric IN (SELECT unnest(?)) ORDER BY url, metric, t",
            [stop, list(PLOTTED)]).fetchall():
        if url in out:
            out[url]["series"].setdefault(metric, []).append((t, value))
    return list(out.values())
