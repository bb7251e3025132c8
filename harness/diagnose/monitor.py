"""`forge monitor URL`: sample an endpoint's `/metrics` into the index, summaries in the ledger
(as the Node Registry does for hosts; docs/nodes.md).

Contracts:
- Read-only: only `GET <url>/metrics`, passed through the production guard once at the start
  (a redirect hop again, guard/outbound.py). Each scrape has a deadline (`timeout_s`; default
  the interval, within 1..30 s) and a byte cap (`max_bytes`): a page that drips or never ends
  is a failed scrape, one line, and monitoring goes on.
- Numbers are finite: a `NaN`/`±Inf` sample, or a computed value that overflowed, is a hole
  (None) in the samples and left out of the stats, never a stopped monitor.
- The first scrape must answer: an endpoint whose first scrape fails (nothing listening, an
  HTTP error, a page that is no Prometheus text) is a HarnessError naming it and why, one
  line, with nothing recorded. After that, failures are data (below).
- Scrape k starts at or after first + k·`interval_s` (drift-free; a scrape that overran makes
  the next one start at once). Each is summarised (collect.to_scrape: the `sglang:` families,
  histograms as count/sum/mean/p50/p90/p99 since the server started), plus `ttft_ms_p50`,
  `ttft_ms_p99`, `tpot_ms_p50`, `tpot_ms_p99` of the requests finished since the previous
  scrape (the series to hold against an SLO). A failed scrape counts in the window's `errors`
  (its `last_error` kept) and monitoring goes on: an endpoint that went away after it
  answered is what a monitor is for. A gap over 1.5 intervals counts the scrapes due in it
  as `missed`.
- Every `window_s` (and when `count` or `duration_s` is reached) one `EndpointSummarized`
  goes to the `endpoints` stream: per metric (last, min, max, mean) over the window, and the
  samples themselves as an artifact (ledger/samples.py's gzip'd JSON columns: `t`, and
  `metrics` {name: [value or null, aligned with t]}) that the index loads into
  `endpoint_samples(position, url, t, metric, value)`. A progress line per window.
- `slo` (`{"ttft_ms.p99": ms}`, as diagnose's) is recorded with each summary, so the
  journal draws it on the endpoint's latency plots.
- Ctrl-C records the partial window before stopping.
- A router entry (a PD/EPD point: its first `/metrics` scrape is a 404, `GET /workers`
  lists workers) is monitored server by server (targets.py): each worker's page scraped at
  each tick, its own window and `EndpointSummarized` under its own URL, its progress line
  named (`decode-0: ...`). `count` counts ticks (one scrape of every server).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...ledger import events as E
from ...ledger.samples import append_with_samples
from ...ledger.streams import ENDPOINTS_STREAM
from ...ledger.workspace import Workspace
from ..engines.base import request_text
from ..errors import HarnessError
from ..guard import outbound, production
from ..guard.production import ProductionRefusedError
from .collect import SCRAPE_MAX_BYTES, metrics_url, to_scrape
from .rules import LATENCY_HISTOGRAMS, Scrape, window_latency_ms
from .targets import Target, is_not_found, router_targets

Echo = Callable[[str], None]
_SHOWN = (("num_running_reqs", "running", "{:g}"), ("num_queue_reqs", "queued", "{:g}"),
          ("token_usage", "KV", "{:.2f}"), ("gen_throughput", "tok/s", "{:.0f}"),
          ("ttft_ms_p99", "TTFT p99 ms", "{:.0f}"), ("tpot_ms_p99", "TPOT p99 ms", "{:.1f}"))


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


@dataclass
class EndpointWindow:
    """The scrapes of one summary window (pure): aligned columns, errors, gaps."""

    url: str
    interval_s: float
    start: float
    last_t: float | None = None
    t: list[float] = field(default_factory=list)
    metrics: dict[str, list[float | None]] = field(default_factory=dict)
    errors: int = 0
    last_error: str = ""
    missed: int = 0

    def _gap(self, t: float) -> None:
        if self.last_t is not None and t - self.last_t > 1.5 * self.interval_s:
            self.missed += max(0, round((t - self.last_t) / self.interval_s) - 1)
        self.last_t = t

    def add(self, t: float, values: dict[str, float]) -> None:
        self._gap(t)
        i = len(self.t)
        self.t.append(t)
        for k, v in values.items():
            if math.isfinite(v):  # a NaN or infinite value is a hole, never a stored number
                self.metrics.setdefault(k, [None] * i).append(v)
        for col in self.metrics.values():  # a metric missing from this scrape: a hole
            if len(col) <= i:
                col.append(None)

    def error(self, t: float, why: str) -> None:
        self._gap(t)
        self.errors += 1
        self.last_error = why[:300]

    def summary(self, end: float, slo_ms: dict[str, float] | None = None
                ) -> tuple[E.EndpointSummarized, dict[str, Any]]:
        stats = {}
        for k, col in self.metrics.items():
            xs = [v for v in col if v is not None]
            if xs:  # the mean without a sum that could overflow
                stats[k] = (xs[-1], min(xs), max(xs), sum(x / len(xs) for x in xs))
        ev = E.EndpointSummarized(url=self.url, start=_dt(self.start), end=_dt(end),
                                  interval_s=self.interval_s, samples=len(self.t),
                                  missed=self.missed, errors=self.errors,
                                  last_error=self.last_error, stats=stats,
                                  slo_ms=slo_ms or {})
        return ev, {"t": self.t, "metrics": self.metrics}

    def next(self, start: float) -> EndpointWindow:
        return EndpointWindow(self.url, self.interval_s, start, self.last_t)


@dataclass
class MonitorResult:
    url: str
    samples: int = 0
    errors: int = 0
    summaries: int = 0
    artifacts: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def record_summary(ws: Workspace, ev: E.EndpointSummarized, columns: dict[str, Any]
                   ) -> E.EndpointSummarized:
    """Store the window's samples as an artifact and append its summary naming it."""
    return append_with_samples(ws, ENDPOINTS_STREAM, ev, columns)


def _progress(res: MonitorResult, ev: E.EndpointSummarized) -> str:
    parts = [f"{label} {fmt.format(ev.stats[k][0])}" for k, label, fmt in _SHOWN
             if k in ev.stats]
    err = f", {ev.errors} failed ({ev.last_error})" if ev.errors else ""
    return (f"{ev.url}: {res.samples} samples, window of {ev.samples}{err}"
            + (": " + ", ".join(parts) if parts else ""))


def with_interval_latency(prev: Scrape | None, cur: Scrape) -> dict[str, float]:
    """`cur`'s values plus `ttft_ms_p50/p99` and `tpot_ms_p50/p99` of the requests that
    finished since `prev` (histograms are cumulative since the server started: their own
    quantiles hide what happens now). Left out when none finished or with no `prev`."""
    out = dict(cur.values)
    if prev is not None:
        for key in LATENCY_HISTOGRAMS:
            for stat in ("p50", "p99"):
                v = window_latency_ms([prev, cur], key, stat)
                if v is not None:
                    out[f"{key}_{stat}"] = v
    return out


def _check(name: str, v: float | None, lo: float, hi: float) -> None:
    if v is not None and not lo <= v <= hi:  # also refuses NaN
        raise HarnessError(f"--{name} {v:g}: must be within {lo:g}..{hi:g}")


def monitor(ws: Workspace, url: str, *, interval_s: float = 10.0, window_s: float = 60.0,
            count: int | None = None, duration_s: float | None = None,
            echo: Echo = lambda _: None, actor: E.Actor = E.SYSTEM,
            slo: dict[str, float] | None = None,
            fetch: Callable[[], str] | None = None, timeout_s: float | None = None,
            max_bytes: int = SCRAPE_MAX_BYTES) -> MonitorResult:
    """Sample `url` (module contract) until `count` scrapes or `duration_s` seconds (neither:
    until interrupted)."""
    _check("interval", interval_s, 0.01, 3600)
    _check("window", window_s, interval_s, 86400)
    _check("for", duration_s, 0, 366 * 86400)
    if count is not None and count < 1:
        raise HarnessError(f"--count {count}: must be at least 1")
    murl = metrics_url(url)
    production.check(ws, murl, "GET /metrics", actor=actor)
    shown = production.shown_url(url.strip().rstrip("/"))
    deadline = timeout_s if timeout_s is not None else max(1.0, min(30.0, interval_s))
    _check("timeout", deadline, 0.01, 3600)
    guard = outbound.Guard(ws, actor)  # a redirect hop is checked again
    res = MonitorResult(shown)
    first = time.time()
    servers = [_Server(Target("", "server", shown),
                       fetch or _getter(murl, deadline, max_bytes, guard))]
    servers[0].win = EndpointWindow(shown, interval_s, first)
    tick = scrapes = 0
    try:
        while True:
            t = time.time()
            if tick == 0:  # the schedule and the first window count from the first scrape
                first = t
                for sv in servers:
                    sv.win.start = t
            for sv in servers:
                t = time.time()
                err = _scrape(sv, t)
                if err is not None and tick == 0 and fetch is None and is_not_found(err) \
                        and sv.target.role == "server":
                    # A router entry (PD/EPD) has no /metrics: each server's instead
                    found = _router_servers(ws, url, actor, deadline, max_bytes, guard,
                                            t, interval_s)
                    if found:
                        servers = found
                        errs = [_scrape(x, time.time()) for x in servers]
                        res.samples += sum(e is None for e in errs)
                        res.errors += sum(e is not None for e in errs)
                        break
                res.samples += err is None
                res.errors += err is not None
            if tick == 0 and res.samples == 0:
                # Nothing answered: nothing to monitor, and nothing recorded (the journal
                # would list it as monitored). Once it answered, a failure is data.
                why = next((sv.win.last_error for sv in servers if sv.win.last_error), "")
                raise HarnessError(f"{shown}: no answer to the first scrape of /metrics "
                                   f"({why}); nothing recorded")
            scrapes += 1
            done = (count is not None and scrapes >= count) or (
                duration_s is not None and t - first >= duration_s)
            if t - servers[0].win.start >= window_s or done:
                for sv in servers:
                    _summarise(ws, res, sv, t, slo, echo)
            if done:
                break
            tick += 1
            # Drift-free: scrape n is due at first + n * interval (catching up after an
            # overrun rather than sending a burst of late scrapes).
            now = time.time()
            tick = max(tick, int((now - first) / interval_s))
            time.sleep(max(0.0, first + tick * interval_s - now))
    except KeyboardInterrupt:
        for sv in servers:
            if sv.win.t or sv.win.errors:
                _summarise(ws, res, sv, sv.win.last_t or time.time(), slo, echo,
                           " (interrupted)")
        raise
    return res


@dataclass
class _Server:
    """One scraped page of a monitor: its target, its fetch, its current window."""

    target: Target
    get: Callable[[], str]
    win: EndpointWindow = field(init=False)
    prev: Scrape | None = None


def _scrape(sv: _Server, t: float) -> HarnessError | None:
    """One scrape of `sv` into its window; the error (also recorded in the window) or None."""
    try:
        scrape = to_scrape(t, sv.get(), sv.win.url + "/metrics")
    except HarnessError as e:
        sv.win.error(t, " ".join(str(e).split()))
        return e
    sv.win.add(t, with_interval_latency(sv.prev, scrape))
    sv.prev = scrape
    return None


def _router_servers(ws: Workspace, url: str, actor: E.Actor, deadline: float,
                    max_bytes: int, guard: outbound.Guard, start: float, interval_s: float
                    ) -> list[_Server]:
    """The servers behind the router at `url`, each checked by the production guard; none
    when `url` is no router (its 404 is then a failed scrape like any other)."""
    try:
        targets = router_targets(url, timeout_s=deadline, guard=guard,
                                 check=lambda u, a: production.check(ws, u, a, actor=actor))
    except ProductionRefusedError:
        raise
    except HarnessError:
        return []
    out = []
    for t in targets:
        turl = metrics_url(t.url)
        production.check(ws, turl, "GET /metrics", actor=actor)
        sv = _Server(t, _getter(turl, deadline, max_bytes, guard))
        sv.win = EndpointWindow(production.shown_url(t.url), interval_s, start)
        out.append(sv)
    return out


def _getter(murl: str, deadline: float, max_bytes: int, guard: outbound.Guard
            ) -> Callable[[], str]:
    return lambda: request_text("GET", murl, timeout=deadline, max_bytes=max_bytes,
                                guard=guard)


def _summarise(ws: Workspace, res: MonitorResult, sv: _Server, end: float,
               slo: dict[str, float] | None, echo: Echo, note: str = "") -> None:
    ev = record_summary(ws, *sv.win.summary(end, slo))
    res.summaries += 1
    res.artifacts.append(str(ev.samples_artifact))
    name = f"{sv.target.name}: " if sv.target.name else ""
    echo(name + _progress(res, ev) + note)
    sv.win = sv.win.next(end)
