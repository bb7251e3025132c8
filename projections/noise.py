"""A deployment point's noise band: how much one metric varies from run to run there.

Contract:
- A *group* is the successful runs of one candidate repeated together: one block's runs
  (a block measures one candidate `repeats` times), their values of one metric.
- `learn` (pure): the pooled run-to-run coefficient of variation over every group with at
  least two values and a non-zero mean, `cv = sqrt(sum((n_i - 1) * cv_i**2) / sum(n_i - 1))`
  (each group's own mean removed, so a faster candidate does not widen the band). It is the
  relative spread of *one run*: a gain smaller than that is within what the point does by
  itself between runs. `NoiseBand` says what it rests on (`groups`, `runs`); below `MIN_DOF`
  pooled degrees of freedom (`sum(n_i - 1)`) there is no band (None): gates then judge as
  without one and say so. A group whose mean or CV is not a finite number (finite samples
  that overflow a float) is left out: a computed number is checked like an input.
- `point_groups(ledger, point_hash, metric)`: the groups measured at one point: for every
  task whose `TaskDefined.point_hash` is that point, each block's successful, not invalidated
  runs of `metric`. Bounded: task definitions are read from the log by type, then only the
  streams of that point's tasks. `point_bands` learns several metrics with one read;
  `task_bands` (`forge task noise`) those of a task's gates at its point.
- Reads only events, through Task Memory's fold; never the index. Same history → same band.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..ledger import events as E
from ..ledger.store import Ledger
from ..ledger.streams import task_of
from .memory import read_memory

MIN_DOF = 2  # pooled degrees of freedom below which no band is claimed


@dataclass(frozen=True)
class NoiseBand:
    """A (point, metric)'s run-to-run variation: `cv` (relative), over `groups` groups of
    repeated runs holding `runs` runs in all."""

    metric: str
    cv: float
    groups: int
    runs: int
    point_hash: str | None = None

    def describe(self) -> str:
        where = f" of point {self.point_hash[:12]}" if self.point_hash else ""
        return (f"noise band {self.cv:.2%}{where} ({self.metric} CV over {self.groups} groups, "
                f"{self.runs} runs)")


def learn(metric: str, groups: Iterable[Sequence[float]], *,
          point_hash: str | None = None) -> NoiseBand | None:
    """The pooled CV of `metric` over `groups` (each: one candidate's repeated values), or
    None when the groups hold fewer than `MIN_DOF` degrees of freedom."""
    num = 0.0
    dof = used = runs = 0
    for g in groups:
        xs = [float(x) for x in g]
        if len(xs) < 2:
            continue
        try:
            mean = statistics.fmean(xs)
            if mean == 0:
                continue
            cv = statistics.stdev(xs) / abs(mean)
        except OverflowError:  # finite samples whose sum overflows (two 1.7e308)
            continue
        if not math.isfinite(cv):
            continue
        num += (len(xs) - 1) * cv * cv
        dof += len(xs) - 1
        used += 1
        runs += len(xs)
    if dof < MIN_DOF or not math.isfinite(num):
        return None
    return NoiseBand(metric=metric, cv=round(math.sqrt(num / dof), 6), groups=used, runs=runs,
                     point_hash=point_hash)



def point_tasks(ledger: Ledger, point_hash: str) -> list[str]:
    """The ids of the tasks defined at `point_hash`, in definition order."""
    out = []
    for r in ledger.log(types=[E.TaskDefined.TYPE]):
        ev = r.event
        tid = task_of(r.stream)
        if tid is not None and isinstance(ev, E.TaskDefined) and ev.point_hash == point_hash:
            out.append(tid)
    return list(dict.fromkeys(out))


def _groups(ledger: Ledger, point_hash: str, metrics: Iterable[str]
            ) -> dict[str, list[list[float]]]:
    wanted = list(dict.fromkeys(metrics))
    out: dict[str, list[list[float]]] = {m: [] for m in wanted}
    for tid in point_tasks(ledger, point_hash):
        mem, _ = read_memory(ledger, tid)
        for blk in mem.execution_record:
            runs = [r for r in blk.runs() if r.success]
            for m in wanted:
                xs = [float(r.metrics[m]) for r in runs if m in r.metrics]
                if xs:
                    out[m].append(xs)
    return out


def point_groups(ledger: Ledger, point_hash: str, metric: str) -> list[list[float]]:
    """Each block's successful runs of `metric` at the point (one list per block)."""
    return _groups(ledger, point_hash, [metric])[metric]


def point_bands(ledger: Ledger, point_hash: str, metrics: Iterable[str]
                ) -> dict[str, NoiseBand]:
    """The learned band of each metric that history supports (others left out)."""
    bands = {}
    for m, groups in _groups(ledger, point_hash, metrics).items():
        b = learn(m, groups, point_hash=point_hash)
        if b is not None:
            bands[m] = b
    return bands


def point_band(ledger: Ledger, point_hash: str, metric: str) -> NoiseBand | None:
    return point_bands(ledger, point_hash, [metric]).get(metric)


def task_bands(ledger: Ledger, task_id: str, metrics: Iterable[str] = ()) -> dict[str, Any]:
    """`forge task noise`: the bands at a task's point of `metrics` (default: the metrics of
    its contract's gates), each with what it rests on; a metric without one is None."""
    mem, _ = read_memory(ledger, task_id)
    wanted = list(metrics) or [g["metric"] for g in
                               (mem.definition.get("contract") or {}).get("gates", [])
                               if isinstance(g, dict) and g.get("metric")]
    wanted = list(dict.fromkeys(wanted))
    bands = point_bands(ledger, mem.point_hash, wanted) if mem.point_hash else {}
    return {"task_id": task_id, "point_hash": mem.point_hash,
            "bands": {m: (None if m not in bands else
                          {"cv": bands[m].cv, "groups": bands[m].groups,
                           "runs": bands[m].runs}) for m in wanted}}
