"""Tasks in flight over time (`forge concurrency`, the journal's concurrency page): real task
runs on the manual path and a real graph run with two workers, the peak and its time read back
from the ledger; the per-period peaks on a ledger whose block times are set; the page."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from infer_forge.harness.graph.commands import define_graph
from infer_forge.harness.graph.run import run_graph
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import exit_task, handoff_block, reopen_task, start_block
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import graph_stream, task_stream
from infer_forge.projections.concurrency import (
    Stretch,
    concurrency,
    concurrency_report,
    period_peaks,
    read_stretches,
    series,
)
from infer_forge.projections.errors import ProjectionError
from infer_forge.wiki.build import build
from infer_forge.wiki.lint import lint
from infer_forge.wiki.page import LINK, parse_frontmatter
from infer_forge.wiki.plot import Point, Steps, plot_svg, steps_svg

from tests.conftest import insert_raw_event, run_forge

from ..graph.test_graph_run import define_loop_graph
from .test_loop import make_task_dir

ANA, BO = E.Actor.human("ana"), E.Actor.human("bo")
CB = {"engine.continuous_batching": True}


def t(day: int, hour: int = 0) -> datetime:
    """A time `day` days after 2026-01-01 00:00 UTC."""
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=day, hours=hour)


def _define(ws, tmp_path, tid: str, actor: E.Actor) -> None:
    define_task(ws, make_task_dir(tmp_path / f"spec-{tid}", tid, executor="{kind: manual}"),
                actor=actor)


def _time_of(ws, tid: str, etype: str, nth: int = 0) -> datetime:
    evs = [r.event for r in ws.ledger.stream(task_stream(tid)) if r.type == etype]
    return evs[nth].occurred_at.astimezone(UTC)


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat()


# --- the computation ---------------------------------------------------------------------


def test_half_open_stretches_carry_into_the_window_and_give_each_period_its_peak():
    s = [Stretch("a", t(0), t(2), "ana", "h1"),
         Stretch("b", t(2), t(3), "bo", "h1"),        # starts as a ends: never both
         Stretch("c", t(1), None, "ana", "h2")]       # still in flight
    now = t(4)
    assert series(s, t(0), now, now) == [(t(0), 1), (t(1), 2), (t(3), 1)]
    # From day 1.5 on: a and c are in flight when the window opens.
    assert series(s, t(1, 12), now, now)[0] == (t(1, 12), 2)
    days = period_peaks(series(s, t(0), now, now), now, "day")
    assert [(lab, v) for lab, _, v, _ in days] == [
        ("2026-01-01", 1), ("2026-01-02", 2), ("2026-01-03", 2), ("2026-01-04", 1)]
    assert days[1][3] == t(1)  # when the day's peak was first reached
    rep = concurrency(s, now=t(6), period="week", by=("engineer", "host"))
    assert rep["overall"]["peak"] == {"value": 2, "at": _iso(t(1)), "tasks": ["a", "c"]}
    assert [(p["period"], p["peak"]) for p in rep["overall"]["periods"]] == [
        ("2026-W01", 2), ("2026-W02", 1)]  # ISO weeks: 2026-W01 starts on 2025-12-29
    assert rep["open"] == ["c"]
    assert {n: g["peak"]["value"] for n, g in rep["groups"]["engineer"].items()} == {
        "ana": 2, "bo": 1}
    assert {n: g["peak"]["value"] for n, g in rep["groups"]["host"].items()} == {
        "h1": 1, "h2": 1}
    with pytest.raises(ProjectionError, match="since .* is after until"):
        concurrency(s, now=now, since=t(3), until=t(2))
    # Until before the first start, no since: an empty window, not an error.
    assert concurrency(s, now=now, until=t(-1))["overall"]["peak"]["value"] == 0
    with pytest.raises(ProjectionError, match="period 'year'"):
        concurrency(s, now=now, period="year")  # type: ignore[arg-type]


# --- real runs ---------------------------------------------------------------------------


def test_overlapping_manual_tasks_give_the_peak_per_engineer_and_host(workspace, tmp_path,
                                                                     monkeypatch):
    for tid, who in (("t1", ANA), ("t2", BO), ("t3", ANA)):
        _define(workspace, tmp_path, tid, who)
    monkeypatch.setenv("FORGE_NODE", "gpu-a")
    start_block(workspace, "t1", "baseline", actor=ANA)
    start_block(workspace, "t2", "baseline", actor=BO)
    monkeypatch.setenv("FORGE_NODE", "gpu-b")
    start_block(workspace, "t3", "baseline", actor=ANA)
    handoff_block(workspace, "t1", state_reached="measured", actor=ANA)
    exit_task(workspace, "t1", "aborted-by-human", "enough", actor=ANA)
    exit_task(workspace, "t2", "failed-blocked", "gpu gone", actor=BO)
    rep = concurrency_report(workspace.ledger, by=("engineer", "host"), period="day")
    third = _time_of(workspace, "t3", "LoopBlockStarted")
    assert rep["overall"]["peak"] == {"value": 3, "at": _iso(third),
                                      "tasks": ["t1", "t2", "t3"]}
    assert rep["since"] == _iso(_time_of(workspace, "t1", "LoopBlockStarted"))
    assert [n for _, n in rep["overall"]["series"]] == [1, 2, 3, 2, 1]
    assert rep["open"] == ["t3"]  # still in flight: counted until now
    eng = rep["groups"]["engineer"]
    assert {n: (g["tasks"], g["peak"]["value"]) for n, g in eng.items()} == {
        "ana": (2, 2), "bo": (1, 1)}
    assert eng["ana"]["peak"]["at"] == _iso(third)
    hosts = rep["groups"]["host"]
    assert {n: g["peak"]["value"] for n, g in hosts.items()} == {"gpu-a": 2, "gpu-b": 1}
    # A window after t1 and t2 exited: only t3, carried in at its start.
    later = _time_of(workspace, "t2", "TaskExited")
    rep = concurrency_report(workspace.ledger, since=later)
    assert rep["overall"]["series"][0] == [_iso(later), 1]
    assert rep["overall"]["peak"]["value"] == 1


def test_a_reopened_task_counts_again_and_moves_with_its_blocks(workspace, tmp_path,
                                                               monkeypatch):
    _define(workspace, tmp_path, "r", ANA)
    monkeypatch.setenv("FORGE_NODE", "gpu-a")
    start_block(workspace, "r", "baseline", actor=ANA)
    handoff_block(workspace, "r", state_reached="measured", actor=ANA)
    exit_task(workspace, "r", "failed-blocked", "gpu gone", actor=ANA)
    reopen_task(workspace, "r", "gpu back", actor=ANA)
    monkeypatch.setenv("FORGE_NODE", "gpu-b")
    start_block(workspace, "r", "try cb", candidate=CB, actor=ANA)
    exit_task(workspace, "r", "aborted-by-human", "done", actor=ANA)
    got = [(s.start, s.end, s.host) for s in read_stretches(workspace.ledger)]
    assert got == [
        (_time_of(workspace, "r", "LoopBlockStarted"),
         _time_of(workspace, "r", "TaskExited"), "gpu-a"),
        # From the reopening on the host of its last block, then on its new block's host.
        (_time_of(workspace, "r", "TaskReopened"),
         _time_of(workspace, "r", "LoopBlockStarted", 1), "gpu-a"),
        (_time_of(workspace, "r", "LoopBlockStarted", 1),
         _time_of(workspace, "r", "TaskExited", 1), "gpu-b")]
    rep = concurrency_report(workspace.ledger, by=("engineer",))
    assert [n for _, n in rep["overall"]["series"]] == [1, 0, 1, 0]
    assert rep["overall"]["stretches"] == 2 and rep["overall"]["tasks"] == 1
    assert rep["groups"]["engineer"]["ana"]["peak"]["value"] == 1 and rep["open"] == []


PAIR = r"""touch {me}.ready
i=0
while [ ! -e {other}.ready ]; do
  i=$((i+1)); [ $i -gt 600 ] && exit 1
  sleep 0.05
done
"""


def test_a_graph_run_with_two_workers_shows_its_tasks_in_flight_on_its_host(workspace,
                                                                            tmp_path):
    # a and b wait (bounded) for each other: with two workers they must be in flight together.
    ok = [{"name": "ok", "sh": "true"}]
    spec = {"name": "pair", "nodes": [
        {"id": "a", "type": "evaluation", "work": {"sh": PAIR.format(me="a", other="b"),
                                                    "verify": ok}},
        {"id": "b", "type": "evaluation", "work": {"sh": PAIR.format(me="b", other="a"),
                                                    "verify": ok}},
        {"id": "c", "type": "evaluation", "work": {"sh": "true", "verify": ok}}],
        "edges": [{"from": "a", "to": "c", "kind": "handoff"},
                  {"from": "b", "to": "c", "kind": "handoff"}]}
    (tmp_path / "pair.yaml").write_text(yaml.safe_dump(spec))
    define_graph(workspace, tmp_path / "pair.yaml")
    assert run_graph(workspace, "pair", jobs=2).outcome == "completed"
    run = next(r.event for r in workspace.ledger.stream(graph_stream("pair"))
               if isinstance(r.event, E.GraphRunStarted))
    rep = concurrency_report(workspace.ledger, by=("host", "engineer"))
    assert rep["overall"]["peak"]["value"] == 2
    assert rep["overall"]["peak"]["tasks"] == ["pair.a", "pair.b"]
    assert rep["overall"]["tasks"] == 3 and rep["open"] == []
    assert set(rep["groups"]["host"]) == {run.host}  # the run's host, no block names one
    # The person who ran the graph (GraphRunStarted's actor: the OS user here), not the
    # graph runner that defined the node tasks (issue 32).
    assert set(rep["groups"]["engineer"]) == {run.actor.name} and run.actor.kind == "human"
    assert run.actor.name != "graph-runner"
    by_task = {s.task_id: s for s in read_stretches(workspace.ledger)}
    assert by_task["pair.c"].start >= max(by_task["pair.a"].end, by_task["pair.b"].end)
    assert by_task["pair.a"].end == _time_of(workspace, "pair.a", "TaskExited")


def test_a_loop_node_counts_as_its_node_not_twice(workspace, tmp_path):
    define_loop_graph(tmp_path, workspace)
    assert run_graph(workspace, "lg", jobs=1).outcome == "completed"
    assert workspace.ledger.version(task_stream("lg.tune.a1")) > 0  # the node's task loop
    rep = concurrency_report(workspace.ledger)
    assert rep["overall"]["tasks"] == 2 and rep["overall"]["peak"]["value"] == 1
    assert {s.task_id for s in read_stretches(workspace.ledger)} == {"lg.tune", "lg.check"}


# --- a ledger over four months ------------------------------------------------------------

# (task, engineer, start day, end day or None): the peak grows month by month, 2 → 4 → 6 → 9.
MONTHS = [(f"m{i}", ANA if i % 2 else BO, start, end) for i, (start, end) in enumerate(
    [(3, 20), (10, 25)]                                       # January: 2
    + [(33, 50), (34, 50), (35, 52), (36, 45)]                # February: 4
    + [(62, 80), (63, 80), (64, 80), (65, 81), (66, 82), (67, 70)]  # March: 6
    + [(92, 110), (93, 110), (94, 110), (95, 110), (96, 111), (97, 112), (98, 113),
       (99, 113), (100, None)])]                              # April: 9, one still in flight


def _months_ledger(ws, tmp_path) -> None:
    """Real task definitions; blocks and exits appended with their times set."""
    for tid, who, start, end in MONTHS:
        _define(ws, tmp_path, tid, who)
        c = {"task_id": tid, "block_id": "b1", "actor": who}
        evs: list[E.Event] = [E.LoopBlockStarted(index=1, sub_goal="baseline", host="h100-1",
                                                 occurred_at=t(start), **c)]
        if end is not None:
            evs.append(E.TaskExited(state="aborted-by-human", reason="done", task_id=tid,
                                    actor=who, occurred_at=t(end)))
        ws.ledger.append(task_stream(tid), evs)


def test_peaks_of_each_month_show_the_growth_cli_and_json(workspace, tmp_path):
    _months_ledger(workspace, tmp_path)
    now = t(120).isoformat()
    r = run_forge("concurrency", "--by", "engineer", "--until", now, "--json",
                  home=workspace.home)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [(p["period"], p["peak"]) for p in rep["overall"]["periods"]] == [
        ("2026-01", 2), ("2026-02", 4), ("2026-03", 6), ("2026-04", 9)]
    assert rep["overall"]["peak"]["value"] == 9
    assert rep["overall"]["peak"]["at"] == _iso(t(100))
    assert rep["open"] == ["m20"] and rep["until"] == _iso(t(120))
    eng = rep["groups"]["engineer"]
    assert [p["peak"] for p in eng["ana"]["periods"]] == [1, 2, 3, 4]
    assert [p["peak"] for p in eng["bo"]["periods"]] == [1, 2, 3, 5]
    r = run_forge("concurrency", "--by", "host", "--until", now, home=workspace.home)
    assert r.returncode == 0, r.stderr
    assert "peak 9 at 2026-04-11 00:00:00 UTC" in r.stdout
    assert re.search(r"^2026-01\s+2\s+2$", r.stdout, re.M)  # all tasks, then host h100-1
    assert re.search(r"^2026-04\s+9\s+9$", r.stdout, re.M)
    # March alone, by week: the window opens with what was in flight then.
    r = run_forge("concurrency", "--since", t(59).isoformat(), "--until", t(90).isoformat(),
                  "--period", "week", "--json", home=workspace.home)
    rep = json.loads(r.stdout)
    assert rep["overall"]["peak"]["value"] == 6 and rep["overall"]["series"][0][1] == 0
    assert rep["overall"]["periods"][0]["period"] == "2026-W09"


@pytest.mark.parametrize(("args", "says"), [
    (("--since", "yesterday"), "--since: 'yesterday' is not an ISO-8601 time"),
    (("--since", "2026-03-01", "--until", "2026-02-01"), "since 2026-03-01"),
    (("--period", "year"), "'year' is not one of"),
])
def test_bad_input_is_one_line_and_fails(workspace, args, says):
    r = run_forge("concurrency", *args, home=workspace.home)
    assert r.returncode != 0 and says in r.stderr, r.stderr


def test_an_empty_ledger_has_no_task_in_flight_and_no_page(workspace):
    r = run_forge("concurrency", "--by", "engineer", home=workspace.home)
    assert r.returncode == 0 and r.stdout.startswith("no task was in flight"), r.stderr
    rep = concurrency_report(workspace.ledger, by=("engineer",))
    assert rep["overall"]["peak"]["value"] == 0 and rep["groups"]["engineer"] == {}
    build(workspace, embeddings=False)
    assert not (workspace.home / "wiki" / "concurrency.md").exists()
    assert "Tasks in flight" not in (workspace.home / "wiki" / "index.md").read_text()


def test_an_undecodable_exit_is_reported_and_left_out(workspace, tmp_path):
    _define(workspace, tmp_path, "d", ANA)
    start_block(workspace, "d", "baseline", actor=ANA)
    version = workspace.ledger.version(task_stream("d"))
    pos = insert_raw_event(workspace.home, task_stream("d"), version + 1, "TaskExited",
                           b'{"state": "delivered", "reason": 3}')
    with pytest.raises(Exception, match=f"position {pos}"):
        read_stretches(workspace.ledger)
    bad: list = []
    assert [s.end for s in read_stretches(workspace.ledger, on_error=bad.append)] == [None]
    assert [u.position for u in bad] == [pos]
    r = run_forge("concurrency", home=workspace.home)
    assert r.returncode == 0 and f"undecodable event at position {pos}" in r.stderr
    assert "1 still in flight" in r.stdout


# --- the journal ---------------------------------------------------------------------------


def test_step_lines_are_drawn_alike_whatever_was_drawn_before_and_keep_text_as_text():
    lines = [Steps("all tasks", (0.0, 1.0, 3.0), (1.0, 2.0, 1.0), True),
             Steps("<b>bo</b> [[x]]", (0.0, 1.0), (1.0, 0.0))]
    first = steps_svg(lines, x_end=4.0, xlabel="days", ylabel="tasks", title="t")
    plot_svg([Point(1.0, 2.0, "b1", "accepted")], xlabel="x", ylabel="y", title="p")
    steps_svg([Steps("other", (0.0,), (40.0,))], x_end=1.0, xlabel="d", ylabel="n", title="o")
    assert steps_svg(lines, x_end=4.0, xlabel="days", ylabel="tasks", title="t") == first
    assert first.startswith("<svg") and "&lt;b&gt;bo&lt;/b&gt;" in first
    assert "<b>" not in first and "[[" not in first
    assert steps_svg([Steps("nan", (0.0,), (float("nan"),))], x_end=1.0, xlabel="d",
                     ylabel="n", title="o") == ""


# --- the journal: the page -----------------------------------------------------------------


def test_the_wiki_page_plots_tasks_in_flight_and_keeps_names_as_text(workspace, tmp_path,
                                                                    monkeypatch):
    evil = E.Actor.human("[[decisions/evil|x]] <b>mallory</b> `x`")
    _define(workspace, tmp_path, "w1", ANA)
    _define(workspace, tmp_path, "w2", evil)
    monkeypatch.setenv("FORGE_NODE", "gpu-a")
    start_block(workspace, "w1", "baseline", actor=ANA)
    start_block(workspace, "w2", "baseline", actor=evil)
    exit_task(workspace, "w1", "aborted-by-human", "enough", actor=ANA)
    build(workspace, embeddings=False)
    md = (workspace.home / "wiki" / "concurrency.md").read_text()
    fm = parse_frontmatter(md)
    assert fm["type"] == "concurrency" and fm["peak"] == 2 and fm["stretches"] == 2
    assert fm["peak_at"] == _iso(_time_of(workspace, "w2", "LoopBlockStarted"))
    # Two plots (by engineer, by host), a line per group and the total.
    assert md.count("<svg") == 2 and "Tasks in flight by engineer" in md
    assert "gpu-a" in md and "all tasks" in md
    links = [m.group(1) for m in LINK.finditer(md)]
    assert {"tasks/w1", "tasks/w2"} <= set(links) and "decisions/evil" not in links
    html = (workspace.home / "site" / "concurrency.html").read_text()
    assert "<b>mallory</b>" not in html and "&lt;b&gt;mallory&lt;/b&gt;" in html
    home = (workspace.home / "wiki" / "index.md").read_text()
    assert "[[concurrency|Tasks in flight]]" in home
    rep = lint(workspace)
    assert rep.ok, rep.as_dict()
    # The same ledger position gives the same page: open tasks end at its event's time.
    build(workspace, embeddings=False, force=True)
    assert (workspace.home / "wiki" / "concurrency.md").read_text() == md
