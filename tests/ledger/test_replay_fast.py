"""Replay's fast path (payload dicts checked field by field, folded without event objects)
gives exactly the task of folding fully validated events (the whole aggregate: Task
Memory's records too, not only replay's view), and fails as loudly: unknown
types, corrupt JSON, newer schema versions and mistyped fields raise the codec's one-line
errors naming stream and version."""

from __future__ import annotations

from uuid import uuid4

import orjson
import pytest
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import CorruptEventError, UnknownEventError
from infer_forge.ledger.payloads import GateResult
from infer_forge.ledger.replay import replay_rows, replay_task
from infer_forge.ledger.state import TaskState, fingerprint, view
from infer_forge.ledger.store import Ledger
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.task import Task, apply, apply_payload
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.memory import memory_of

from tests.conftest import insert_raw_event

AGENT = E.Actor.agent("sweep-executor", "tiny-llama")
HUMAN = E.Actor.human("ana")
CAND = {"engine.continuous_batching": True, "engine.max_batch": 64}


@pytest.fixture
def home(forge_home):
    ws, _ = init_workspace(forge_home)
    ws.close()
    return forge_home


def _history(task: str) -> list[list[E.Event]]:
    """A task with every event kind the fold reads, three blocks, and events it ignores."""
    m = [E.MeasurementRecorded(task_id=task, block_id="b1", actor=AGENT, run_id=f"r{i}",
                               source="forge-bench", candidate=CAND, repeat=i,
                               input_digests={"point": "sha256:" + "1" * 64},
                               metrics={"output_throughput": 5000.5 + i, "ttft_ms": 800.0})
         for i in range(4)]
    return [
        [E.TaskDefined(task_id=task, title="tune", task_type="deployment-tuning", goal="faster",
                       definition={"goal": "faster", "budget": {"blocks": 5}},
                       definition_hash="sha256:" + "0" * 64, point_hash="sha256:" + "2" * 64,
                       actor=HUMAN)],
        [E.LoopBlockStarted(task_id=task, block_id="b1", index=1, sub_goal="cb on",
                            routing={"model_tier": "small", "executor": "sweep"},
                            candidate=CAND, actor=AGENT)],
        [E.ToolInvoked(task_id=task, block_id="b1", tool="forge-bench", argv=["bench", "-n", "3"],
                       exit_code=0, duration_s=12.5, actor=AGENT),
         E.EngineLaunched(task_id=task, block_id="b1", engine="transformers", command=["serve"],
                          url="http://127.0.0.1:8000", pid=1234),
         *m,
         E.MeasurementInvalidated(task_id=task, block_id="b1", measurement_event_id=m[1].event_id,
                                  reason="thermal throttling", actor=HUMAN),
         E.VerificationRecorded(task_id=task, block_id="b1", contract_hash="c", passed=True,
                                verdict="pass", candidate=CAND,
                                gates=[GateResult.judged("pass", name="throughput",
                                                         kind="relative", median=1.07)]),
         E.DeliverableAccepted(task_id=task, block_id="b1", candidate=CAND, summary="+7%"),
         E.LoopBlockHandedOff(task_id=task, block_id="b1", outcome="progress",
                              state_reached="cb on", findings=["cb helps"],
                              next_sub_goal="attn")],
        [E.LoopBlockStarted(task_id=task, index=2, sub_goal="attn sdpa")],  # block id b2
        [E.ToolInvoked(task_id=task, block_id="b2", tool="bench", argv=[]),
         E.VerificationRecorded(task_id=task, block_id="b2", contract_hash="c", passed=False,
                                verdict="fail"),
         E.DirectionRejected(task_id=task, block_id="b2", candidate={"attn": "sdpa"},
                             reason="TTFT over SLO"),
         E.LoopBlockHandedOff(task_id=task, block_id="b2", outcome="no-progress")],
        [E.TaskExited(task_id=task, state="failed-no-progress", reason="budget")],
        [E.TaskReopened(task_id=task, reason="one more idea", actor=HUMAN)],
        [E.LoopBlockStarted(task_id=task, block_id="b3", index=3, sub_goal="chunked prefill"),
         E.MeasurementRecorded(task_id=task, block_id="b3", run_id="x", source="manual",
                               metrics={}),
         E.MeasurementRecorded(task_id=task, block_id="nope", run_id="y", source="manual",
                               metrics={"a": 1.0}),
         E.VerificationRecorded(task_id=task, block_id="b3", contract_hash="c", passed=False,
                                verdict="inconclusive"),
         E.LoopBlockHandedOff(task_id=task, block_id="b3", outcome="delivered"),
         E.TaskExited(task_id=task, state="delivered", reason="done", evidence=["e1"])],
    ]


def _full_task(ledger: Ledger, stream: str, until: int | None = None) -> Task:
    """The reference: every event validated into its object, folded with `apply`."""
    task = Task()
    rows = ledger.stream_rows(stream, stop=until)
    for _pos, version, topic, raw in rows:
        apply(task, codec.decode(stream, version, topic, raw))
    task.last_position = rows[-1][0]
    return task


def _full_fold(ledger: Ledger, stream: str, until: int | None = None) -> TaskState:
    return view(_full_task(ledger, stream, until))




def test_fast_replay_equals_full_validation_at_every_position(home):
    with Ledger.open(home) as ledger:
        for batch in _history("t1"):
            ledger.append(task_stream("t1"), batch)
        rows = ledger.stream_rows("task:t1")
        # Every stored row is one the fast path takes (else this test would prove nothing).
        assert all(codec.load_current(topic, raw) is not None for _p, _v, topic, raw in rows)
        full = replay_task(ledger, "t1")
        assert fingerprint(full) == fingerprint(_full_fold(ledger, "task:t1"))
        assert full.model_dump() == _full_fold(ledger, "task:t1").model_dump()
        by_payload = Task()  # the public dict fold, row by row
        for _p, _v, topic, raw in rows:
            apply_payload(by_payload, topic, codec.load_current(topic, raw))
        by_payload.last_position = rows[-1][0]
        assert fingerprint(view(by_payload)) == fingerprint(full)
        # The whole aggregate, and the Task Memory computed from it, alike either way.
        reference = _full_task(ledger, "task:t1")
        fast = replay_rows("task:t1", rows, Task())
        assert fast.model_dump() == by_payload.model_dump() == reference.model_dump()
        assert memory_of(fast).model_dump() == memory_of(reference).model_dump()
        assert memory_of(fast).paused_s == memory_of(reference).paused_s > 0
        assert fast.blocks[0].measurements[1]["invalidated"] == "thermal throttling"
        assert fast.blocks[0].verification["gates"] == reference.blocks[0].verification["gates"]
        # Folded without records (replay's default), the view is the same.
        lean = replay_rows("task:t1", rows)
        assert not lean.records and not lean.blocks[0].measurements
        assert view(lean).model_dump() == view(reference).model_dump()
        for pos, *_ in rows:
            assert fingerprint(replay_task(ledger, "t1", until=pos)) == fingerprint(
                _full_fold(ledger, "task:t1", pos))
    assert full.status == "exited" and full.exit_state == "delivered"
    assert full.exits == [
        {"state": "failed-no-progress", "reason": "budget", "reopened": "one more idea"},
        {"state": "delivered", "reason": "done", "reopened": None}]
    assert [b.block_id for b in full.blocks] == ["b1", "b2", "b3"]
    assert full.blocks[0].tool_calls == 1 and full.blocks[0].measurements == 4
    assert full.measurements == 6 and len(full.invalidated) == 1
    assert [b.verifications for b in full.blocks] == [["pass"], ["fail"], ["inconclusive"]]
    assert full.blocks[1].handoff["outcome"] == "no-progress"
    assert full.accepted[0]["summary"] == "+7%" and full.rejected[0]["reason"] == "TTFT over SLO"
    assert full.version == len(rows)


def _stored(event: E.Event, **change) -> dict:
    return {**orjson.loads(codec.encode("s", 1, event, None).state), **change}


def test_lax_but_valid_payloads_take_full_validation_and_give_the_same_state(home):
    """Forms validation accepts but the fast check leaves to it (an int for a float, an
    uppercase UUID) are decoded in full; defaulted fields left out and another key order stay
    on the fast path. Either way, the same state as the full fold."""
    m = E.MeasurementRecorded(task_id="t1", block_id="b1", run_id="r", source="s",
                              metrics={"a": 1.0})
    lax = [
        _stored(E.TaskDefined(task_id="t1", title="t", task_type="x", goal="g", definition={},
                              definition_hash="h")),
        {k: v for k, v in _stored(E.LoopBlockStarted(task_id="t1", block_id="b1", index=1,
                                                     sub_goal="s")).items()
         if k not in ("routing", "candidate", "input_digests")},
        _stored(m, metrics={"a": 1}),
        _stored(E.MeasurementInvalidated(task_id="t1", measurement_event_id=m.event_id,
                                         reason="r"),
                measurement_event_id=str(m.event_id).upper()),
        dict(reversed(_stored(E.VerificationRecorded(task_id="t1", block_id="b1",
                                                     contract_hash="c", passed=True,
                                                     verdict="pass")).items())),
    ]
    for i, payload in enumerate(lax, 1):
        topic = ("TaskDefined", "LoopBlockStarted", "MeasurementRecorded",
                 "MeasurementInvalidated", "VerificationRecorded")[i - 1]
        insert_raw_event(home, "task:t1", i, topic, orjson.dumps(payload))
    with Ledger.open(home) as ledger:
        rows = ledger.stream_rows("task:t1")
        taken = [codec.load_current(t, raw) is not None for _p, _v, t, raw in rows]
        assert taken == [True, True, False, False, True]
        state = replay_task(ledger, "t1")
        assert fingerprint(state) == fingerprint(_full_fold(ledger, "task:t1"))
    assert state.invalidated == [str(m.event_id)] and state.blocks[0].verifications == ["pass"]


GOOD = E.MeasurementRecorded(task_id="t1", block_id="b0", run_id="r", source="s",
                             metrics={"output_throughput": 1.0})


@pytest.mark.parametrize(
    ("topic", "state", "error", "says"),
    [
        ("EngineExploded", orjson.dumps(_stored(GOOD)), UnknownEventError, "unknown event type"),
        ("MeasurementRecorded", orjson.dumps(_stored(GOOD))[:-9], CorruptEventError, "corrupt"),
        ("MeasurementRecorded", b'"just a string"', CorruptEventError, "not an object"),
        ("MeasurementRecorded", orjson.dumps(_stored(GOOD, _v=7)), UnknownEventError, "newer"),
        ("MeasurementRecorded", orjson.dumps(_stored(GOOD, block_id=5)), CorruptEventError,
         "block_id"),
        ("MeasurementRecorded", orjson.dumps(_stored(GOOD, metrics={"x": "fast"})),
         CorruptEventError, "metrics.x"),
        ("MeasurementRecorded", orjson.dumps(_stored(GOOD, actor={"kind": "robot"})),
         CorruptEventError, "actor"),
        ("MeasurementRecorded", orjson.dumps(_stored(GOOD, extra=1)), CorruptEventError,
         "extra"),
        ("VerificationRecorded", orjson.dumps(_stored(
            E.VerificationRecorded(task_id="t1", block_id="b0", contract_hash="c", passed=True,
                                   verdict="pass"), verdict="maybe")),
         CorruptEventError, "verdict"),
        ("LoopBlockStarted", orjson.dumps({k: v for k, v in _stored(
            E.LoopBlockStarted(task_id="t1", index=1, sub_goal="s")).items() if k != "index"}),
         CorruptEventError, "index"),
        ("TaskExited", orjson.dumps(_stored(E.TaskExited(task_id="t1", state="delivered",
                                                         reason="r"), reason=None)),
         CorruptEventError, "reason"),
        ("MeasurementInvalidated", orjson.dumps(_stored(
            E.MeasurementInvalidated(measurement_event_id=uuid4(), reason="r"),
            measurement_event_id="not-a-uuid")), CorruptEventError, "measurement_event_id"),
    ],
)
def test_bad_events_fail_replay_with_the_codecs_error(home, topic, state, error, says):
    with Ledger.open(home) as ledger:
        ledger.append("task:t1", [E.TaskDefined(task_id="t1", title="t", task_type="x",
                                                goal="g", definition={}, definition_hash="h"),
                                  GOOD])
    pos = insert_raw_event(home, "task:t1", 3, topic, state)
    with Ledger.open(home) as ledger:
        with pytest.raises(error) as exc:
            replay_task(ledger, "t1")
        msg = str(exc.value)
        assert "stream 'task:t1' version 3" in msg and says in msg and "\n" not in msg
        # The same error as decoding the row in full, with the global position in front.
        with pytest.raises(error) as full:
            codec.decode("task:t1", 3, topic, state)
        assert f"position {pos}: {full.value}" in msg
        assert replay_task(ledger, "t1", until=pos - 1).measurements == 1
