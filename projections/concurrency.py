"""Tasks in flight over time (`forge concurrency`, the journal's `concurrency` page): how many
tasks were being worked on at once, across graphs and runs, overall, per engineer and per host,
with the peak (the figure the method quotes: peak concurrent tasks) and the peak of each day,
week or month.

In flight. A task is in flight while the one task fold (`ledger.task`) has it `running`:
from its first loop block's start until it exits, and again from a reopening (or a block
started after an exit) until it exits again. So a reopened task counts once more, as a new
stretch, and never twice at one moment. The time between two blocks of a task counts: the
loop (or an agent, or a person on the manual path) is deciding the next one. A task still
running when the reading ends is in flight until `now` (the CLI: the current time; the wiki:
the time of the ledger position the page reflects). Intervals are half-open: a task that
exits at the instant another starts does not overlap it.

Not counted on its own: a graph node's task loop (task `<graph>.<node>.a<n>`, run by a worker
as the work of the node's attempt `a<n>`): it is the node's work, and the node is counted.

Engineer: the human who defined the task; for a task a tool or an agent defined (a graph
node's task, defined by the graph runner), the human who opened the stretch (reopened the task
or started its block), else the human who started the graph run, else the name of whoever
defined it ("unknown" when its definition cannot be read).

Host: where the work ran: the host recorded on the loop block (`LoopBlockStarted.host`); for a
graph node's block without one, the host of the worker's claim (`NodeStarted.host` where
recorded) or of the run that claimed it (`GraphRunStarted.host`); else "unknown". A stretch
moves to the host of each block it starts (the time before a reopened task's first block stays
with the host of its last block).

Reading (`read_stretches`) folds only the events that move a task's status, plus the graph
runs and claims, in one pass over the log; an undecodable event is handed to `on_error` and
left out, as every reader does (a damaged exit leaves its task in flight: `forge check` names
it). The computation (`series`, `peak`, `period_peaks`, `concurrency`) is pure.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ..ledger import events as E
from ..ledger.clock import utcnow
from ..ledger.store import Ledger, OnError, Recorded
from ..ledger.streams import GRAPH_PREFIX, task_of
from ..ledger.task import Task, apply
from .errors import ProjectionError
from .graph import node_task_id

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = ("day", "week", "month")
GROUPINGS = ("engineer", "host")
UNKNOWN = "unknown"
READ_TYPES = (E.TaskDefined.TYPE, E.LoopBlockStarted.TYPE, E.TaskExited.TYPE,
              E.TaskReopened.TYPE, E.GraphRunStarted.TYPE, E.NodeStarted.TYPE)


@dataclass(frozen=True)
class Stretch:
    """One task in flight on one host from `start` until `end` (None: still in flight):
    (part of) the task's `n`th time in flight (1, then 2 after a reopening, ...)."""

    task_id: str
    start: datetime
    end: datetime | None
    engineer: str
    host: str
    n: int = 1

    def until(self, now: datetime) -> datetime:
        return self.end if self.end is not None else max(now, self.start)


# --- reading: the ledger's events -> stretches ---------------------------------------------

BlockKey = tuple[str, str]  # (task id, block id)


@dataclass
class _Segment:
    start: datetime
    opener: E.Actor  # the actor of the event that opened the stretch
    block: BlockKey | None  # the block whose host it ran on
    n: int  # the task's nth time in flight
    end: datetime | None = None


@dataclass
class _Task:
    state: Task = field(default_factory=lambda: Task(records=False))
    definer: E.Actor | None = None
    segments: list[_Segment] = field(default_factory=list)


class StretchBuilder:
    """Events in global order in (`add`), stretches out (`stretches`). Pure: no ledger."""

    def __init__(self) -> None:
        self.tasks: dict[str, _Task] = {}
        self.block_hosts: dict[BlockKey, str] = {}
        self.claims: dict[BlockKey, tuple[str, str, str]] = {}  # -> (graph, run id, host)
        self.runs: dict[tuple[str, str], E.GraphRunStarted] = {}  # (graph, run id) -> start

    def add(self, stream: str, ev: E.Event) -> None:
        if stream.startswith(GRAPH_PREFIX):
            graph = stream[len(GRAPH_PREFIX):]
            if isinstance(ev, E.GraphRunStarted):
                self.runs[graph, ev.run_id] = ev
            elif isinstance(ev, E.NodeStarted):
                # The claim names the node's attempt; its task-stream block is `a<attempt>`.
                self.claims[node_task_id(graph, ev.node), f"a{ev.attempt}"] = (
                    graph, ev.run_id, str(getattr(ev, "host", "") or ""))
            return
        tid = task_of(stream)
        if tid is None:
            return
        t = self.tasks.get(tid)
        if t is None:
            t = self.tasks[tid] = _Task()
        before = t.state.status
        apply(t.state, ev)
        after = t.state.status
        if isinstance(ev, E.TaskDefined):
            t.definer = ev.actor
        block: BlockKey | None = None
        if isinstance(ev, E.LoopBlockStarted) and t.state.blocks:
            block = (tid, t.state.blocks[-1].block_id)
            self.block_hosts[block] = ev.host
        at = ev.occurred_at
        running_before, running_after = before == "running", after == "running"
        if not running_before and running_after:
            last = (tid, t.state.blocks[-1].block_id) if t.state.blocks else None
            n = t.segments[-1].n + 1 if t.segments else 1
            t.segments.append(_Segment(at, ev.actor, block or last, n))
        elif running_before and running_after and block is not None and t.segments:
            cur = t.segments[-1]  # the stretch goes on, on the new block's host
            cur.end = max(at, cur.start)
            t.segments.append(_Segment(cur.end, cur.opener, block, cur.n))
        elif running_before and not running_after and t.segments:
            t.segments[-1].end = max(at, t.segments[-1].start)

    def _host(self, block: BlockKey | None) -> str:
        if block is None:
            return UNKNOWN
        if h := self.block_hosts.get(block):
            return h
        claim = self.claims.get(block)
        if claim is None:
            return UNKNOWN
        graph, run_id, host = claim
        run = self.runs.get((graph, run_id))
        return host or (run.host if run is not None and run.host else UNKNOWN)

    def _engineer(self, t: _Task, seg: _Segment) -> str:
        if t.definer is not None and t.definer.kind == "human":
            return t.definer.name
        if seg.opener.kind == "human":
            return seg.opener.name
        claim = self.claims.get(seg.block) if seg.block else None
        run = self.runs.get(claim[:2]) if claim else None
        if run is not None and run.actor.kind == "human":
            return run.actor.name
        return t.definer.name if t.definer is not None else UNKNOWN

    def _nested(self, tid: str) -> bool:
        """A graph node's task loop: `<node task>.<block>` of a claimed node attempt."""
        parent, dot, block = tid.rpartition(".")
        return bool(dot) and (parent, block) in self.claims and parent in self.tasks

    def stretches(self) -> list[Stretch]:
        """Every stretch, by task then time; consecutive segments of one time in flight on
        one host (for one engineer) are one stretch."""
        out: list[Stretch] = []
        for tid, t in self.tasks.items():
            if self._nested(tid):
                continue
            mine: list[Stretch] = []
            for seg in t.segments:
                s = Stretch(tid, seg.start, seg.end, self._engineer(t, seg),
                            self._host(seg.block), seg.n)
                prev = mine[-1] if mine else None
                if prev is not None and (prev.n, prev.host, prev.engineer) == (
                        s.n, s.host, s.engineer):
                    mine[-1] = Stretch(tid, prev.start, s.end, s.engineer, s.host, s.n)
                else:
                    mine.append(s)
            out += mine
        return out


def read_stretches(ledger: Ledger, *, stop: int | None = None,
                   on_error: OnError = None) -> list[Stretch]:
    """Every task's stretches in flight from the ledger, up to position `stop` (inclusive).
    An undecodable event is handed to `on_error` and left out (without one, it raises)."""
    b = StretchBuilder()
    for r in ledger.log(1, stop, READ_TYPES, on_error=on_error):
        b.add(r.stream, r.event)
    return b.stretches()


def position_time(ledger: Ledger, position: int) -> datetime | None:
    """The time of the event at `position` (None when there is none or it cannot be read)."""
    recs: list[Recorded] = list(ledger.log(position, position, include_bookkeeping=True,
                                           on_error=lambda _u: None))
    return recs[0].event.occurred_at if recs else None


# --- the computation (pure) --------------------------------------------------------------

Series = list[tuple[datetime, int]]  # (time, count from then until the next point)


def series(stretches: Iterable[Stretch], start: datetime, end: datetime,
           now: datetime) -> Series:
    """The number of stretches in flight over [start, end): the count at `start`, then a point
    at each change. Stretches still in flight end at `now`."""
    deltas: dict[datetime, int] = defaultdict(int)
    level = 0
    for s in stretches:
        a, b = s.start, s.until(now)
        if b <= a or b <= start or a >= end:
            continue
        if a <= start:
            level += 1
        else:
            deltas[a] += 1
        if b < end:
            deltas[b] -= 1
    out: Series = [(start, level)]
    for t in sorted(deltas):
        if deltas[t]:
            level += deltas[t]
            out.append((t, level))
    return out


def peak(points: Series) -> tuple[int, datetime]:
    """The highest count and the first time it was reached."""
    value, at = points[0][1], points[0][0]
    for t, n in points:
        if n > value:
            value, at = n, t
    return value, at


def period_start(t: datetime, period: Period) -> datetime:
    """The start (UTC) of the day, ISO week (Monday) or month holding `t`."""
    d = t.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return d - timedelta(days=d.weekday())
    if period == "month":
        return d.replace(day=1)
    return d


def _next_period(p: datetime, period: Period) -> datetime:
    if period == "month":
        return p.replace(year=p.year + 1, month=1) if p.month == 12 else p.replace(
            month=p.month + 1)
    return p + timedelta(days=7 if period == "week" else 1)


def period_label(p: datetime, period: Period) -> str:
    if period == "week":
        year, week, _ = p.isocalendar()
        return f"{year}-W{week:02d}"
    return p.strftime("%Y-%m" if period == "month" else "%Y-%m-%d")


def period_peaks(points: Series, end: datetime, period: Period
                 ) -> list[tuple[str, datetime, int, datetime]]:
    """(label, period start, peak, when first reached) for each period from the one holding
    the series' start to the one holding `end` (a period the window only partly covers is
    measured over the part it covers)."""
    times = [t for t, _ in points]
    out = []
    p = period_start(points[0][0], period)
    while p < end:
        nxt = _next_period(p, period)
        lo = max(p, points[0][0])
        i = bisect_right(times, lo) - 1  # the point in force at the period's start
        value, at = points[i][1], lo
        j = i + 1
        while j < len(points) and times[j] < nxt:
            if points[j][1] > value:
                value, at = points[j][1], times[j]
            j += 1
        out.append((period_label(p, period), p, value, at))
        p = nxt
    return out


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat()


def _summary(stretches: Sequence[Stretch], start: datetime, end: datetime, now: datetime,
             period: Period) -> dict[str, Any]:
    pts = series(stretches, start, end, now)
    value, at = peak(pts)
    at_peak = sorted({s.task_id for s in stretches if s.start <= at < s.until(now)})
    return {"tasks": len({s.task_id for s in stretches}),
            "stretches": len({(s.task_id, s.n) for s in stretches}),
            "peak": {"value": value, "at": _iso(at), "tasks": at_peak if value else []},
            "periods": [{"period": label, "start": _iso(p), "peak": v, "at": _iso(t)}
                        for label, p, v, t in period_peaks(pts, end, period)],
            "series": [[_iso(t), n] for t, n in pts]}


def concurrency(stretches: Sequence[Stretch], *, now: datetime, since: datetime | None = None,
                until: datetime | None = None, period: Period = "month",
                by: Sequence[str] = ()) -> dict[str, Any]:
    """Tasks in flight over [since, until) (default: from the first stretch's start to `now`;
    `until` is at most `now`): the overall count and, for each grouping in `by` (`engineer`,
    `host`), one per group; each with its step series, its peak (value, first time reached,
    the tasks in flight then) and the peak of each `period`. `open`: the tasks still in
    flight at `now`."""
    if period not in PERIODS:
        raise ProjectionError(f"period {period!r}: one of {', '.join(PERIODS)}")
    for g in by:
        if g not in GROUPINGS:
            raise ProjectionError(f"by {g!r}: one of {', '.join(GROUPINGS)}")
    now = now.astimezone(UTC)
    end = min(until.astimezone(UTC), now) if until is not None else now
    start = (since.astimezone(UTC) if since is not None
             else min([s.start for s in stretches] + [end]))
    if start > end:
        raise ProjectionError(f"since {_iso(start)} is after until {_iso(end)} (until is at "
                              "most now)")
    window = [s for s in stretches if s.start < end and s.until(now) > start]
    out: dict[str, Any] = {"since": _iso(start), "until": _iso(end), "now": _iso(now),
                           "period": period,
                           "open": sorted({s.task_id for s in window if s.end is None}),
                           "overall": _summary(window, start, end, now, period), "groups": {}}
    for g in by:
        groups: dict[str, list[Stretch]] = defaultdict(list)
        for s in window:
            groups[s.engineer if g == "engineer" else s.host].append(s)
        out["groups"][g] = {name: _summary(ss, start, end, now, period)
                            for name, ss in sorted(groups.items())}
    return out


def concurrency_report(ledger: Ledger, *, by: Sequence[str] = (), since: datetime | None = None,
                       until: datetime | None = None, period: Period = "month",
                       now: datetime | None = None, on_error: OnError = None
                       ) -> dict[str, Any]:
    """`forge concurrency`: `concurrency` over the ledger's stretches, up to `now` (default:
    the current time)."""
    return concurrency(read_stretches(ledger, on_error=on_error), now=now or utcnow(),
                       since=since, until=until, period=period, by=by)


# --- the human rendering -----------------------------------------------------------------

MAX_GROUP_COLUMNS = 6  # groups shown as period columns; --json has every one


def _shown(name: str, width: int = 20) -> str:
    """A name as one printable line (a name is user text: no control sequence reaches the
    terminal), cut to `width`."""
    s = "".join(c if c.isprintable() else "?" for c in name)
    return s if len(s) <= width else s[:width - 1] + "…"


def _t(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S")


def report_lines(rep: dict[str, Any]) -> list[str]:
    """`forge concurrency` for a person: the window, the peak, a table of the peak of each
    period (a column per group, the highest first, when grouped) and one row per group."""
    o = rep["overall"]
    pk = o["peak"]
    if not o["stretches"]:
        return [f"no task was in flight from {_t(rep['since'])} to {_t(rep['until'])} UTC"]
    lines = [f"tasks in flight {_t(rep['since'])} → {_t(rep['until'])} UTC: {o['tasks']} "
             f"task(s) in {o['stretches']} stretch(es), {len(rep['open'])} still in flight",
             f"peak {pk['value']} at {_t(pk['at'])} UTC"
             + (f" ({', '.join(_shown(t, 40) for t in pk['tasks'][:8])}"
                f"{', …' if len(pk['tasks']) > 8 else ''})" if pk["tasks"] else "")]
    for g, groups in rep["groups"].items():
        ranked = sorted(groups, key=lambda n: (-groups[n]["peak"]["value"], n))
        shown = ranked[:MAX_GROUP_COLUMNS]
        lines += ["", f"{'period':<10} {'all':>5} " + " ".join(f"{_shown(n, 12):>12}"
                                                              for n in shown)]
        for i, per in enumerate(o["periods"]):
            lines.append(f"{per['period']:<10} {per['peak']:>5} " + " ".join(
                f"{groups[n]['periods'][i]['peak']:>12}" for n in shown))
        if len(ranked) > len(shown):
            lines.append(f"(+{len(ranked) - len(shown)} more {g}s: --json lists every one)")
        lines += ["", f"{g:<20} {'tasks':>6} {'peak':>5}  at (UTC)"]
        lines += [f"{_shown(n):<20} {groups[n]['tasks']:>6} {groups[n]['peak']['value']:>5}  "
                  f"{_t(groups[n]['peak']['at'])}" for n in ranked]
    if not rep["groups"]:
        lines += ["", f"{'period':<10} {'peak':>5}  at (UTC)"]
        lines += [f"{p['period']:<10} {p['peak']:>5}  {_t(p['at'])}" for p in o["periods"]]
    return lines
