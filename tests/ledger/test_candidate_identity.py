"""One configuration, one spelling (issue 27 item 8): a candidate's values are canonicalised
to the scope's own values before the scope check and the "already tried" check, and the
canonical candidate is what a block records."""

from __future__ import annotations

import json

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.decision import out_of_scope
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import handoff_block, start_block
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger.candidates import canonical_candidate
from infer_forge.ledger.specs import Range, scope_allows
from infer_forge.projections.memory import task_memory

from ..harness.loop.test_loop import command_executor, make_task_dir

CB = "engine.continuous_batching"
SPELLINGS = [True, 1, 1.0, "true", "True", "yes", "1"]


@pytest.mark.parametrize("value", SPELLINGS)
def test_every_spelling_of_true_is_the_scope_value(value):
    scope = {CB: [False, True]}
    assert canonical_candidate(scope, {CB: value}) == {CB: True}
    assert type(canonical_candidate(scope, {CB: value})[CB]) is bool
    assert scope_allows(scope, CB, value)


def test_numbers_and_text_take_the_scope_type_and_kinds_stay_apart():
    scope = {"engine.tp": [1, 2, 4], "engine.mem": [0.8, 0.9], "engine.attn": ["sdpa", "8"],
             "engine.chunk": Range(min=64, max=512, step=64, integer=True)}
    got = canonical_candidate(scope, {"engine.tp": "2", "engine.mem": "0.9",
                                      "engine.attn": 8, "engine.chunk": 128.0, "other": "1"})
    assert got == {"engine.tp": 2, "engine.mem": 0.9, "engine.attn": "8",
                   "engine.chunk": 128, "other": "1"}
    assert type(got["engine.tp"]) is int and type(got["engine.chunk"]) is int
    # True is no thread count, and 2.5 threads no allowed value: refused, not coerced.
    assert not scope_allows(scope, "engine.tp", True)
    assert not scope_allows(scope, "engine.tp", 2.5)
    # A bool flag's 2 or "maybe" is no spelling of a bool.
    assert not scope_allows({CB: [False, True]}, CB, 2)
    assert not scope_allows({CB: [False, True]}, CB, "maybe")


def test_out_of_scope_judges_the_canonical_spelling(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    from infer_forge.harness.task import load_task_from_ledger

    lt = load_task_from_ledger(workspace, "t1")
    assert out_of_scope(lt.task, lt.point, lt.profile, {CB: "yes"}) is None
    assert "not an allowed value" in out_of_scope(lt.task, lt.point, lt.profile, {CB: 2})


def test_manual_path_refuses_each_spelling_of_a_tried_candidate(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    start_block(workspace, "t1", "baseline")
    handoff_block(workspace, "t1", state_reached="measured")
    started = start_block(workspace, "t1", "cb on", {CB: "1"})
    # What the block records is the scope's own value, not the spelling given.
    assert started["candidate"] == {CB: True}
    assert task_memory(workspace.ledger, "t1").current_block.candidate == {CB: True}
    handoff_block(workspace, "t1", state_reached="rejected", outcome="no-progress")
    for value in SPELLINGS:
        with pytest.raises(HarnessError, match="already tried"):
            start_block(workspace, "t1", "again", {CB: value})
    # The baseline (continuous batching off) is tried too, under every spelling of false.
    for value in (False, 0, "false", "no", "0"):
        with pytest.raises(HarnessError, match="already tried"):
            start_block(workspace, "t1", "off", {CB: value})
    assert len(task_memory(workspace.ledger, "t1").execution_record) == 2


def test_loop_does_not_run_a_tried_candidate_spelled_otherwise(workspace, tmp_path,
                                                                monkeypatch):
    """A policy proposing true, then 1, "yes" and "1": only the first is measured."""
    counter = workspace.home / "scratch" / "t1" / "proposals"
    policy = tmp_path / "policy.py"
    policy.write_text(
        "import json, sys, pathlib\njson.load(sys.stdin)\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = len(p.read_text()) if p.exists() else 0\n"
        "p.write_text('x' * (n + 1))\n"
        f"v = {[True, 1, 'yes', '1']!r}[min(n, 3)]\n"
        f"print(json.dumps({{'action': 'try', 'candidate': {{{CB!r}: v}}, "
        "'model': 'test-model'}))\n")
    path = make_task_dir(tmp_path / "specs", executor=command_executor(policy), no_progress=3)
    log = workspace.home / "scratch" / "t1" / "eval.log"
    monkeypatch.setenv("EVAL_LOG", str(log))
    counter.parent.mkdir(parents=True, exist_ok=True)
    define_task(workspace, path)
    r = run_task(workspace, "t1")
    assert r.exit_state == "failed-no-progress", r.exit_reason
    mem = task_memory(workspace.ledger, "t1")
    blocks = mem.execution_record
    assert [b.candidate for b in blocks[1:]] == [{CB: True}] * (len(blocks) - 1)
    for b in blocks[2:]:
        assert "already tried in block b2" in b.handoff["findings"][0]
        assert not b.measurements
    # Only b2's repeats ran continuous batching.
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(1 for c in ran if c.get(CB)) == 3, ran
