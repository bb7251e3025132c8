"""The journal's page of tasks in flight over time (`concurrency`): the peak (the figure the
method quotes: peak concurrent tasks), a plot of the count over time per engineer and per host
with the overall line, the peak of each day, week or month, and a row per engineer and host.

Read from the ledger up to the position the build reflects (`projections.concurrency`; what
counts as in flight is said there), so the same position gives the same page: a task still in
flight is counted until the time of that position's event, not the build's clock. Engineer
and host names are user text: plain table cells and SVG text, never markup.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..ledger.store import Ledger
from ..projections.concurrency import (
    Period,
    concurrency,
    position_time,
    read_stretches,
)
from .numbers import count
from .page import Page, join, link, strong, text
from .pages import task_path
from .plot import Steps, steps_svg

PAGE = "concurrency"
MAX_PLOT_GROUPS = 8  # lines per plot besides the total; the tables list every group
MAX_NAMED = 20  # tasks named at the peak
DEFINITION = ("A task is in flight from its first loop block's start (or its reopening) until "
              "it exits, whatever ran it: the task loop, a person on the manual path, a graph "
              "worker. A reopened task counts again from its reopening; a graph node's task "
              "loop counts as its node. Engineer: who defined the task (for a graph node, who "
              "started its run when recorded). Host: where its blocks ran (for a graph node, "
              "its run's host). Tasks still in flight are counted until ")


def auto_period(start: datetime, end: datetime) -> Period:
    """Months over two months or more, weeks over two weeks or more, else days."""
    days = (end - start).total_seconds() / 86400
    return "month" if days >= 60 else "week" if days >= 14 else "day"


def _unit(span_s: float) -> tuple[str, float]:
    if span_s <= 2 * 3600:
        return "minutes", 60.0
    if span_s <= 3 * 86400:
        return "hours", 3600.0
    return "days", 86400.0


def _plot(rep: dict[str, Any], grouping: str) -> str:
    t0, t1 = datetime.fromisoformat(rep["since"]), datetime.fromisoformat(rep["until"])
    unit, scale = _unit((t1 - t0).total_seconds())

    def steps(label: str, summary: dict[str, Any], total: bool = False) -> Steps:
        pts = summary["series"]
        return Steps(label, tuple((datetime.fromisoformat(t) - t0).total_seconds() / scale
                                  for t, _ in pts), tuple(float(n) for _, n in pts), total)

    groups = rep["groups"][grouping]
    ranked = sorted(groups, key=lambda n: (-groups[n]["peak"]["value"], n))
    return steps_svg([steps("all tasks", rep["overall"], True)]
                     + [steps(n, groups[n]) for n in ranked[:MAX_PLOT_GROUPS]],
                     x_end=(t1 - t0).total_seconds() / scale,
                     xlabel=f"{unit} since {t0:%Y-%m-%d %H:%M} UTC", ylabel="tasks in flight",
                     title=f"Tasks in flight by {grouping}")


def _when(iso: str) -> str:
    return f"{datetime.fromisoformat(iso):%Y-%m-%d %H:%M:%S} UTC"


def concurrency_page(ledger: Ledger, position: int, known_tasks: set[str],
                     on_error: Any = None) -> Page | None:
    """The page, or None when no task was ever in flight. An undecodable event is left out
    (handed to `on_error`, default: ignored here, as `forge check` lists it)."""
    def skip(u: Any) -> None:
        if on_error is not None:
            on_error(u)

    stretches = read_stretches(ledger, stop=position, on_error=skip)
    if not stretches:
        return None
    latest = max(max(s.start, s.end or s.start) for s in stretches)
    now = max(position_time(ledger, position) or latest, latest)
    first = min(s.start for s in stretches)
    period = auto_period(first, now)
    rep = concurrency(stretches, now=now, period=period, by=("engineer", "host"))
    o = rep["overall"]
    pk = o["peak"]
    p = Page(PAGE, "concurrency", "Tasks in flight", position=position,
             summary=(f"peak {count(pk['value'], 'task')} in flight at {_when(pk['at'])}; "
                      f"{count(o['tasks'], 'task')} in {count(o['stretches'], 'stretch')}"),
             meta={"peak": pk["value"], "peak_at": pk["at"], "tasks": o["tasks"],
                   "stretches": o["stretches"], "since": rep["since"],
                   "until": rep["until"], "period": period})

    def task_ref(tid: str) -> Any:
        return link(task_path(tid), tid) if tid in known_tasks else tid

    named = pk["tasks"][:MAX_NAMED]
    more = f", and {len(pk['tasks']) - len(named)} more" if len(pk["tasks"]) > len(named) else ""
    p.add("p", text("Peak ", strong(pk["value"]), f" tasks in flight at {_when(pk['at'])}",
                    ": " if named else "", join(", ", map(task_ref, named)),
                    f"{more}. {count(o['tasks'], 'task')} in "
                    f"{count(o['stretches'], 'stretch')} from "
                    f"{_when(rep['since'])} to {_when(rep['until'])}; "
                    f"{len(rep['open'])} still in flight."))
    p.add("p", DEFINITION + f"{_when(rep['until'])} (ledger position {position}).")
    for grouping in ("engineer", "host"):
        groups = rep["groups"][grouping]
        p.add("h", f"By {grouping}")
        svg = _plot(rep, grouping)
        if svg:
            p.add("svg", svg)
        p.add("table", [grouping, "tasks", "stretches", "peak", "first at"],
              [(name, g["tasks"], g["stretches"], g["peak"]["value"], _when(g["peak"]["at"]))
               for name, g in sorted(groups.items(),
                                     key=lambda kv: (-kv[1]["peak"]["value"], kv[0]))])
    p.add("h", f"Peak of each {period}")
    p.add("table", [period, "peak", "first at"],
          [(per["period"], per["peak"], _when(per["at"])) for per in o["periods"]])
    return p
