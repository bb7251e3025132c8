"""Steady state before measuring, trends flagged, more runs instead of a shrug (issue 31, items
1 and 4): warm-up windows until two agree (warmup.py), a monotone series failing the stability
gate (gates.py `trend`), and extra runs while one could decide a gate (more_runs.py) — on the
real embedded engine (the generated tiny Llama) and the real command evaluator."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from infer_forge.harness.loop import gates
from infer_forge.harness.loop.command_evaluator import CommandEvaluator
from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
from infer_forge.harness.loop.evaluator_protocol import Baseline, BaselineRun, EvalContext
from infer_forge.harness.loop.more_runs import more_runs_reason
from infer_forge.harness.loop.warmup import warm_up
from infer_forge.harness.models.weights import pull
from infer_forge.ledger.specs import Contract, load_point, load_profile, load_task
from infer_forge.ledger.task import Run
from infer_forge.ledger.workspace import init_workspace

from tests.conftest import REPO

EX = REPO / "examples"
ISSUE = [52.7, 79.6, 108.0]  # issue 31: one block's runs, climbing


def contract(*gates_: dict, more_runs: int = 0) -> Contract:
    return Contract.model_validate({"gates": list(gates_), "more_runs": more_runs})


STABLE = {"name": "stability", "repeats": 3, "max_cv": 0.15, "max_failed_requests": 0}
THROUGHPUT = {"name": "throughput", "metric": "output_throughput", "vs_baseline": "ratio",
              "at_least": 1.05}


def runs(*xs: float, failed: float = 0.0) -> list[Run]:
    return [Run({"output_throughput": x, "failed": failed}) for x in xs]


# --- the stability gate sees a trend ------------------------------------------------------


def test_a_monotone_series_fails_stability_with_the_numbers():
    c = contract(THROUGHPUT, {**STABLE, "max_cv": 0.5})  # the CV (0.34) alone would pass
    g = gates.judge_gate(c.gates[1], runs(*ISSUE), None, contract=c,
                         default_metric="output_throughput")
    assert g.verdict == "fail"
    assert g.reason == "output_throughput rose run after run (52.7 → 79.6 → 108): not steady"
    # Falling is a trend too; over the CV bound the reason says both.
    c2 = contract(THROUGHPUT, STABLE)
    g2 = gates.judge_gate(c2.gates[1], runs(108, 79.6, 52.7), None, contract=c2,
                          default_metric="output_throughput")
    assert g2.verdict == "fail" and g2.reason.startswith("output_throughput CV 0.34")
    assert g2.reason.endswith("; output_throughput fell run after run (108 → 79.6 → 52.7): "
                              "not steady")


@pytest.mark.parametrize("xs", [[100, 104, 109], [100, 120, 110], [100, 100, 130],
                                [100, 130]])
def test_no_trend_inside_the_band_or_not_strictly_monotone_or_too_short(xs):
    assert gates.trend("output_throughput", xs, 0.15) is None
    c = contract(THROUGHPUT, {**STABLE, "repeats": 2, "max_cv": 0.5})
    assert gates.judge_gate(c.gates[1], runs(*xs), None, contract=c,
                            default_metric="output_throughput").verdict == "pass"


def test_trend_band_defaults_to_ten_percent_without_max_cv():
    assert gates.trend("m", [100, 105, 109], None) is None
    assert gates.trend("m", [100, 105, 111], None) == "m rose run after run (100 → 105 → 111): " \
        "not steady"


# --- warm-up windows ----------------------------------------------------------------------


class Clock:
    """A clock that moves `step` seconds per reading: warm_up's cap without waiting."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def scripted(xs: list[float]):
    it = iter(xs)
    return lambda: next(it)


def test_warm_up_stops_when_two_windows_agree():
    w = warm_up(scripted([40.0, 70.0, 95.0, 100.0, 999.0]), clock=Clock(1.0))
    assert w.record() == {"windows": 4, "seconds": 4.0, "steady": True,
                          "throughputs": [40.0, 70.0, 95.0, 100.0]}


def test_warm_up_cap_is_recorded_not_raised():
    climbing = [float(10 * 2 ** i) for i in range(10)]
    w = warm_up(scripted(climbing), max_windows=3, clock=Clock(1.0))
    assert (w.steady, len(w.throughputs)) == (False, 3)
    assert "not steady (cap reached) after 3 warm-up windows" in w.describe()
    # The seconds cap: past max_s after the second window, stop (never fewer than two).
    w = warm_up(scripted(climbing), max_s=0.5, clock=Clock(1.0))
    assert (w.steady, w.throughputs) == (False, [10.0, 20.0])
    # A window with no throughput (every request failed) never counts as agreeing.
    w = warm_up(scripted([0.0, 0.0, 0.0]), max_windows=3, clock=Clock(1.0))
    assert not w.steady


# --- why one more run ---------------------------------------------------------------------


def test_more_runs_reason_unstable_baseline_trend_inconclusive_candidate():
    c = contract(THROUGHPUT, STABLE, more_runs=4)
    # The baseline: unstable (issue 31's CV) -> one more; its relative gate is not judged.
    why = gates.more_runs_reason(c, runs(60, 100, 55), None)
    assert why is not None and why.startswith("stability fail: output_throughput CV 0.3")
    assert gates.more_runs_reason(c, runs(*ISSUE), None) is not None
    assert gates.more_runs_reason(c, runs(100, 101, 99), None) is None
    # Failed requests are not noise: more runs would not undo them.
    assert gates.more_runs_reason(c, runs(60, 100, 55, failed=2), None) is None
    # A candidate whose ratio straddles 1.05 against the baseline's runs: inconclusive.
    base = runs(100, 101, 99)
    why = gates.more_runs_reason(c, runs(98, 112, 104), base)
    assert why is not None and why.startswith("throughput inconclusive: output_throughput ratio")
    assert gates.more_runs_reason(c, runs(120, 121, 119), base) is None  # clear pass
    assert gates.more_runs_reason(c, runs(80, 81, 79), base) is None  # clear fail


# --- the real evaluators ------------------------------------------------------------------

SCRIPT = """import json, os, sys
r = int(os.environ["FORGE_REPEAT"])
print(json.dumps({"output_throughput": [52.7, 79.6, 108.0, 110.0, 109.0, 111.0][r]}))
"""


@pytest.mark.parametrize("more", [0, 2])
def test_command_evaluator_takes_extra_runs_while_trending(tmp_path, more):
    """A real evaluator process whose runs climb: with `more_runs` it runs again, saying why,
    until the series settles; with 0 it runs exactly the repeats, as before."""
    (tmp_path / "ev.py").write_text(SCRIPT)
    said: list[str] = []
    c = contract(THROUGHPUT, STABLE, more_runs=more)
    ev = CommandEvaluator([sys.executable, "ev.py"], cwd=tmp_path, contract=c)
    res = ev.evaluate({}, repeats=3, ctx=EvalContext(None, "t", "b1", None, None,
                                                     progress=said.append))
    tps = [r.metrics["output_throughput"] for r in res]
    if more == 0:
        assert tps == ISSUE and said == [] and not any("extra_run" in r.meta for r in res)
        return
    # 52.7 → 79.6 → 108 → 110: still a trend (over 15 %); → 109: not monotone, CV 0.27 still
    # over 0.15 -> at the cap of 2.
    assert tps == [*ISSUE, 110.0, 109.0]
    assert [r.meta.get("extra_run", False) for r in res] == [False] * 3 + [True] * 2
    assert said[0] == ("extra run 1/2: stability fail: output_throughput CV 0.3452 > max 0.15 "
                       "over 3 runs; output_throughput rose run after run (52.7 → 79.6 → 108): "
                       "not steady")
    assert said[1].startswith("extra run 2/2: stability fail: output_throughput CV")


@pytest.fixture(scope="module")
def tiny_engine_runs(tmp_path_factory):
    """One real evaluation on the embedded engine (tiny Llama, small traffic): 2 repeats and
    up to 1 more under a stability gate of max_cv 0 (two timed runs never measure the same
    throughput to the bit, so the block is always "unstable" and the extra run is taken)."""
    root = tmp_path_factory.mktemp("steady")
    ws, _ = init_workspace(root / "home")
    try:
        pull(ws, "tiny-llama")
        task = load_task(EX / "tasks/demo-tiny-cpu.yaml")
        task = task.model_copy(update={"contract": contract(
            {"name": "stability", "repeats": 2, "max_cv": 0.0, "max_failed_requests": 0,
             "metric": "output_throughput"}, more_runs=1)})
        point = load_point(EX / "points/demo-tiny-cpu.yaml")
        traffic = point.scenario.traffic.model_copy(update={
            "num_prompts": 4, "input_len": 16, "output_len": 8, "concurrency": 2})
        point = point.model_copy(update={
            "scenario": point.scenario.model_copy(update={"traffic": traffic})})
        profile = load_profile(EX / "profiles/demo-tiny-cpu.yaml")
        said: list[str] = []
        ctx = EvalContext(ws, "t", "b1", point, profile, progress=said.append)
        res = EngineEvaluator(ws, task, base_dir=Path(EX / "tasks")).evaluate(
            {}, repeats=2, ctx=ctx)
        yield res, said
    finally:
        ws.close()


def test_engine_warm_up_is_recorded_on_every_run(tiny_engine_runs):
    res, said = tiny_engine_runs
    assert [r.success for r in res] == [True] * 3, [r.error for r in res]
    warm = res[0].meta["warmup"]
    assert all(r.meta["warmup"] == warm for r in res)
    assert set(warm) == {"windows", "seconds", "steady", "throughputs"}
    assert 2 <= warm["windows"] == len(warm["throughputs"])
    assert all(x > 0 for x in warm["throughputs"])
    # Steady means the last two windows agree; the cap is recorded as not steady.
    a, b = warm["throughputs"][-2:]
    assert warm["steady"] == (abs(b / a - 1) <= 0.10)
    assert any(s.startswith(("steady after", "not steady (cap reached)")) for s in said)


def test_engine_takes_the_extra_run_on_the_same_deployment_and_says_why(tiny_engine_runs):
    res, said = tiny_engine_runs
    assert [r.meta.get("extra_run", False) for r in res] == [False, False, True]
    assert [r.meta["repeat"] for r in res] == [0, 1, 2]
    assert len({r.meta["server_info_digest"] for r in res}) == 1  # one launch
    (extra,) = [s for s in said if s.startswith("extra run")]
    assert extra.startswith("extra run 1/1: stability fail: output_throughput CV ")


def test_more_runs_reason_reads_the_baseline_a_candidate_is_handed():
    """The evaluators' adapter: RunResults so far and the `Baseline` of EvalContext."""
    from infer_forge.harness.loop.evaluator_protocol import RunResult

    c = contract(THROUGHPUT, STABLE, more_runs=2)
    base = Baseline("b1", tuple(BaselineRun({"output_throughput": x}, True, {}, None)
                                for x in (100, 101, 99)))
    cand = [RunResult({"output_throughput": x}) for x in (98, 112, 104)]
    why = more_runs_reason(c, cand, base)
    assert why is not None and why.startswith("throughput inconclusive")
    assert more_runs_reason(None, cand, base) is None


def test_more_runs_is_left_out_of_the_stored_shape_at_zero_and_the_demo_uses_it():
    """Old contracts keep their hash (OMIT_WHEN); the demo's contract asks for 4 more runs."""
    c = contract(THROUGHPUT, STABLE)
    assert "more_runs" not in c.model_dump() and c.more_runs == 0
    assert contract(THROUGHPUT, STABLE, more_runs=4).model_dump()["more_runs"] == 4
    with pytest.raises(ValueError, match="more_runs"):
        contract(THROUGHPUT, STABLE, more_runs=-1)
    assert load_task(EX / "tasks/demo-tiny-cpu.yaml").contract.more_runs == 4


def test_more_runs_are_asked_of_the_runs_the_gates_would_judge():
    """Under a contract's host limits a contaminated run is left out of the judgement, so it
    neither asks for more runs nor hides that the clean ones are steady; an evaluation's
    `RunResult`s carry it as `meta.contaminated`."""
    from infer_forge.harness.loop.evaluator_protocol import RunResult

    busy = "host load 5.1 per 2 cores above 1.5 per core"
    # The busy run last: a steady tail (gates.settle) cannot leave it out, the host limits can.
    rs = [*runs(100, 99, 101),
          Run({"output_throughput": 220.0, "failed": 0.0}, contaminated=(busy,))]
    plain = contract(THROUGHPUT, STABLE, more_runs=2)
    assert gates.more_runs_reason(plain, rs, None) is not None  # CV with the busy run
    limited = Contract.model_validate({**plain.model_dump(mode="json"), "host": {}})
    assert gates.more_runs_reason(limited, rs, None) is None
    results = [RunResult(dict(r.metrics), meta={"contaminated": list(r.contaminated)})
               for r in rs]
    assert more_runs_reason(limited, results, None) is None
    assert more_runs_reason(plain, results, None) is not None


# --- the steady tail ------------------------------------------------------------------------


def _judge_baseline(c: Contract, rs: list[Run]):
    v = gates.judge(c, rs, None, skip_relative=True)
    (stab,) = [g for g in v.gates if g.kind == "stability"]
    return v, stab


def test_a_block_whose_first_runs_climbed_is_judged_on_its_steady_tail():
    """With `more_runs`, the runs taken until the series settled are judged on the tail that
    is steady; the reason names what was left out and why, and no more runs are asked."""
    c = contract(THROUGHPUT, STABLE, more_runs=4)
    rs = runs(*ISSUE, 110, 109)
    v, stab = _judge_baseline(c, rs)
    # The shortest prefix whose removal leaves a steady tail: 79.6 is already within 15 %.
    assert v.verdict == "pass" and stab.n == 4 and stab.samples == [79.6, 108.0, 110.0, 109.0]
    assert stab.reason.endswith(
        "; first 1 of 5 runs left out as not yet steady (all 5: output_throughput CV 0.2758 > "
        "max 0.15 over 5 runs)")
    assert gates.more_runs_reason(c, rs, None) is None
    # Without more_runs every run is judged, as before.
    v0, stab0 = _judge_baseline(contract(THROUGHPUT, STABLE), rs)
    assert v0.verdict == "fail" and stab0.n == 5 and "left out" not in stab0.reason


def test_the_steady_tail_is_never_shorter_than_the_repeats_nor_hides_a_failure():
    c = contract(THROUGHPUT, STABLE, more_runs=4)
    # No tail of 3 is steady: every run judged, stability fails on all of them.
    v, stab = _judge_baseline(c, runs(60, 100, 55, 101, 58))
    assert v.verdict == "fail" and stab.n == 5 and "left out" not in stab.reason
    # Exactly the repeats: nothing to leave out.
    v, stab = _judge_baseline(c, runs(*ISSUE))
    assert v.verdict == "fail" and stab.n == 3
    # A run with failed requests is not noise: the block is judged whole and fails on it.
    rs = [Run({"output_throughput": 52.7, "failed": 2.0}), *runs(108, 110, 109)]
    v, stab = _judge_baseline(c, rs)
    assert v.verdict == "fail" and stab.reason.startswith("a run had 2 failed requests")


def test_a_candidate_is_compared_with_the_baselines_steady_tail():
    c = contract(THROUGHPUT, STABLE, more_runs=4)
    base = runs(60, 100, 101, 99)
    v = gates.judge(c, runs(120, 121, 119), base)
    (tp,) = [g for g in v.gates if g.name == "throughput"]
    assert v.verdict == "pass" and tp.baseline_median == 100.0 and tp.ratio == 1.2
    assert tp.reason.endswith("; baseline: first 1 of 4 runs left out as not yet steady "
                              "(all 4: output_throughput CV 0.2224 > max 0.15 over 4 runs)")


def test_task_memory_best_so_far_is_what_the_gates_judged():
    """Best-so-far reads the primary metric's judged samples: a contaminated run the host
    limits left out (or an unsteady first run) does not make a block "best"."""
    from infer_forge.ledger import events as E
    from infer_forge.projections.memory import build_memory

    c = contract(THROUGHPUT, STABLE, more_runs=2)
    limited = Contract.model_validate({**c.model_dump(mode="json"), "host": {}})
    busy = "host load 5.1 per 2 cores above 1.5 per core"
    base = runs(100, 101, 99)
    cand = [Run({"output_throughput": 400.0, "failed": 0.0}, contaminated=(busy,)),
            Run({"output_throughput": 500.0, "failed": 0.0}, contaminated=(busy,)),
            *runs(102, 103, 101)]
    t = {"task_id": "t"}
    definition = {"type": "deployment-tuning", "goal": "g",
                  "contract": limited.model_dump(mode="json")}
    evs = [E.TaskDefined(title="t", task_type="deployment-tuning", goal="g",
                         definition=definition, definition_hash="sha256:d", **t)]
    for bid, cand_, rs, base_rs in (("b1", {}, base, None), ("b2", {"a": 1}, cand, base)):
        b = {"block_id": bid, **t}
        evs.append(E.LoopBlockStarted(index=int(bid[1:]), sub_goal="s", candidate=cand_, **b))
        evs += [E.MeasurementRecorded(run_id=f"{bid}-{k}", source="x", metrics=dict(r.metrics),
                                      meta={"contaminated": list(r.contaminated)}, **b)
                for k, r in enumerate(rs)]
        v = gates.judge(limited, rs, base_rs, skip_relative=base_rs is None)
        evs.append(E.VerificationRecorded(contract_hash="c", passed=v.passed,
                                          verdict=v.verdict, gates=v.gates, candidate=cand_,
                                          **b))
    mem = build_memory(evs)
    assert mem.best_so_far["block_id"] == "b2" and mem.best_so_far["median"] == 102.0
    assert mem.baseline["median"] == 100.0  # all runs clean: as before


def test_an_evaluators_printed_meta_cannot_replace_forges_own(tmp_path):
    """The command's JSON line may add meta, not overwrite forge's keys: a named digest
    would otherwise bring another artifact into the task's scope (artifact_read)."""
    forged = "sha256:" + "0" * 64
    (tmp_path / "ev.py").write_text(
        "import json\nprint(json.dumps({'output_throughput': 1.0, 'meta': "
        f"{{'stdout_digest': '{forged}', 'note': 'mine'}}}}))\n")
    ws, _ = init_workspace(tmp_path / "home")
    try:
        ev = CommandEvaluator([sys.executable, "ev.py"], cwd=tmp_path)
        (res,) = ev.evaluate({}, repeats=1, ctx=EvalContext(ws, "t", "b1", None, None))
        assert res.success and res.meta["note"] == "mine"
        assert res.meta["stdout_digest"] != forged and res.artifact_digest != forged
        assert ws.artifacts.get(res.meta["stdout_digest"]).startswith(b"{")
    finally:
        ws.close()
