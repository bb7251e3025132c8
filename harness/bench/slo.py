"""A point's SLO as the benchmark's goodput definition and as the contract's default gates.

One SLO, three readers, one meaning:
- Goodput (`goodput_slo`): bench_serving's `--goodput ttft:MS tpot:MS e2el:MS` thresholds —
  a request is good when it succeeded and each of its TTFT, TPOT and E2E latency is at most
  its metric's threshold (metrics.compute_metrics: `request_goodput`, `slo_attainment`).
  A metric's per-request threshold is its value at the highest percentile the SLO lists
  (p99 > p95 > p90 > p50; `mean` only when it is the only one): a p99 bound of X ms is met
  when at least 99% of the requests take at most X ms, which is that request-level test.
- Gates (`slo_gates`): one absolute gate per listed percentile, `slo.<metric>.<stat>`
  (`slo.ttft_ms.p99`: `p99_ttft_ms` at_most X; p50 reads `median_…`, e2e reads
  `…_e2e_latency_ms`), and `slo.throughput_floor` (`output_throughput` at_least the floor).
- Default gates (`with_slo_gates`): a contract with no explicit latency gate (no gate on a
  TTFT, TPOT, ITL or E2E latency metric) gets the SLO's latency gates; one without an
  absolute gate on `output_throughput` gets the floor. Only gates whose metric the judged
  runs (the block's or the baseline's) report are added: an evaluator that measures other
  things (a command evaluator's own metrics) is judged by its contract alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from ...ledger.specs import SLO, Contract, DeploymentPoint, Gate
from ...ledger.task import Run

# SLO field → (goodput key, metrics name)
_METRICS = {"ttft_ms": ("ttft", "ttft"), "tpot_ms": ("tpot", "tpot"),
            "e2e_ms": ("e2el", "e2e_latency")}
_ORDER = ("p99", "p95", "p90", "p50", "mean")
_STAT = {"p50": "median", "p90": "p90", "p95": "p95", "p99": "p99", "mean": "mean"}
LATENCY_METRIC = re.compile(r"^(mean|median|std|max|p\d+)_(ttft|tpot|itl|e2e_latency)_ms$")


def goodput_slo(slo: SLO | None) -> dict[str, float] | None:
    """The per-request goodput thresholds (ms, keys ttft/tpot/e2el) of `slo`; None when it
    sets no latency bound."""
    if slo is None:
        return None
    out: dict[str, float] = {}
    for field, (key, _) in _METRICS.items():
        bounds: Mapping[str, float] = getattr(slo, field)
        for stat in _ORDER:
            if stat in bounds:
                out[key] = float(bounds[stat])
                break
    return out or None


def slo_gates(slo: SLO | None) -> list[Gate]:
    """The SLO's absolute gates (module contract), latency first, in a stable order."""
    if slo is None:
        return []
    gates = []
    for field, (_, name) in _METRICS.items():
        bounds: Mapping[str, float] = getattr(slo, field)
        for stat in _ORDER[::-1]:
            if stat in bounds:
                gates.append(Gate(name=f"slo.{field}.{stat}", metric=f"{_STAT[stat]}_{name}_ms",
                                  at_most=float(bounds[stat])))
    if slo.throughput_floor is not None:
        gates.append(Gate(name="slo.throughput_floor", metric="output_throughput",
                          at_least=float(slo.throughput_floor)))
    return gates


def _reported(runs: Iterable[Run]) -> set[str]:
    return {k for r in runs for k in r.metrics}


def with_slo_gates(contract: Contract, point: DeploymentPoint,
                   *runs: Sequence[Run] | None) -> Contract:
    """`contract` plus the point's SLO gates it does not already cover (module contract);
    `runs`: the judged runs (block, baseline), whose reported metrics bound what is added."""
    slo = getattr(getattr(point, "scenario", None), "slo", None)
    extra = slo_gates(slo)
    if not extra:
        return contract
    have_latency = any(g.metric and LATENCY_METRIC.match(g.metric) for g in contract.gates)
    have_floor = any(g.metric == "output_throughput" and g.kind == "absolute"
                     for g in contract.gates)
    names = {g.name for g in contract.gates}
    seen = _reported(r for rs in runs if rs for r in rs)
    add = [g for g in extra if g.name not in names and g.metric in seen
           and not (have_floor if g.metric == "output_throughput" else have_latency)]
    if not add:
        return contract
    return contract.model_copy(update={"gates": [*contract.gates, *add]})
