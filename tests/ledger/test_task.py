"""The task aggregate's rules (`Task.check`), pure: events checked against a folded task raise
the ledger's TaskRuleError, one line naming the task, block and event."""

from __future__ import annotations

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import LedgerError
from infer_forge.ledger.task import Task, TaskRuleError, fold

C = {"task_id": "t1"}


def _defined() -> list[E.Event]:
    return [E.TaskDefined(title="t", task_type="x", goal="g", definition={},
                          definition_hash="h", **C)]


def _open_b1() -> Task:
    return fold([*_defined(), E.LoopBlockStarted(index=1, sub_goal="s", block_id="b1", **C)])


def _meas(**kw) -> E.MeasurementRecorded:
    return E.MeasurementRecorded(run_id="r", source="x", metrics={}, **{**C, **kw})


def test_a_rule_error_is_a_ledger_error():
    assert issubclass(TaskRuleError, LedgerError)


def test_a_task_is_defined_first_and_once():
    with pytest.raises(TaskRuleError, match=r"unknown task 't1'"):
        Task().check("t1", [_meas()])
    Task().check("t1", [*_defined(), _meas()])
    with pytest.raises(TaskRuleError, match="already defined"):
        fold(_defined()).check("t1", _defined())


def test_every_event_names_its_task():
    with pytest.raises(TaskRuleError, match="names task 't2'"):
        _open_b1().check("t1", [_meas(task_id="t2", block_id="b1")])


def test_one_block_open_at_a_time_and_events_go_into_it():
    task = _open_b1()
    start2 = E.LoopBlockStarted(index=2, sub_goal="s", block_id="b2", **C)
    with pytest.raises(TaskRuleError, match="task t1: LoopBlockStarted: block b1 is still open"):
        task.check("t1", [start2])
    task.check("t1", [E.LoopBlockHandedOff(block_id="b1", **C), start2, _meas(block_id="b2")])
    with pytest.raises(TaskRuleError, match="block b1 is handed off; the open block is b2"):
        task.check("t1", [E.LoopBlockHandedOff(block_id="b1", **C), start2,
                          _meas(block_id="b1")])
    with pytest.raises(TaskRuleError, match="the task has no block b9; the open block is b1"):
        task.check("t1", [_meas(block_id="b9")])
    with pytest.raises(TaskRuleError, match="VerificationRecorded belongs in a block"):
        task.check("t1", [E.VerificationRecorded(contract_hash="c", passed=True,
                                                 verdict="pass", **C)])
    # A measurement, tool call or invalidation without a block is task-level.
    task.check("t1", [_meas(), E.ToolInvoked(tool="x", argv=[], **C)])
    # After the handoff, nothing goes into a block until one starts.
    closed = fold([E.LoopBlockHandedOff(block_id="b1", **C)], _open_b1())
    assert closed.open_block is None
    with pytest.raises(TaskRuleError, match="no block is open"):
        closed.check("t1", [E.LoopBlockHandedOff(block_id="b1", **C)])


def test_decisions_name_a_block_the_task_has():
    task = _open_b1()
    task.check("t1", [E.DirectionRejected(reason="r", block_id="b1", **C)])
    with pytest.raises(TaskRuleError, match="DeliverableAccepted: the task has no block b7"):
        task.check("t1", [E.DeliverableAccepted(block_id="b7", **C)])


def test_nothing_after_an_exit_but_a_reopen_which_needs_one():
    task = _open_b1()
    exit_ = E.TaskExited(state="aborted-by-human", reason="r", **C)
    with pytest.raises(TaskRuleError, match=r"has exited \(earlier in this save\)"):
        task.check("t1", [exit_, _meas()])
    task.check("t1", [exit_, E.TaskReopened(reason="back", **C), _meas()])
    with pytest.raises(TaskRuleError, match="the task has not exited"):
        task.check("t1", [E.TaskReopened(reason="back", **C)])
    exited = fold([exit_], task)
    with pytest.raises(TaskRuleError, match=r"has exited \(aborted-by-human\).*forge task reopen"):
        exited.check("t1", [_meas()])
