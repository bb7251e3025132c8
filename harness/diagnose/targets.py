"""Which servers a diagnosis or a monitor scrapes for an endpoint URL.

A colocated SGLang server serves its own `/metrics`. A disaggregated point's entry URL is the
router (sglang-router / smg), which has no `/metrics` on its entry port (its own `smg_*`
families are on its `--prometheus-port`) — so a PD/EPD point is read server by server.

Contract of `router_targets(url, ...)`, asked by a scraper whose `GET <url>/metrics` answered
404 (`is_not_found`; a server that has metrics is scraped as it always was, nothing more):
- `GET <url>/workers` (the router's worker view, a read) lists workers: one target per
  listed worker, named by its role and its place among that role's workers
  in the router's listing (`prefill-0`, `decode-0`, `encode-0`, `regular-1`), its URL the
  worker's. Encoders a PD router does not list are not found from the entry URL; nor is the
  router's own Prometheus page (its port is the plan's `metrics_port`, in `forge engine up`'s
  description).
- Otherwise a one-line HarnessError naming the URL.
`labelled(finding, target)`: the finding with the server named in its summary and metric
keys, so a reader sees which server a finding came from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ..engines.base import request_json, request_text
from ..errors import HarnessError
from ..guard import outbound, production
from ..guard.production import ProductionRefusedError
from .router_health import ROUTER_RULES, to_router_scrape
from .rules import RULES, Limits, LogLine, Scrape, apply_rules


@dataclass(frozen=True)
class Target:
    """One page to scrape: `name` (prefill-0, router, or "" for a lone server), `role`,
    `url` (the server's base URL, or the router's metrics origin)."""

    name: str
    role: str
    url: str

    @property
    def label(self) -> str:
        return f"{self.name} {self.url}" if self.name else self.url


def is_not_found(e: HarnessError) -> bool:
    """A scrape that failed because the page does not exist (a router's entry port)."""
    return "HTTP 404" in str(e)


def router_targets(url: str, *, timeout_s: float, guard: outbound.Guard | None = None,
                   check: Callable[[str, str], object] | None = None) -> list[Target]:
    """The servers behind the router at `url` (module contract). `check(url, action)` runs
    before the `/workers` read (the production guard)."""
    base = url.strip().rstrip("/")
    if base.endswith("/metrics"):
        base = base[:-len("/metrics")]
    elif base.endswith("/v1"):
        base = base[:-3]
    if check is not None:
        check(base + "/workers", "GET /workers")
    try:
        view = request_json("GET", base + "/workers", timeout=timeout_s, guard=guard)
    except HarnessError as e:
        raise HarnessError(f"{base}/metrics is 404 and {base}/workers does not list workers "
                           f"(not an SGLang server or router): {e}") from None
    workers = [w for w in (view or {}).get("workers", []) if isinstance(w, dict)
               and isinstance(w.get("url"), str)] if isinstance(view, dict) else []
    if not workers:
        raise HarnessError(f"{base}/metrics is 404 and {base}/workers lists no workers")
    seen: dict[str, int] = {}
    out = []
    for w in workers:
        role = str(w.get("worker_type") or "regular")
        i = seen.get(role, 0)
        seen[role] = i + 1
        out.append(Target(f"{role}-{i}", role, w["url"].rstrip("/")))
    return out


def labelled(finding: E.DiagnosisFinding, target: Target) -> E.DiagnosisFinding:
    """`finding` naming the server it came from (module contract)."""
    update: dict[str, Any] = {
        "summary": f"{target.label}: {finding.summary}",
        "metrics": {f"{target.name or target.url}/{k}": v
                    for k, v in finding.metrics.items()}}
    return finding.model_copy(update=update)


ScrapeWindow = Callable[..., list[Scrape]]  # collect.scrape_window


def server_diagnosis(ws: Any, url: str, targets: Sequence[Target], *, samples: int,
                     interval_s: float, lines: Sequence[LogLine], log: str | Path | None,
                     slo: Mapping[str, float], limits: Limits | None, actor: E.Actor,
                     task_id: str | None, envelope: Mapping[str, Any] | None,
                     timeout_s: float, max_bytes: int, guard: outbound.Guard,
                     scrape_window: ScrapeWindow, window_metrics: Sequence[str],
                     router: Target | None = None) -> E.DiagnosisRecorded:
    """collect.diagnosis of a router entry (its `scrape_window` and `window_metrics` passed
    in): every target scraped on the same schedule (one thread each), the rules applied per
    server and each finding labelled with it; the log's findings labelled with the log
    file; `window` keys `name/metric`. `router`: the router's own Prometheus page, scraped on
    the same schedule and judged by router_health.ROUTER_RULES (its findings named `router`)."""
    for t in targets:
        production.check(ws, t.url + "/metrics", "GET /metrics", actor=actor,
                         task_id=task_id)

    def window(t: Target) -> list[Scrape] | HarnessError:
        murl = t.url + "/metrics"
        try:
            return scrape_window(lambda: request_text("GET", murl, timeout=timeout_s,
                                                      max_bytes=max_bytes, guard=guard),
                                 samples, interval_s, production.shown_url(murl),
                                 **({"parse": to_router_scrape} if t is router else {}))
        except ProductionRefusedError:
            raise
        except HarnessError as e:  # a dead server behind a live router: a finding, below
            return e

    pages = [*targets, *([router] if router is not None else [])]
    with ThreadPoolExecutor(len(pages)) as pool:
        got = dict(zip(pages, pool.map(window, pages), strict=True))
    if router is not None and isinstance(failed := got[router], HarnessError):
        raise failed  # the page the user named: its error is the answer
    scrapes = {t: w for t, w in got.items() if not isinstance(w, HarnessError)}
    findings = [labelled(E.DiagnosisFinding(
        rule="server_unreachable", summary=f"its /metrics could not be read ({w}): the "
        "router lists it, but it does not answer; check whether its process is alive"), t)
        for t, w in got.items() if isinstance(w, HarnessError)]
    findings += [labelled(f, t) for t in targets if t in scrapes
                 for f in apply_rules(scrapes[t], (), slo, limits)]
    lim = limits or Limits()
    if router is not None:
        findings += [labelled(f, router) for rule in ROUTER_RULES.values()
                     if (f := rule(scrapes[router], (), slo, lim)) is not None]
    if lines and any(t in scrapes for t in targets):
        first = scrapes[next(t for t in targets if t in scrapes)]
        findings += [labelled(f, Target("log", "log", str(log))) for f in
                     apply_rules(first, lines, slo, limits) if f.log_lines]
    all_t = [s.t for ss in scrapes.values() for s in ss] or [time.time()]
    return E.DiagnosisRecorded(
        url=production.shown_url(url.strip().rstrip("/")),
        start=datetime.fromtimestamp(min(all_t), UTC),
        end=datetime.fromtimestamp(max(all_t), UTC), interval_s=interval_s,
        samples=samples,
        window={f"{t.name or t.url}/{k}": tuple(s.values.get(k) for s in scrapes[t])
                for t in targets if t in scrapes for k in window_metrics
                if any(k in s.values for s in scrapes[t])}
        | ({"router/upstream_5xx_total": tuple(s.values.get("upstream_5xx_total")
                                               for s in scrapes[router])}
           if router is not None else {}),
        log_file=str(log) if log is not None else None, log_lines_read=len(lines),
        slo_ms=dict(slo), findings=tuple(findings),
        rules=(*RULES, "server_unreachable", *(ROUTER_RULES if router is not None else ())),
        healthy=not findings, **{"actor": actor, **(envelope or {})})
