"""One writer of task streams (`harness.record`): every appender (the loop, the manual path,
bench record/import, correctness, graph work) is checked against Task Memory and appends
with the stream version expected."""

from __future__ import annotations

import pytest
from infer_forge.harness.bench.importer import import_results
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.manual import exit_task, handoff_block, record_measurement
from infer_forge.harness.record import append_to_task, check_events, task_append
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import ConflictError
from infer_forge.ledger.streams import (
    GRAPH_PREFIX,
    MEASUREMENTS_STREAM,
    TASK_PREFIX,
    WORKSPACE_STREAM,
    graph_stream,
    task_of,
    task_stream,
)
from infer_forge.projections.memory import read_memory

from tests.conftest import REPO, TESTS, run_forge
from tests.helpers.tasks import measurements, open_task

from .loop.test_loop import make_task_dir

V05 = TESTS / "data" / "bench_serving" / "sglang-0.5.4.jsonl"


def meas(task_id: str | None = "t1", block_id: str | None = "b1", run: str = "r") -> E.Event:
    return E.MeasurementRecorded(run_id=run, source="test", metrics={"x": 1.0},
                                 task_id=task_id, block_id=block_id)


def _unchanged(ws):
    """Positions and artifacts now, to assert a refusal wrote nothing."""
    return ws.ledger.max_position(), sorted(ws.artifacts.digests())


def test_a_measurement_into_a_block_that_is_not_open_is_refused(workspace, tmp_path):
    ws = workspace
    block = open_task(ws, tmp_path)
    handoff_block(ws, "t1", state_reached="done")  # b1 is closed now
    before = _unchanged(ws)
    cases = {
        "b1": "block b1 is handed off; no block is open (forge block start)",
        "b7": "the task has no block b7; no block is open",
    }
    for bid, says in cases.items():
        with pytest.raises(HarnessError) as e:
            import_results(ws, V05, task_id="t1", block_id=bid)
        assert says in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(HarnessError, match=says.split(";")[0]):
            append_to_task(ws, "t1", [meas(block_id=bid)])
    assert _unchanged(ws) == before  # no event, no artifact
    # Task-level (no block): a defined task that has not exited takes it.
    out = import_results(ws, V05, task_id="t1")
    assert out["recorded"] == 2 and {m.block_id for m in measurements(ws, "t1")} == {None}
    assert block == "b1"


def test_unknown_and_exited_tasks_take_nothing(workspace, tmp_path):
    ws = workspace
    before = _unchanged(ws)
    for task in ("nope", "t1"):
        with pytest.raises(HarnessError, match=f"unknown task {task!r}"):
            import_results(ws, V05, task_id=task)
    assert _unchanged(ws) == before
    open_task(ws, tmp_path)
    exit_task(ws, "t1", "aborted-by-human", "stop")
    before = _unchanged(ws)
    for bid in (None, "b1"):
        with pytest.raises(HarnessError, match=r"task t1 has exited \(aborted-by-human\)"):
            import_results(ws, V05, task_id="t1", block_id=bid)
    assert _unchanged(ws) == before


def test_cli_bench_import_into_a_closed_block_is_one_line(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    assert run_forge("task", "new", str(make_task_dir(tmp_path / "specs"))).returncode == 0
    assert run_forge("block", "start", "t1", "--sub-goal", "try").returncode == 0
    assert run_forge("block", "handoff", "t1", "--state-reached", "done").returncode == 0
    r = run_forge("bench", "import", str(V05), "--task", "t1", "--block", "b1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "block b1 is handed off" in line
    assert not [p for p in (forge_home / "artifacts").rglob("*") if p.is_file()]


def test_the_order_of_events_in_one_save_is_checked(workspace, tmp_path):
    ws = workspace
    open_task(ws, tmp_path)
    mem, _ = read_memory(ws.ledger, "t1")
    c = {"task_id": "t1"}
    start2 = E.LoopBlockStarted(index=2, sub_goal="s", block_id="b2", **c)
    handoff1 = E.LoopBlockHandedOff(block_id="b1", **c)
    # A second block while b1 is open: refused; after b1's handoff in the same save: fine.
    with pytest.raises(HarnessError, match="block b1 is still open"):
        check_events("t1", mem, [start2])
    check_events("t1", mem, [handoff1, start2, meas(block_id="b2")])
    with pytest.raises(HarnessError, match="block b1 is handed off; the open block is b2"):
        check_events("t1", mem, [handoff1, start2, meas(block_id="b1")])
    # A decision may name an earlier block; a verification only the open one.
    check_events("t1", mem, [handoff1, E.DirectionRejected(reason="r", block_id="b1", **c)])
    with pytest.raises(HarnessError, match="VerificationRecorded belongs in a block"):
        check_events("t1", mem, [E.VerificationRecorded(contract_hash="c", passed=True,
                                                        verdict="pass", **c)])
    # Nothing after an exit in the same save but a reopen; a reopen needs an exit.
    exit_ = E.TaskExited(state="aborted-by-human", reason="r", **c)
    with pytest.raises(HarnessError, match="exited .earlier in this save"):
        check_events("t1", mem, [exit_, meas()])
    check_events("t1", mem, [exit_, E.TaskReopened(reason="back", **c)])
    with pytest.raises(HarnessError, match="the task has not exited"):
        check_events("t1", mem, [E.TaskReopened(reason="back", **c)])
    # Every event names this task; a TaskDefined only opens an empty stream.
    with pytest.raises(HarnessError, match="names task 't2'"):
        check_events("t1", mem, [meas(task_id="t2")])
    with pytest.raises(HarnessError, match="already defined"):
        check_events("t1", mem, [E.TaskDefined(title="t", task_type="x", goal="g",
                                               definition={}, definition_hash="h", **c)])


def test_concurrent_appends_conflict(workspace, tmp_path):
    """Two writers that read the same version: the second one's save is refused with
    ConflictError (never interleaved), and the stream holds the first one's event only."""
    ws = workspace
    open_task(ws, tmp_path)
    first = task_append(ws, "t1", [meas(run="first")])
    second = task_append(ws, "t1", [meas(run="second")])
    assert first.expected_version == second.expected_version
    ws.ledger.save(first)
    with pytest.raises(ConflictError) as e:
        ws.ledger.save(second)
    assert e.value.stream == task_stream("t1")
    assert [m.run_id for m in measurements(ws, "t1")] == ["first"]
    # A manual measurement computed on a version that moved is refused too.
    _, version = read_memory(ws.ledger, "t1")
    append_to_task(ws, "t1", [meas(run="third")])
    with pytest.raises(ConflictError):
        append_to_task(ws, "t1", [meas(run="fourth")], expected_version=version)
    assert [m.run_id for m in measurements(ws, "t1")] == ["first", "third"]
    record_measurement(ws, "t1", {"x": 2.0})  # the manual path reads the version itself
    assert len(measurements(ws, "t1")) == 3


def test_measurements_without_a_task_go_to_their_stream(workspace):
    out = import_results(workspace, V05)
    assert out["stream"] == MEASUREMENTS_STREAM
    assert len(workspace.ledger.stream_log(MEASUREMENTS_STREAM)) == 2


def test_stream_names_live_in_one_module():
    """Stream names are built by ledger.streams only: no other module spells a stream
    prefix or a fixed stream name as a literal (comments and command ids aside)."""
    assert task_stream("a.b") == "task:a.b" and task_of("task:a.b") == "a.b"
    assert graph_stream("g") == "graph:g" and task_of("graph:g") is None
    literals = [f'"{TASK_PREFIX}', f"'{TASK_PREFIX}", f'"{GRAPH_PREFIX}', f"'{GRAPH_PREFIX}",
                f'f"{TASK_PREFIX}', f'f"{GRAPH_PREFIX}', f'= "{WORKSPACE_STREAM}"',
                f'= "{MEASUREMENTS_STREAM}"', '= "command:"', '= "engines"']
    found = []
    for sub in ("ledger", "projections", "harness", "wiki"):
        for p in sorted((REPO / sub).rglob("*.py")):
            if p.name == "streams.py":
                continue
            for n, line in enumerate(p.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if "command_id=" not in code:
                    found += [f"{p.relative_to(REPO)}:{n}: {lit}" for lit in literals
                              if lit in code]
    assert found == []
