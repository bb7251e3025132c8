"""`forge task reopen`: an exited task runs again once its blocker is gone; the exit stays in
the task's history (the one fold's `exits`), the loop measures a baseline that blocked it
again, time spent exited does not count against the wall budget, and what cannot be reopened
is refused in one line with nothing written."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    exit_task,
    handoff_block,
    record_measurement,
    reopen_task,
    start_block,
)
from infer_forge.harness.loop.run import exit_due, run_task
from infer_forge.harness.task import load_task_from_ledger
from infer_forge.ledger import events as E
from infer_forge.ledger.clock import utcnow
from infer_forge.ledger.replay import replay_task
from infer_forge.ledger.state import replay
from infer_forge.ledger.streams import task_stream
from infer_forge.projections.memory import build_memory, task_memory
from infer_forge.wiki.build import build as build_wiki
from infer_forge.wiki.page import parse_frontmatter

from tests.conftest import run_forge

from .test_loop import make_task_dir

METRICS = {"output_throughput": 100.0, "median_ttft_ms": 90.0, "token_match": 1.0}


def _exits(ws, task_id: str) -> list[tuple[str, str | None]]:
    return [(x["state"], x["reopened"]) for x in replay_task(ws.ledger, task_id).exits]


def test_reopen_after_a_failing_baseline_runs_on_to_delivered(workspace, tmp_path, monkeypatch):
    monkeypatch.setenv("EVAL_MODE", "fail-baseline")
    define_task(workspace, make_task_dir(tmp_path / "s", "fb"))
    r = run_task(workspace, "fb")
    assert (r.exit_state, r.blocks) == ("failed-blocked", 1)
    # Still blocked by the exit: nothing more runs until it is reopened.
    assert run_task(workspace, "fb").exit_state == "failed-blocked"
    monkeypatch.delenv("EVAL_MODE")  # the blocker is gone
    info = reopen_task(workspace, "fb", "the evaluator is fixed")
    assert info["reopened"] == "failed-blocked"
    mem = task_memory(workspace.ledger, "fb")
    assert (mem.status, mem.exit_state, mem.next_block) == ("running", None,
                                                           {"index": 2, "sub_goal": None})
    r = run_task(workspace, "fb")
    assert (r.status, r.exit_state, r.blocks) == ("exited", "delivered", 5)
    mem = r.memory
    # b1 (every run failed) stays in the record; b2 measures the baseline again and is the
    # one the candidates are judged against.
    assert [b.candidate == {} for b in mem.execution_record] == [True, True, False, False,
                                                                 False]
    assert not any(m["success"] for m in mem.execution_record[0].measurements)
    assert mem.baseline["block_id"] == "b2" and mem.baseline["median"] == pytest.approx(100)
    assert [b.decision for b in mem.execution_record] == [None, None, "rejected", "rejected",
                                                          "accepted"]
    assert _exits(workspace, "fb") == [("failed-blocked", "the evaluator is fixed"),
                                       ("delivered", None)]
    # Through the CLI: replay shows both exits, check is clean.
    p = run_forge("replay", "fb", "--json")
    assert p.returncode == 0
    exits = json.loads(p.stdout)["exits"]
    assert [x["state"] for x in exits] == ["failed-blocked", "delivered"]
    assert "exited 3" in exits[0]["reason"] and exits[0]["reopened"] == "the evaluator is fixed"
    p = run_forge("replay", "fb")
    assert "exits: failed-blocked (reopened: the evaluator is fixed) -> delivered" in p.stdout
    p = run_forge("check")
    assert p.returncode == 0, p.stdout + p.stderr
    # The wiki builds, the task page at its final exit.
    build_wiki(workspace, embeddings=False)
    page = (workspace.home / "wiki/tasks/fb.md").read_text()
    assert parse_frontmatter(page)["exit_state"] == "delivered"


def test_reopen_after_the_evaluator_could_not_start(workspace, tmp_path):
    """The evaluator failed before measuring anything (its executable was missing): after the
    reopen the loop measures the baseline it never had, then goes on."""
    exe = tmp_path / "bin" / "python"
    path = make_task_dir(tmp_path / "s", "nx")
    path.write_text(path.read_text().replace(json.dumps(sys.executable), json.dumps(str(exe))))
    define_task(workspace, path)
    r = run_task(workspace, "nx")
    assert r.exit_state == "failed-blocked" and "not found" in r.exit_reason
    assert r.memory.execution_record[0].measurements == []
    exe.parent.mkdir()
    os.symlink(sys.executable, exe)
    p = run_forge("task", "reopen", "nx", "--reason", "python installed", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["reopened"] == "failed-blocked"
    p = run_forge("task", "resume", "nx", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["exit_state"] == "delivered"
    mem = task_memory(workspace.ledger, "nx")
    assert mem.baseline["block_id"] == "b2" and len(mem.execution_record) == 5
    assert _exits(workspace, "nx") == [("failed-blocked", "python installed"),
                                       ("delivered", None)]


def test_a_reopened_manual_task_takes_blocks_again(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "s", "man", executor="{kind: manual}"))
    start_block(workspace, "man", "baseline")
    record_measurement(workspace, "man", METRICS)
    handoff_block(workspace, "man", state_reached="one run")
    exit_task(workspace, "man", "aborted-by-human", "lunch")
    with pytest.raises(HarnessError, match="has exited"):
        start_block(workspace, "man", "more", {"engine.continuous_batching": True})
    reopen_task(workspace, "man", "back")
    start_block(workspace, "man", "more", {"engine.continuous_batching": True})
    record_measurement(workspace, "man", METRICS)
    exit_task(workspace, "man", "failed-blocked", "engine image broken")
    reopen_task(workspace, "man", "image rebuilt")
    assert _exits(workspace, "man") == [("aborted-by-human", "back"),
                                        ("failed-blocked", "image rebuilt")]
    state = replay_task(workspace.ledger, "man")
    assert (state.status, state.exit_state, len(state.blocks)) == ("running", None, 2)


@pytest.mark.parametrize("reason", ["", "   "])
def test_reopen_needs_a_reason(workspace, tmp_path, reason):
    define_task(workspace, make_task_dir(tmp_path / "s", "t"))
    exit_task(workspace, "t", "aborted-by-human", "x")
    before = workspace.ledger.version(task_stream("t"))
    with pytest.raises(HarnessError, match="needs --reason"):
        reopen_task(workspace, "t", reason)
    assert workspace.ledger.version(task_stream("t")) == before


def test_what_cannot_be_reopened_is_one_line_and_writes_nothing(forge_home, tmp_path):
    from infer_forge.ledger.workspace import open_workspace

    assert run_forge("init").returncode == 0
    for tid in ("defined", "running", "budget"):
        assert run_forge("task", "new", str(make_task_dir(
            tmp_path / tid, tid, executor="{kind: manual}", max_blocks=1))).returncode == 0
    with open_workspace(forge_home) as ws:
        start_block(ws, "running", "baseline")
        start_block(ws, "budget", "baseline")
        handoff_block(ws, "budget", state_reached="done")
        exit_task(ws, "budget", "failed-budget", "one block")
        versions = {t: ws.ledger.version(task_stream(t)) for t in ("defined", "running",
                                                                   "budget")}
    cases = [("running", "is running, not exited"), ("defined", "is defined, not exited"),
             ("budget", "exited failed-budget: it cannot be reopened"),
             ("nope", "unknown task 'nope'")]
    for tid, says in cases:
        p = run_forge("task", "reopen", tid, "--reason", "again")
        assert p.returncode != 0 and says in p.stderr, (tid, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    p = run_forge("task", "reopen", "running")
    assert p.returncode != 0 and "--reason" in p.stderr
    with open_workspace(forge_home) as ws:
        assert {t: ws.ledger.version(task_stream(t)) for t in versions} == versions


def test_a_delivered_task_cannot_be_reopened(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "s", "d"))
    assert run_task(workspace, "d").exit_state == "delivered"
    with pytest.raises(HarnessError, match="delivered: it cannot be reopened"):
        reopen_task(workspace, "d", "more")


def test_time_spent_exited_does_not_count_against_the_wall_budget(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "s", "w", executor="{kind: manual}"))
    lt = load_task_from_ledger(workspace, "w")  # max_wall_s 3600
    t0 = utcnow() - timedelta(hours=5)
    c = {"task_id": "w", "block_id": "b1"}
    workspace.ledger.append(task_stream("w"), [
        E.LoopBlockStarted(index=1, sub_goal="baseline", occurred_at=t0, **c),
        E.MeasurementRecorded(run_id="r", source="manual", metrics=METRICS, **c),
        E.LoopBlockHandedOff(state_reached="x", occurred_at=t0 + timedelta(minutes=10), **c),
        E.TaskExited(state="failed-blocked", reason="gpu gone", task_id="w",
                     occurred_at=t0 + timedelta(minutes=10)),
        E.TaskReopened(reason="gpu back", task_id="w",
                       occurred_at=t0 + timedelta(hours=4, minutes=50))])
    mem = task_memory(workspace.ledger, "w")
    assert mem.paused_s == pytest.approx(4 * 3600 + 40 * 60)
    assert exit_due(lt, mem) is None  # 20 minutes of work, not 5 hours
    # The same history without the pause is over budget.
    assert exit_due(lt, mem.model_copy(update={"paused_s": 0.0}))[0] == "failed-budget"


def test_the_fold_keeps_every_exit():
    t = {"task_id": "t"}
    evs = [E.TaskDefined(title="t", task_type="x", goal="g", definition={},
                         definition_hash="h", **t),
           E.TaskReopened(reason="not exited: nothing to mark", **t),
           E.TaskExited(state="failed-no-progress", reason="stuck", **t),
           E.TaskReopened(reason="new idea", **t),
           E.TaskExited(state="follow-up-handoff", reason="over to ana", handoff="notes", **t)]
    state = replay(evs)
    assert state.exits == [
        {"state": "failed-no-progress", "reason": "stuck", "reopened": "new idea"},
        {"state": "follow-up-handoff", "reason": "over to ana", "reopened": None}]
    assert (state.status, state.exit_state) == ("exited", "follow-up-handoff")
    mem = build_memory(evs)
    assert (mem.status, mem.exit_state, mem.exits) == ("exited", "follow-up-handoff",
                                                      state.exits)
    assert "exits" not in mem.model_dump()  # `forge task memory` shows what it always did

