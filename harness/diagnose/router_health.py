"""The router's own health, from its Prometheus page (`--prometheus-port`, the plan's
`metrics_port`), as `sglang-router` 0.3.2 and `smg` 1.13 both expose it (`smg_*` families,
read from the running binaries in tests/harness/diagnose/test_router_health.py):

- `smg_worker_health{worker}`: 1 healthy, 0 unhealthy (the router's health checks failed
  `--health-failure-threshold` times in a row);
- `smg_worker_cb_state{worker}`: the worker's circuit breaker, 0 closed, 1 open, 2 half-open;
- `smg_router_upstream_responses_total{status_code, error_code}`: the answers the router got
  from its workers (a connection failure is a 500 with `call_upstream_connection_failed`).

`to_router_scrape(t, text, source)` reads one page into a `Scrape`: per-worker values in
`ranks` (`worker_health`, `cb_state`, keyed by the worker URL) and `upstream_5xx_total` in
`values`. The rule `router_unhealthy_workers` fires when, in the last scrape, a worker is
unhealthy or its circuit breaker is not closed, or when the routers' upstream 5xx answers grew
over the window: requests are failing over, or failing, on the way to a server — the
server's own page may look fine (a dead server has none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ...ledger.events import DiagnosisFinding
from ..engines.metrics import parse_prometheus
from ..errors import HarnessError
from .rules import Limits, LogLine, Rule, Scrape

CB_STATES = {0.0: "closed", 1.0: "open", 2.0: "half-open"}


def to_router_scrape(t: float, text: str, source: str) -> Scrape:
    fams = parse_prometheus(text, source)
    ranks: dict[str, dict[str, float]] = {}
    for key, family in (("worker_health", "smg_worker_health"),
                        ("cb_state", "smg_worker_cb_state")):
        for s in fams.get(family, {}).get("samples", []):
            worker = s["labels"].get("worker")
            if worker and math.isfinite(s["value"]):
                ranks.setdefault(key, {})[worker] = s["value"]
    upstream = fams.get("smg_router_upstream_responses", {}).get("samples", [])
    errors = sum(s["value"] for s in upstream if s["name"].endswith("_total")
                 and s["labels"].get("status_code", "").startswith("5")
                 and math.isfinite(s["value"]))
    if not any(n.startswith("smg_") for n in fams):
        raise HarnessError(f"{source}: no smg_* metrics (is this the router's "
                           "--prometheus-port?)")
    return Scrape(t, {"upstream_5xx_total": errors}, {}, (), ranks)


def router_unhealthy_workers(scrapes: Sequence[Scrape], log: Sequence[LogLine],
                             slo: Mapping[str, float], limits: Limits
                             ) -> DiagnosisFinding | None:
    if not scrapes:
        return None
    last = scrapes[-1].ranks
    down = sorted(w for w, v in last.get("worker_health", {}).items() if v == 0)
    broken = sorted((w, CB_STATES.get(v, str(v))) for w, v in last.get("cb_state", {}).items()
                    if v != 0)
    errors = [s.values.get("upstream_5xx_total") for s in scrapes]
    first, end = errors[0], errors[-1]
    grew = end - first if first is not None and end is not None else 0.0
    if not (down or broken or grew > 0):
        return None
    said = []
    if down:
        said.append(f"unhealthy worker(s) {', '.join(down)}")
    if broken:
        said.append("circuit breaker " + ", ".join(f"{s} for {w}" for w, s in broken))
    if grew > 0:
        said.append(f"{grew:g} upstream 5xx answer(s) in the window")
    workers = sorted({w for m in ("worker_health", "cb_state") for w in last.get(m, {})})
    return DiagnosisFinding(
        rule="router_unhealthy_workers", summary="the router sees " + "; ".join(said) +
        ": requests to them fail or go elsewhere; check those servers' logs and the "
        "router's health checks",
        metrics={"upstream_5xx_total": tuple(errors),
                 **{f"{m}:{w}": tuple(s.ranks.get(m, {}).get(w) for s in scrapes)
                    for m in ("worker_health", "cb_state") for w in workers}})


ROUTER_RULES: dict[str, Rule] = {"router_unhealthy_workers": router_unhealthy_workers}
