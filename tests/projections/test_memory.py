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


# --- views computed after the fold, from the task aggregate ---------------------------------

PRIMARY = {"type": "deployment-tuning", "goal": "g", "contract": {"gates": [
    {"name": "throughput", "metric": "output_throughput", "vs_baseline": "ratio",
     "at_least": 1.05}]}}


def _task(*evs):
    c = {"task_id": "t"}
    return [E.TaskDefined(title="t", task_type="deployment-tuning", goal="g", definition=PRIMARY,
                          definition_hash="h", **c), *evs]


def _block(bid, cand, *tputs, ok=True):
    c = {"task_id": "t", "block_id": bid}
    ms = [E.MeasurementRecorded(run_id=f"{bid}-{i}", source="x", success=ok,
                                metrics={"output_throughput": float(x)} if ok else {}, **c)
          for i, x in enumerate(tputs)]
    return [E.LoopBlockStarted(index=int(bid[1:]), sub_goal="s", candidate=cand, **c), *ms]


def _verify(bid, verdict="pass"):
    return E.VerificationRecorded(contract_hash="c", passed=verdict == "pass", verdict=verdict,
                                  block_id=bid, task_id="t")


def _invalidate(m):
    return E.MeasurementInvalidated(measurement_event_id=m.event_id, reason="noisy",
                                    block_id=m.block_id, task_id="t")


def test_best_so_far_is_judged_on_the_runs_its_verification_saw():
    b1 = _block("b1", {}, 100, 100, 100)
    b2 = _block("b2", {"a": 1}, 110, 130, 120)
    evs = _task(*b1, _verify("b1"), *b2, _verify("b2"))
    assert build_memory(evs).best_so_far["median"] == 120
    # Invalidated after its verification: the best stays what the verification judged ...
    after = build_memory([*evs, _invalidate(b2[2])])
    assert after.best_so_far == {"block_id": "b2", "candidate": {"a": 1}, "median": 120.0,
                                 "metric": "output_throughput", "verdict": "pass"}
    # ... while the block's runs (what the gates read next) leave it out.
    assert [r.metrics["output_throughput"] for r in after.block("b2").runs()] == [110, 120]
    assert after.block("b2").measurements[1]["invalidated"] == "noisy"
    # Invalidated before it: the verification saw two runs.
    before = build_memory(_task(*b1, _verify("b1"), *b2, _invalidate(b2[2]), _verify("b2")))
    assert before.best_so_far["median"] == 115
    # A measurement recorded after the verification is not what it judged either.
    late = E.MeasurementRecorded(run_id="late", source="x", metrics={"output_throughput": 999.0},
                                 block_id="b2", task_id="t")
    assert build_memory([*evs, late]).best_so_far["median"] == 120
    # Verified again: the new verification sees the late run.
    assert build_memory([*evs, late, _verify("b2")]).best_so_far["median"] == 125


def test_a_baseline_measured_again_after_a_reopen_replaces_one_without_a_median():
    c = {"task_id": "t"}
    failed = _block("b1", {}, 1, 2, ok=False)
    evs = _task(*failed, _verify("b1", "fail"),
                E.LoopBlockHandedOff(outcome="failed", block_id="b1", **c),
                E.TaskExited(state="failed-blocked", reason="r", **c))
    mem = build_memory(evs)
    assert mem.best_so_far == {"block_id": "b1", "candidate": {}, "metric": "output_throughput",
                               "median": None, "verdict": "baseline"}
    evs += [E.TaskReopened(reason="fixed", **c), *_block("b2", {}, 90, 94), _verify("b2")]
    mem = build_memory(evs)
    assert mem.baseline == {"block_id": "b2", "metric": "output_throughput", "median": 92.0,
                            "verdict": "pass"}
    assert mem.best_so_far["block_id"] == "b2" and mem.best_so_far["median"] == 92
    assert mem.reopened_after == 1 and mem.before_reopen(mem.block("b1"))
    assert not mem.before_reopen(mem.block("b2"))


def test_next_block_streak_pause_and_model_usage_after_the_fold():
    from datetime import UTC, datetime, timedelta
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    c = {"task_id": "t"}
    evs = _task(*_block("b1", {}, 100))
    assert build_memory(evs).next_block is None  # a block runs
    evs.append(E.LoopBlockHandedOff(outcome="no-progress", next_sub_goal="n", block_id="b1", **c))
    mem = build_memory(evs)
    assert mem.next_block == {"index": 2, "sub_goal": "n"} and mem.no_progress_streak == 1
    evs.append(E.TaskExited(state="failed-no-progress", reason="r", occurred_at=t0, **c))
    assert build_memory(evs).next_block is None
    evs.append(E.TaskReopened(reason="again", occurred_at=t0 + timedelta(seconds=90.5), **c))
    mem = build_memory(evs)
    assert mem.next_block == {"index": 2, "sub_goal": None}
    assert (mem.no_progress_streak, mem.paused_s, mem.status) == (0, 90.5, "running")
    evs += [E.ModelCalled(tier="s", model="m", tokens_in=3, tokens_out=4, cost_usd=0.1, **c),
            E.ModelCalled(tier="s", model="m", tokens_in=5, tokens_out=6, cost_usd=0.2, **c)]
    mem = build_memory(evs)
    assert (mem.model_calls, mem.model_tokens_in, mem.model_tokens_out, mem.model_cost_usd) \
        == (2, 8, 10, 0.3)
    # One fold: Task Memory's blocks are the aggregate's own.
    assert mem.execution_record is mem.task.blocks
