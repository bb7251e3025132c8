"""A task is folded once per loop step (issue 28): the step reads Task Memory, and the writer
(harness/record.py) checks the step against that memory and saves it with the version it was
read at, instead of reading and folding the whole stream a second time.

The counter wraps the one whole-stream fold of Task Memory, `projections.memory.build_memory`
(which `read_memory` calls for every read), so it counts folds of a whole stream, not the
per-event applies inside one.
"""

from __future__ import annotations

import sys

import pytest
from infer_forge.harness.loop import steps
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    handoff_block,
    record_measurement,
    run_command,
    start_block,
    verify_block,
)
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger.errors import ConflictError
from infer_forge.ledger.streams import task_stream
from infer_forge.projections import memory

from .test_loop import make_task_dir


@pytest.fixture
def folds(monkeypatch) -> list[int]:
    """A list that grows by one at every whole-stream fold of Task Memory."""
    seen: list[int] = []
    fold = memory.build_memory

    def counted(events):
        seen.append(1)
        return fold(events)

    monkeypatch.setattr(memory, "build_memory", counted)
    return seen


def test_each_manual_step_folds_the_task_once(workspace, tmp_path, folds):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    metrics = {"output_throughput": 100.0, "median_ttft_ms": 100.0, "token_match": 1.0,
               "failed": 0.0}
    done = [
        ("start", lambda: start_block(workspace, "t1", "manual try", {})),
        ("run", lambda: run_command(workspace, "t1", [sys.executable, "-c", "print(1)"],
                                    tee=False)),
        *[("measure", lambda: record_measurement(workspace, "t1", metrics))] * 3,
        ("verify", lambda: verify_block(workspace, "t1")),
        ("handoff", lambda: handoff_block(workspace, "t1", state_reached="baseline")),
    ]
    for name, step in done:
        before = len(folds)
        step()
        assert len(folds) - before <= 1, f"{name} folded the task {len(folds) - before} times"
    mem = memory.task_memory(workspace.ledger, "t1")
    b = mem.execution_record[0]
    assert (b.status, len(b.tool_calls), len(b.measurements)) == ("handed-off", 1, 3)
    assert b.verification is not None


def test_each_loop_step_folds_the_task_once(workspace, tmp_path, folds, monkeypatch):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    at_save: list[int] = []  # the fold count when each step's save returned
    save = steps.Stepper.save

    def counted_save(self, *a, **kw):
        save(self, *a, **kw)
        at_save.append(len(folds))

    monkeypatch.setattr(steps.Stepper, "save", counted_save)
    start = len(folds)
    result = run_task(workspace, "t1")
    assert (result.status, result.exit_state, result.blocks) == ("exited", "delivered", 4)
    assert len(at_save) >= 14  # 4 blocks of start, measure, verify, handoff; the exit
    # Each step (its read of Task Memory and its save) folds once; the last read finds the
    # task exited and saves nothing.
    per_step = [b - a for a, b in zip([start, *at_save], at_save, strict=False)]
    assert max(per_step) <= 1, per_step
    assert len(folds) - at_save[-1] <= 1


def test_a_step_from_a_stale_memory_still_conflicts(workspace, tmp_path, folds):
    """The writer trusts the caller's memory only at the version it was read: a writer that
    moved the stream in between makes the save fail, as before."""
    from infer_forge.harness.record import append_to_task
    from infer_forge.ledger import events as E

    define_task(workspace, make_task_dir(tmp_path / "specs"))
    mem, version = memory.read_memory(workspace.ledger, "t1")
    start_block(workspace, "t1", "someone else", {})  # the stream moves
    ev = E.LoopBlockStarted(index=1, sub_goal="late", task_id="t1", block_id="b1")
    with pytest.raises(ConflictError):
        append_to_task(workspace, "t1", [ev], memory=mem, expected_version=version)
    assert workspace.ledger.version(task_stream("t1")) == version + 1
    # A caller that expects no version (a long `forge run`) has the moved stream read again
    # and checked against what it holds now: here, the block opened meanwhile.
    tool = E.ToolInvoked(tool="x", argv=["x"], task_id="t1", block_id="b1")
    append_to_task(workspace, "t1", [tool], memory=mem, version=version)
    assert workspace.ledger.version(task_stream("t1")) == version + 2
