"""`forge reproduce`: a block measured on the real embedded engine (the tiny model, the demo's
profile, small traffic) reproduces; the same block with its figures planted 5x too high does
not; points that cannot be rebuilt here are refused with one line (exit 2).

The real runs give an explicit band: on this shared 2-core machine the same block, relaunched
minutes apart, measured 0.88-1.47x its recorded throughput (10 reproductions, 2026-12-01), wider
than a CPU point's default floor; the default band's terms are tested on figures below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop import reproduce as rp
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.models.weights import pull
from infer_forge.harness.record import append_to_task
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import REPRODUCTIONS_STREAM
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.memory import task_memory

from tests.conftest import REPO, run_forge

EX = REPO / "examples"
PLANT = E.Actor.human("planter")


def write_task(d: Path, task_id: str, *, accelerator: str = "{vendor: cpu, model: x86_64}",
               model: str = "forge:tiny-llama", profile: Path = EX / "profiles/demo-tiny-cpu.yaml"
               ) -> Path:
    """A small deployment-tuning task on the embedded engine: baseline, then continuous
    batching, gates loose enough that a real run passes them."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "point.yaml").write_text(
        f"name: tiny-repro\n"
        f"model: {{name: tiny-llama, source: \"{model}\", revision: '1', modalities: [text]}}\n"
        "scenario:\n  modality: text\n"
        "  traffic: {input_len: 32, output_len: 16, range_ratio: 1.0, concurrency: 4, "
        "num_prompts: 8}\n"
        f"runtime_profile: {{service: demo-tiny-cpu, rev: 1, file: {profile}}}\n"
        f"accelerator: {accelerator}\n")
    (d / "task.yaml").write_text(
        f"id: {task_id}\ntype: deployment-tuning\ngoal: reproduce me\npoint: point.yaml\n"
        "scope:\n  engine.continuous_batching: [true]\n"
        "contract:\n  gates:\n"
        "    - {name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 0.2}\n"
        "    - {name: correctness, metric: token_match, at_least: 0.99}\n"
        "    - {name: stability, repeats: 3, max_cv: 0.9, max_failed_requests: 0}\n"
        "verification: [baseline, measure, gates, decide]\n"
        "exit: {when: all_gates_pass, max_blocks: 2, no_progress_blocks: 2}\n"
        "executor: {kind: sweep, strategy: grid, seed: 0}\n")
    return d / "task.yaml"


def plant_block(ws, task_id: str, source, factor: float) -> str:
    """A block beside `source` with its runs' figures recorded `factor` times too high (the
    one task writer, harness/record.py; the task is reopened to take it)."""
    mem = task_memory(ws.ledger, task_id)
    bid = f"b{len(mem.execution_record) + 1}"
    common = {"task_id": task_id, "block_id": bid, "actor": PLANT}
    evs: list[E.Event] = [E.TaskReopened(reason="plant a block", task_id=task_id, actor=PLANT),
                          E.LoopBlockStarted(index=len(mem.execution_record) + 1,
                                             sub_goal="planted", candidate=source.candidate,
                                             **common)]
    for i, m in enumerate(source.measurements):
        metrics = {**m["metrics"], "output_throughput": m["metrics"]["output_throughput"]
                   * factor}
        evs.append(E.MeasurementRecorded(run_id=f"{bid}-r{i + 1}", source=m["source"],
                                         metrics=metrics, candidate=source.candidate, repeat=i,
                                         meta=m["meta"], **common))
    evs.append(E.LoopBlockHandedOff(outcome="no-progress", **common))
    append_to_task(ws, task_id, evs)
    return bid


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One workspace: the small task run for real (baseline and an accepted candidate), and a
    planted copy of the accepted block."""
    root = tmp_path_factory.mktemp("reproduce")
    ws, _ = init_workspace(root / "home")
    try:
        pull(ws, "tiny-llama")
        define_task(ws, write_task(root / "spec", "repro"))
        result = run_task(ws, "repro")
        yield ws, result
    finally:
        ws.close()


@pytest.mark.slow
def test_the_accepted_block_reproduces(measured):
    ws, result = measured
    assert result.exit_state == "delivered", (result.exit_state, result.exit_reason)
    (acc,) = result.memory.accepted
    r = run_forge("reproduce", acc["event_id"], "--json", "--band", "0.75", home=ws.home,
                  timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["verdict"] == "reproduced" and out["block_id"] == acc["block_id"]
    figs = {f["metric"]: f for f in out["figures"]}
    assert list(figs)[:1] == ["output_throughput"] and "token_match" in figs
    assert figs["token_match"]["new"] == 1.0
    blk = result.memory.block(acc["block_id"])
    assert out["recorded_runs"] == [m["event_id"] for m in blk.measurements]
    assert figs["output_throughput"]["recorded"] == blk.median("output_throughput")
    assert len(figs["output_throughput"]["new_runs"]) == 3
    assert (figs["output_throughput"]["band"], figs["output_throughput"]["band_from"]) == \
        (0.75, "given")
    assert out["profile"] == "demo-tiny-cpu@1" and out["model_digest"].startswith("sha256:")
    (stored,) = [x.event for x in ws.ledger.stream(REPRODUCTIONS_STREAM)
                 if x.event.target == acc["event_id"]]
    assert stored.reproduced and stored.task_id == "repro"


@pytest.mark.slow
def test_a_block_planted_five_times_too_high_is_not_reproduced(measured):
    ws, result = measured
    (acc,) = result.memory.accepted
    # 5x: even a relaunch 1.5x faster than the recording stays far outside the 0.5 cap.
    bid = plant_block(ws, "repro", result.memory.block(acc["block_id"]), 5.0)
    r = run_forge("reproduce", f"repro:{bid}", "--repeats", "2", home=ws.home, timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout.startswith(f"repro:{bid}: NOT reproduced"), r.stdout
    (line,) = [x for x in r.stdout.splitlines() if x.strip().startswith("output_throughput")]
    assert "OUT" in line, line
    ev = [x.event for x in ws.ledger.stream(REPRODUCTIONS_STREAM)][-1]
    fig = next(f for f in ev.figures if f["metric"] == "output_throughput")
    assert not ev.reproduced and not fig["reproduced"] and ev.repeats == 2
    assert fig["ratio"] < 1 - fig["band"] and fig["band"] <= rp.BAND_CAP


# --- refusals (no engine) ---------------------------------------------------------------


def manual_block(ws, task_id: str) -> str:
    """A block with one recorded run, through the task writer (the manual path's events)."""
    common = {"task_id": task_id, "block_id": "b1", "actor": PLANT}
    append_to_task(ws, task_id, [
        E.LoopBlockStarted(index=1, sub_goal="baseline", **common),
        E.MeasurementRecorded(run_id="b1-r1", source="manual",
                              metrics={"output_throughput": 100.0}, repeat=0, **common)])
    return f"{task_id}:b1"


def test_unknown_ids_are_refused_in_one_line(workspace):
    for ident, said in (("deadbeefdeadbeef", "has id 'deadbeefdeadbeef'"),
                        ("nosuch:b1", "unknown task")):
        r = run_forge("reproduce", ident, home=workspace.home)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_gpu_point_is_refused_on_a_host_without_that_gpu(workspace, tmp_path):
    define_task(workspace, write_task(tmp_path, "gpu", accelerator="{vendor: nvidia, model: "
                                      "H200, count: 2}"))
    ident = manual_block(workspace, "gpu")
    cpu_only = E.HostInventory(cpus=2, memory_mib=4096, accelerator_note="NVML unavailable")
    with pytest.raises(rp.CannotReproduce, match=r"runs on 2x nvidia H200; this host has 0 "
                       r"\(no GPU; NVML unavailable\)"):
        rp.reproduce(workspace, ident, inventory=cpu_only)
    one = E.HostInventory(cpus=2, memory_mib=4096, gpus=(E.GpuInfo(
        index=0, uuid="GPU-0", vendor="nvidia", model="NVIDIA H200", memory_mib=143000),))
    with pytest.raises(rp.CannotReproduce, match="has 1 \\(nvidia NVIDIA H200\\)"):
        rp.reproduce(workspace, ident, inventory=one)
    # A measurement's id (a prefix of it) names the same block: refused the same way.
    (m,) = task_memory(workspace.ledger, "gpu").block("b1").measurements
    with pytest.raises(rp.CannotReproduce, match="runs on 2x nvidia H200"):
        rp.reproduce(workspace, m["event_id"][:13], inventory=cpu_only)
    tg = rp.resolve(workspace, m["event_id"])
    assert (tg.block.block_id, tg.measurement_id, tg.runs) == ("b1", m["event_id"], [m])
    assert not workspace.ledger.stream(REPRODUCTIONS_STREAM)


def test_a_missing_model_is_refused(workspace, tmp_path):
    define_task(workspace, write_task(tmp_path / "a", "nomodel"))
    r = run_forge("reproduce", manual_block(workspace, "nomodel"), home=workspace.home)
    assert r.returncode == 2 and "model 'forge:tiny-llama' is not pulled" \
        in r.stderr, r.stderr
    gone = tmp_path / "gone-model"
    define_task(workspace, write_task(tmp_path / "b", "gonedir", model=str(gone)))
    r = run_forge("reproduce", manual_block(workspace, "gonedir"), home=workspace.home)
    assert r.returncode == 2 and f"{gone}: not a model directory" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bad_options_and_blocks_without_runs_are_refused(workspace, tmp_path):
    define_task(workspace, write_task(tmp_path, "opts"))
    ident = manual_block(workspace, "opts")
    with pytest.raises(HarnessError, match="--band 0: must be above 0"):
        rp.reproduce(workspace, ident, band=0)
    with pytest.raises(HarnessError, match="--repeats 0"):
        rp.reproduce(workspace, ident, repeats=0)
    with pytest.raises(rp.CannotReproduce, match=r"task opts has no block 'b9' \(its blocks: b1\)"):
        rp.reproduce(workspace, "opts:b9")
    common = {"task_id": "opts", "block_id": "b2", "actor": PLANT}
    append_to_task(workspace, "opts", [
        E.LoopBlockHandedOff(**{**common, "block_id": "b1"}),
        E.LoopBlockStarted(index=2, sub_goal="failed", **common),
        E.MeasurementRecorded(run_id="b2-r1", source="manual", metrics={}, success=False,
                              error="server died", **common)])
    with pytest.raises(rp.CannotReproduce, match="block opts:b2 has no successful, valid run"):
        rp.reproduce(workspace, "opts:b2")


def test_the_band_follows_the_runs_spread_within_floor_and_cap():
    assert rp.band_for("output_throughput", [100, 100, 100], [99, 101], cpu=True) \
        == (0.25, "floor")
    assert rp.band_for("output_throughput", [100, 100], [100], cpu=False) == (0.10, "floor")
    assert rp.band_for("median_ttft_ms", [10, 10], [10], cpu=True) == (0.375, "floor")
    assert rp.band_for("output_throughput", [100, 140, 60], [100], cpu=True) == (0.5, "cap")
    width, why = rp.band_for("x", [1, 1.2], [1], cpu=False)
    assert why == "recorded runs' CV" and width == pytest.approx(3 * 0.1414 / 1.1, rel=1e-3)
    assert rp.band_for("x", [1, 1], [1, 1.2], cpu=False)[1] == "new runs' CV"
    assert rp.band_for("x", [1, 1], [1], cpu=False, point_cv=0.05) \
        == (pytest.approx(0.15), "point's noise band")
    assert rp.band_for("x", [1], [1], cpu=True, override=0.05, point_cv=0.3) == (0.05, "given")
    f = rp.judge("output_throughput", [300, 310, 290], [100, 101], 0.5)
    assert (f["recorded"], f["new"], f["reproduced"]) == (300, 100.5, False)
    assert rp.judge("failed", [0, 0], [0], 0.1)["reproduced"]
    assert not rp.judge("failed", [0, 0], [2], 0.1)["reproduced"]
