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


ScrapeWindow = Callable[[Callable[[], str], int, float, str], list[Scrape]]


def server_diagnosis(ws: Any, url: str, targets: Sequence[Target], *, samples: int,
                     interval_s: float, lines: Sequence[LogLine], log: str | Path | None,
                     slo: Mapping[str, float], limits: Limits | None, actor: E.Actor,
                     task_id: str | None, envelope: Mapping[str, Any] | None,
                     timeout_s: float, max_bytes: int, guard: outbound.Guard,
                     scrape_window: ScrapeWindow, window_metrics: Sequence[str]
                     ) -> E.DiagnosisRecorded:
    """collect.diagnosis of a router entry (its `scrape_window` and `window_metrics` passed
    in): every target scraped on the same schedule (one thread each), the rules applied per
    server and each finding labelled with it; the log's findings labelled with the log
    file; `window` keys `name/metric`."""
    for t in targets:
        production.check(ws, t.url + "/metrics", "GET /metrics", actor=actor,
                         task_id=task_id)

    def window(t: Target) -> list[Scrape]:
        murl = t.url + "/metrics"
        return scrape_window(lambda: request_text("GET", murl, timeout=timeout_s,
                                                  max_bytes=max_bytes, guard=guard),
                             samples, interval_s, production.shown_url(murl))

    with ThreadPoolExecutor(len(targets)) as pool:
        scrapes = dict(zip(targets, pool.map(window, targets), strict=True))
    findings = [labelled(f, t) for t in targets
                for f in apply_rules(scrapes[t], (), slo, limits)]
    if lines:
        first = scrapes[targets[0]]
        findings += [labelled(f, Target("log", "log", str(log))) for f in
                     apply_rules(first, lines, slo, limits) if f.log_lines]
    all_t = [s.t for ss in scrapes.values() for s in ss]
    return E.DiagnosisRecorded(
        url=production.shown_url(url.strip().rstrip("/")),
        start=datetime.fromtimestamp(min(all_t), UTC),
        end=datetime.fromtimestamp(max(all_t), UTC), interval_s=interval_s,
        samples=samples,
        window={f"{t.name or t.url}/{k}": tuple(s.values.get(k) for s in scrapes[t])
                for t in targets for k in window_metrics
                if any(k in s.values for s in scrapes[t])},
        log_file=str(log) if log is not None else None, log_lines_read=len(lines),
        slo_ms=dict(slo), rules=tuple(RULES), findings=tuple(findings),
        healthy=not findings, **{"actor": actor, **(envelope or {})})
