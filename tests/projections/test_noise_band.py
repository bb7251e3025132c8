"""Noise band per deployment point (issue 15, item 6) and the sweep's halving search.

The band is learned from history written through the real writers (define_task,
start_block, record_measurement, verify_block, handoff_block on a real SQLite ledger); the
halving search runs on a synthetic space whose optimum is known, with seeded noise."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.gates import judge, runs_needed
from infer_forge.harness.loop.manual import (
    handoff_block,
    record_measurement,
    start_block,
    verify_block,
)
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.loop.search import Halving
from infer_forge.harness.testing.synthetic_search import synthetic_space
from infer_forge.ledger.specs import Contract
from infer_forge.ledger.task import Run
from infer_forge.projections.memory import task_memory
from infer_forge.projections.noise import learn, point_band, point_groups, point_tasks

from tests.conftest import REPO, run_forge

from ..harness.loop.test_loop import make_task_dir

TASK = """\
id: {task_id}
type: deployment-tuning
goal: Raise output throughput
point: ../points/{point}.yaml
scope:
  engine.attn_implementation: [sdpa, eager]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.01}}
{noise}
executor: {{kind: manual}}
"""

TPUT = "output_throughput"


def _specs(root: Path) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "examples/points/tiny-cpu.yaml", root / "points/tiny-cpu.yaml")
    shutil.copy(REPO / "examples/profiles/tiny-cpu.yaml", root / "profiles/tiny-cpu.yaml")
    # Another deployment point: the same engine under other traffic (another point hash).
    other = (REPO / "examples/points/tiny-cpu.yaml").read_text()
    other = other.replace("name: tiny-cpu", "name: tiny-cpu-busy").replace(
        "concurrency: 8", "concurrency: 16")
    (root / "points/tiny-cpu-busy.yaml").write_text(other)
    return root


def _define(ws, root: Path, task_id: str, point: str = "tiny-cpu", noise: bool = False) -> str:
    path = root / "tasks" / f"{task_id}.yaml"
    path.write_text(TASK.format(task_id=task_id, point=point,
                                noise="  noise: learned" if noise else ""))
    return define_task(ws, path)["task_id"]


def _block(ws, task_id: str, values: list[float], candidate: dict | None = None) -> dict:
    start_block(ws, task_id, "measure", candidate or {})
    for v in values:
        record_measurement(ws, task_id, {TPUT: v})
    out = verify_block(ws, task_id)
    handoff_block(ws, task_id, state_reached="measured")
    return out


def _cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.fmean(xs)


def test_band_is_learned_per_point_and_rejects_a_gain_inside_it(workspace, tmp_path):
    root = _specs(tmp_path / "specs")
    # History at the point: two blocks of repeated runs, about 8 % apart run to run.
    h1 = _define(workspace, root, "h1")
    _block(workspace, h1, [100.0, 108.0, 92.0])
    _block(workspace, h1, [130.0, 140.4, 119.6], {"engine.attn_implementation": "eager"})
    # At another point: wild runs that must not widen this point's band.
    o1 = _define(workspace, root, "o1", point="tiny-cpu-busy")
    _block(workspace, o1, [100.0, 200.0, 50.0])

    t = _define(workspace, root, "t", noise=True)
    point_hash = task_memory(workspace.ledger, t).point_hash
    assert point_hash and point_hash != task_memory(workspace.ledger, o1).point_hash
    assert point_tasks(workspace.ledger, point_hash) == ["h1", "t"]

    base = [100.0, 100.2, 99.8]
    _block(workspace, t, base)
    cand = [103.0, 103.1, 102.9]  # +3 %: a tight interval above 1.01, but inside the band
    start_block(workspace, t, "eager", {"engine.attn_implementation": "eager"})
    for v in cand:
        record_measurement(workspace, t, {TPUT: v})

    groups = point_groups(workspace.ledger, point_hash, TPUT)
    assert groups == [[100.0, 108.0, 92.0], [130.0, 140.4, 119.6], base, cand]
    band = point_band(workspace.ledger, point_hash, TPUT)
    assert band is not None and (band.groups, band.runs) == (4, 12)
    expected = math.sqrt(sum(2 * _cv(g) ** 2 for g in groups) / 8)
    assert band.cv == pytest.approx(expected, abs=1e-6) and 0.03 < band.cv < 0.06

    # The plain gate passes the +3 % gain ...
    contract = Contract.model_validate(task_memory(workspace.ledger, t).definition["contract"])
    plain = judge(contract.model_copy(update={"noise": None}),
                  [Run({TPUT: v}) for v in cand],
                  [Run({TPUT: v}) for v in base])
    assert plain.verdict == "pass"
    # ... the gate with the point's band rejects it, and quotes the band.
    out = verify_block(workspace, t)
    assert out["verdict"] == "fail"
    g = out["gates"][0]
    assert (g["verdict"], g["band"], g["band_groups"], g["band_runs"]) == \
        ("fail", band.cv, 4, 12)
    assert "inside the noise band" in g["reason"] and f"{band.cv:.2%}" in g["reason"]
    # The recorded verification carries the same numbers (stored and read back).
    mem = task_memory(workspace.ledger, t)
    stored = mem.execution_record[-1].verification
    assert stored is not None and stored["verdict"] == "fail"
    assert {k: stored["gates"][0][k] for k in ("band", "band_groups", "band_runs")} == \
        {"band": band.cv, "band_groups": 4, "band_runs": 12}
    # `forge task noise` shows the same band; an unknown task is one line naming it.
    out = run_forge("task", "noise", t, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"task_id": "t", "point_hash": point_hash, "bands": {
        TPUT: {"cv": band.cv, "groups": 4, "runs": 12}}}
    bad = run_forge("task", "noise", "nope")
    assert bad.returncode != 0 and "unknown task 'nope'" in bad.stderr \
        and len(bad.stderr.strip().splitlines()) == 1


def test_a_gain_beyond_the_band_passes_and_default_contracts_are_unchanged():
    contract = Contract.model_validate({"gates": [
        {"name": "throughput", "metric": TPUT, "vs_baseline": "ratio", "at_least": 1.01}],
        "noise": "learned"})
    band = learn(TPUT, [[100.0, 101.0, 99.0], [50.0, 50.5, 49.5]])
    assert band is not None and band.cv == pytest.approx(0.01)
    runs = [Run({TPUT: v}) for v in (103.0, 103.1, 102.9)]
    base = [Run({TPUT: v}) for v in (100.0, 100.2, 99.8)]
    g = judge(contract, runs, base, bands={TPUT: band}).gates[0]
    assert g.verdict == "pass" and g.band == pytest.approx(0.01) and "noise band" in g.reason
    # A latency gate (smaller is better) asks for a gain too: 3 % faster inside a 5 % band.
    ttft = Contract.model_validate({"gates": [
        {"name": "ttft", "metric": "median_ttft_ms", "vs_baseline": "ratio", "at_most": 0.99}],
        "noise": "learned"})
    wide = learn("median_ttft_ms", [[100.0, 105.0, 95.0]])
    assert wide is not None and wide.cv == pytest.approx(0.05)
    fast = [Run({"median_ttft_ms": v}) for v in (97.0, 97.1, 96.9)]
    slow = [Run({"median_ttft_ms": v}) for v in (100.0, 100.1, 99.9)]
    assert judge(ttft.model_copy(update={"noise": None}), fast, slow).verdict == "pass"
    g = judge(ttft, fast, slow, bands={"median_ttft_ms": wide}).gates[0]
    assert g.verdict == "fail" and "gain 3.00% inside the noise band" in g.reason
    # Without `noise: learned` the result and its stored shape are as before the band.
    plain = Contract.model_validate({"gates": contract.model_dump()["gates"]})
    assert "noise" not in plain.model_dump() and "noise" in contract.model_dump()
    p = judge(plain, runs, base, bands={TPUT: band}).gates[0]
    assert not {"band", "band_groups", "band_runs", "runs_needed"} & set(p.model_dump())
    assert "noise band" not in p.reason
    # Too little history: no band, judged as without one, and the reason says so.
    assert learn(TPUT, [[100.0, 101.0]]) is None
    g = judge(contract, runs, base, bands={}).gates[0]
    assert g.verdict == "pass" and g.band is None and "no noise band learned" in g.reason


def test_inconclusive_states_the_runs_that_would_decide():
    contract = Contract.model_validate({"gates": [
        {"name": "throughput", "metric": TPUT, "vs_baseline": "ratio", "at_least": 1.05}],
        "noise": "learned"})
    base = [Run({TPUT: v}) for v in (100.0, 104.0, 96.0, 100.0)]
    runs = [Run({TPUT: v}) for v in (106.0, 112.0, 100.0, 108.0)]
    band = learn(TPUT, [[r.metrics[TPUT] for r in base], [r.metrics[TPUT] for r in runs]])
    g = judge(contract, runs, base, bands={TPUT: band}).gates[0]
    assert g.verdict == "inconclusive" and g.ci is not None and g.ratio is not None
    assert g.runs_needed == runs_needed(4, g.ci[0], g.ci[1], g.ratio, 1.05)
    assert g.runs_needed is not None and g.runs_needed > 4
    assert f"about {g.runs_needed} runs per side would likely decide" in g.reason
    # The rule itself: the half-width over the threshold shrinks as 1/sqrt(n).
    assert runs_needed(4, 0.98, 1.10, 1.04, 1.0) == 9  # (0.06 / 0.04)^2 * 4
    assert runs_needed(4, 0.90, 1.02, 0.96, 1.0) == 9
    assert runs_needed(4, 0.9, 1.1, 1.0, 1.0) is None  # on the threshold: nothing decides
    # The same judgement without the opt-in says nothing about runs.
    plain = Contract.model_validate({"gates": contract.model_dump()["gates"]})
    p = judge(plain, runs, base).gates[0]
    assert p.verdict == "inconclusive" and p.runs_needed is None and "runs per side" not in \
        p.reason


# --- the halving search -----------------------------------------------------------------


def test_halving_finds_the_grids_best_in_under_30_percent_of_its_candidates():
    fractions = []
    for seed in range(20):
        axes, true, measure = synthetic_space(seed)
        grid = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
        grid_best = max(grid, key=true)
        res = Halving(axes, direction="at_least", band=0.02).run(measure)
        assert res.best == grid_best, f"seed {seed}"
        fractions.append(res.evaluations / len(grid))
    # Every search needed at most 30 % of the grid's 960 candidates (evaluations counted,
    # a candidate measured twice counting twice); the figure is in the CHANGELOG.
    assert len(grid) == 960 and max(fractions) <= 0.30, fractions


def test_halving_replays_from_what_was_observed_and_stops_early_with_the_band():
    axes, _true, measure = synthetic_space(3)
    h = Halving(axes, band=0.02)
    res = h.run(measure)
    # Replaying the same observations asks nothing more and names the same best.
    assert h.next_candidate(res.observed) is None and h.best(res.observed) == res.best
    # Without a band (no early stop) the same search needs more evaluations.
    _axes, _t, measure2 = synthetic_space(3)
    assert Halving(axes, band=0.0).run(measure2).evaluations > res.evaluations
    with pytest.raises(ValueError, match="eta"):
        Halving(axes, eta=1)


def test_the_sweep_executor_runs_halving_in_the_loop(workspace, tmp_path):
    path = make_task_dir(tmp_path / "specs", "th", max_blocks=12, no_progress=12,
                         when="best_in_scope",
                         executor="{kind: sweep, strategy: halving}")
    define_task(workspace, path)
    result = run_task(workspace, "th")
    mem = task_memory(workspace.ledger, "th")
    cands = [b.candidate for b in mem.execution_record]
    assert cands[0] == {}  # the baseline first
    assert all(b.sub_goal.endswith("(halving)") for b in mem.execution_record[1:])
    # The search settled on continuous batching with eager attention (the best of the
    # scope that passes), and the loop delivered it.
    assert result.exit_state == "delivered", mem.exit_reason
    assert mem.accepted[0]["candidate"] == {"engine.continuous_batching": True,
                                            "engine.attn_implementation": "eager"}
    # Each candidate measured once (the 2x2 scope leaves nothing to skip), then the search
    # stopped by itself, naming its best and its count.
    assert len({json.dumps(c, sort_keys=True) for c in cands[1:]}) == len(cands) - 1 == 4
    assert "halving done: best" in (mem.exit_reason or "") and "4 evaluations" in \
        (mem.exit_reason or "")
