"""Task Memory is a pure fold of task events."""

from __future__ import annotations

from infer_forge.ledger import events as E
from infer_forge.ledger.payloads import GateResult
from infer_forge.projections.memory import build_memory

DEF = {"type": "deployment-tuning", "goal": "g", "contract": {"gates": [
    {"name": "throughput", "metric": "output_throughput", "vs_baseline": "ratio",
     "at_least": 1.05},
    {"name": "ttft", "metric": "median_ttft_ms", "at_most": 500}]}}


def _events():
    c = {"task_id": "t"}
    evs = [E.TaskDefined(title="t", task_type="deployment-tuning", goal="g", definition=DEF,
                         definition_hash="sha256:d", input_digests={"contract": "sha256:c"},
                         **c)]

    def block(i, cand, tputs, verdict, gates, decision=None, outcome="progress"):
        b = {"block_id": f"b{i}", **c}
        out = [E.LoopBlockStarted(index=i, sub_goal=f"s{i}", candidate=cand,
                                  routing={"model_tier": "none"},
                                  input_digests={"config": f"cfg{i}"}, **b)]
        out += [E.MeasurementRecorded(run_id=f"b{i}-r{k}", source="x",
                                      metrics={"output_throughput": x}, **b)
                for k, x in enumerate(tputs)]
        out.append(E.VerificationRecorded(contract_hash="sha256:c", passed=verdict == "pass",
                                          verdict=verdict, gates=gates, candidate=cand, **b))
        if decision == "reject":
            out.append(E.DirectionRejected(candidate=cand, reason="fail: ttft", **b))
        out.append(E.LoopBlockHandedOff(outcome=outcome, state_reached=f"r{i}",
                                        next_sub_goal=f"next after b{i}", **b))
        return out

    evs += block(1, {}, [100, 100, 100], "pass", [])
    evs += block(2, {"a": 1}, [120, 120, 120], "fail",
                 [GateResult.judged("fail", name="ttft", kind="absolute",
                                    metric="median_ttft_ms")], "reject", "no-progress")
    evs += block(3, {"a": 2}, [103, 103, 103], "fail",
                 [GateResult.judged("fail", name="throughput", kind="relative",
                                    metric="output_throughput")], "reject", "progress")
    evs.append(E.LoopBlockStarted(index=4, sub_goal="s4", candidate={"a": 3}, block_id="b4",
                                  input_digests={"config": "cfg4"}, **c))
    return evs


def test_memory_fields():
    mem = build_memory(_events())
    assert mem.contract_hash == "sha256:c" and mem.primary_metric == "output_throughput"
    assert mem.current_block.block_id == "b4" and mem.current_block.candidate == {"a": 3}
    assert mem.last_handoff["block_id"] == "b3"
    assert mem.baseline["median"] == 100
    # b2 was faster but broke another gate: b3 is best so far.
    assert mem.best_so_far["block_id"] == "b3" and mem.best_so_far["median"] == 103
    assert [r["block_id"] for r in mem.rejected] == ["b2", "b3"]
    assert mem.rejected[0]["reason"] == "fail: ttft"
    assert mem.tried == ["cfg1", "cfg2", "cfg3", "cfg4"]
    assert mem.no_progress_streak == 0
    assert [b.decision for b in mem.execution_record] == [None, "rejected", "rejected", None]


def test_next_block_streak_and_invalidation():
    evs = _events()[:-1]  # b3 handed off, nothing open
    mem = build_memory(evs)
    assert mem.current_block is None
    assert mem.next_block == {"index": 4, "sub_goal": "next after b3"}
    evs.append(E.LoopBlockStarted(index=4, sub_goal="s", block_id="b4", task_id="t"))
    evs.append(E.LoopBlockHandedOff(outcome="no-progress", block_id="b4", task_id="t"))
    assert build_memory(evs).no_progress_streak == 1
    bad = next(e for e in evs if isinstance(e, E.MeasurementRecorded) and e.block_id == "b3")
    evs.append(E.MeasurementInvalidated(measurement_event_id=bad.event_id, reason="noisy",
                                        task_id="t"))
    b3 = build_memory(evs).block("b3")
    assert len(b3.runs()) == 2
    evs.append(E.TaskExited(state="aborted-by-human", reason="stop", task_id="t"))
    mem = build_memory(evs)
    assert (mem.status, mem.exit_state, mem.next_block) == ("exited", "aborted-by-human", None)
    # Same events, same memory.
    assert build_memory(evs).model_dump() == mem.model_dump()
