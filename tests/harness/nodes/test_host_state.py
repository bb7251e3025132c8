"""The host's state on every measured run (harness/nodes/host_state.py): read from the real
psutil and /proc and, for GPUs, the simulated NVML (whose surface is checked against the
real `pynvml`, nvidia-ml-py); judged by `contamination`, recorded by the engine evaluator on
a real engine (the tiny model on the hf engine), seen by the gates, and compared by
projected into the DuckDB index (both its SQL and Python paths), shown by `forge trace` and
on the wiki. `forge reproduce`'s comparison: test_host_reproduce.py.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pynvml
import pytest
from infer_forge.harness.loop import gates
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
from infer_forge.harness.loop.evaluator_protocol import EvalContext
from infer_forge.harness.models.weights import pull
from infer_forge.harness.nodes import host_state as hs
from infer_forge.harness.record import append_to_task
from infer_forge.harness.task import load_task_from_ledger
from infer_forge.harness.testing.fake_nvml import FakeNvml
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import Contract, HostLimits
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.task import runs_of
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections import index as I
from infer_forge.wiki.build import build

from tests.conftest import REPO, run_forge

PROFILE = REPO / "examples/profiles/demo-tiny-cpu.yaml"
PLANT = E.Actor.human("planter")
# Only the GPU side judged: on this shared 2-core machine other people's work (a mypy, a
# test) would otherwise contaminate the runs now and then.
GPU_ONLY = "{max_load_per_core: 1000, max_foreign_cpu: 1000}"


def write_task(d: Path, task_id: str, host: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "point.yaml").write_text(
        "name: tiny-host\n"
        "model: {name: tiny-llama, source: \"forge:tiny-llama\", revision: '1', "
        "modalities: [text]}\n"
        "scenario:\n  modality: text\n"
        "  traffic: {input_len: 16, output_len: 8, range_ratio: 1.0, concurrency: 2, "
        "num_prompts: 4}\n"
        f"runtime_profile: {{service: demo-tiny-cpu, rev: 1, file: {PROFILE}}}\n"
        "accelerator: {vendor: cpu, model: x86_64}\n")
    (d / "task.yaml").write_text(
        f"id: {task_id}\ntype: deployment-tuning\ngoal: host state\npoint: point.yaml\n"
        "scope:\n  engine.continuous_batching: [true]\n"
        "contract:\n  gates:\n"
        "    - {name: throughput, metric: output_throughput, at_least: 0.001}\n"
        "    - {name: stability, repeats: 2, max_failed_requests: 0}\n"
        f"  host: {host}\n"
        "verification: [baseline, measure, gates, decide]\n"
        "exit: {when: all_gates_pass, max_blocks: 1, no_progress_blocks: 1}\n"
        "executor: {kind: sweep, strategy: grid, seed: 0}\n")
    return d / "task.yaml"


# --- the simulated NVML speaks pynvml; the pure judges -----------------------------------


def test_the_simulated_nvml_has_the_real_pynvml_surface_and_bits():
    def required(f) -> int:
        return sum(1 for p in inspect.signature(f).parameters.values()
                   if p.default is inspect.Parameter.empty)

    for name, f in inspect.getmembers(FakeNvml, inspect.isfunction):
        if name.startswith("nvml"):  # the real library has it, with the same arguments
            assert required(getattr(pynvml, name)) == required(f) - 1, name
    for bit, name in hs.THROTTLE_BITS.items():
        camel = "".join(w.capitalize() for w in name.split("_"))
        assert getattr(pynvml, f"nvmlClocksThrottleReason{camel}") == bit, name
    assert (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_TEMPERATURE_GPU) == (1, 2, 0)
    assert hs.throttle_names(0x8 | 0x40 | 0x1000) == ["hw_slowdown", "hw_thermal_slowdown",
                                                      "0x1000"]


def test_the_pure_judges_name_what_contaminated_and_what_is_not_comparable():
    gpu = {"index": 0, "throttle": ["gpu_idle"],
           "foreign": [{"pid": 4242, "name": "python", "mem_mib": 3174}]}
    state = {"cores": 2, "load1": 5.1, "foreign_cpu": 0.1, "foreign_top": [],
             "gpus": [gpu, {"index": 1, "throttle": ["sw_power_cap"], "foreign": []}]}
    assert hs.contamination(state, HostLimits()) == [
        "foreign GPU process pid 4242 (python, 3.1 GiB) on GPU 0",
        "GPU 1 throttled: sw_power_cap",
        "host load 5.1 per 2 cores above 1.5 per core"]
    quiet = {"cores": 2, "load1": 0.4, "foreign_cpu": 0.0, "gpus": []}
    assert hs.contamination(quiet, HostLimits()) == []
    assert hs.compare([state], [quiet], HostLimits()) == (
        "not comparable: recorded at load 5.1 on 2 cores, now 0.4 on 2 (limit 1.5 per "
        "core); recorded with foreign GPU process pid 4242 (python, 3.1 GiB) on GPU 0, "
        "GPU 1 throttled: sw_power_cap")
    assert hs.compare([quiet], [dict(quiet, load1=0.9)], HostLimits()) is None


def test_a_sample_reads_proc_psutil_and_nvml_and_leaves_forges_own_pids_out():
    fake = FakeNvml(2)
    parent = os.getppid()  # a real process outside this one's tree
    fake.busy(0, parent, os.getpid(), used_mib=4096)
    fake.throttled(1, 0x8 | 0x1)
    sampler = hs.HostSampler(fake)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        sampler.start()
        fake.busy(1, child.pid)  # our own child: the engine's side, not foreign
        state = sampler.stop()
    finally:
        child.kill()
        child.wait()
        sampler.close()
    assert state["cores"] == psutil.cpu_count() and state["load1"] >= 0
    if Path("/proc/pressure/cpu").exists():
        assert 0 <= state["psi_cpu_some_avg10"] <= 100
    assert state["nvml"] == "ok"
    g0, g1 = state["gpus"]
    assert [p["pid"] for p in g0["foreign"]] == [parent]
    assert g0["foreign"][0]["name"] == psutil.Process(parent).name()
    assert g1["foreign"] == [] and g1["throttle"] == ["gpu_idle", "hw_slowdown"]
    assert (g1["sm_clock_mhz"], g1["power_cap_w"], g1["ecc"], g1["mig"]) == (1110, 700.0,
                                                                            True, False)
    why = hs.contamination(state, HostLimits(max_load_per_core=1e3, max_foreign_cpu=1e3))
    assert why == [f"foreign GPU process pid {parent} ({g0['foreign'][0]['name']}, 2.0 GiB) "
                   "on GPU 0", "GPU 1 throttled: hw_slowdown"]


def test_only_the_points_gpus_are_read_by_index_or_uuid():
    """Another tenant on a GPU the deployment was not given is not contamination: the
    sampler reads the GPUs its deployment names (as CUDA_VISIBLE_DEVICES does), by NVML's
    index or by UUID (or a prefix), and records which."""
    fake = FakeNvml(4)
    tenant = os.getppid()
    fake.busy(3, tenant)
    fake.throttled(2, 0x20)
    limits = HostLimits(max_load_per_core=1e3, max_foreign_cpu=1e3)

    def sample(gpus):
        sampler = hs.HostSampler(fake, gpus=gpus)
        sampler.start()
        return sampler.stop()

    mine = sample(["0", "1"])
    assert [g["index"] for g in mine["gpus"]] == [0, 1] and mine["gpus_scope"] == ["0", "1"]
    assert hs.contamination(mine, limits) == []
    theirs = sample([fake.gpus[3].uuid[:12], "2"])  # a UUID prefix and an index
    assert [g["index"] for g in theirs["gpus"]] == [2, 3]
    assert [x.split(" (")[0] for x in hs.contamination(theirs, limits)] == [
        "GPU 2 throttled: sw_thermal_slowdown", f"foreign GPU process pid {tenant}"]
    everything = sample(None)
    assert len(everything["gpus"]) == 4 and everything["gpus_scope"] == "all"
    # A deployment's GPUs: its processes' devices, else the inherited CUDA_VISIBLE_DEVICES.
    desc = {"processes": [{"devices": [10, 2]}, {"devices": [3]}, {"devices": []}]}
    assert hs.deployment_gpus(desc, {}) == ["2", "3", "10"]
    assert hs.deployment_gpus({"engine": "hf"}, {"CUDA_VISIBLE_DEVICES": "1, GPU-ab"}) == [
        "1", "GPU-ab"]
    assert hs.deployment_gpus({"engine": "hf"}, {}) is None


# --- a real engine's runs, the gates, and forge reproduce ---------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The tiny model's baseline measured 3 times on the real hf engine with the simulated
    NVML; a foreign process and a throttle planted on its GPU 0 during run 2 only."""
    root = tmp_path_factory.mktemp("host-state")
    ws, _ = init_workspace(root / "home")
    try:
        pull(ws, "tiny-llama")
        define_task(ws, write_task(root / "spec", "hs", GPU_ONLY))
        lt = load_task_from_ledger(ws, "hs")
        fake = FakeNvml(1)
        foreign = os.getppid()

        def progress(line: str) -> None:  # between runs: plant, then clear
            if line.startswith("run 1/3:"):
                fake.busy(0, foreign, used_mib=3174)
                fake.throttled(0, 0x8)
            elif line.startswith("run 2/3:"):
                fake.idle(0)
                fake.throttled(0, 0, sm_mhz=1980)

        ev = EngineEvaluator(ws, lt.task, base_dir=lt.base_dir, nvml=fake)
        ctx = EvalContext(ws, "hs", "b1", lt.point, lt.profile, None, progress)
        results = ev.evaluate({}, repeats=3, ctx=ctx)
        yield ws, lt, results, foreign
    finally:
        ws.close()


def _records(results):
    return [{"metrics": r.metrics, "success": r.success, "meta": r.meta} for r in results]


def test_a_run_with_a_foreign_gpu_process_and_a_throttle_is_contaminated_and_excluded(measured):
    ws, lt, results, foreign = measured
    assert [r.success for r in results] == [True, True, True], [r.error for r in results]
    name = psutil.Process(foreign).name()
    planted = [f"foreign GPU process pid {foreign} ({name}, 3.1 GiB) on GPU 0",
               "GPU 0 throttled: hw_slowdown"]
    assert [r.meta["contaminated"] for r in results] == [[], planted, []]
    assert results[1].meta["host"]["gpus"][0]["sm_clock_mhz"] == 1110
    assert results[0].meta["host"]["gpus"][0]["foreign"] == []
    verdict = gates.judge(lt.task.contract, runs_of(_records(results)), None,
                          skip_relative=True)
    by = {g.name: g for g in verdict.gates}
    assert by["throughput"].n == 2 and by["stability"].n == 2
    note = f"1 of 3 runs excluded: {planted[0]}; {planted[1]}"
    assert all(g.reason.endswith(note) for g in verdict.gates), verdict.gates
    # `flag`: the run is kept, and the reason says so.
    flag = Contract.model_validate({**lt.task.contract.model_dump(), "host": {
        "max_load_per_core": 1000, "foreign_gpu": "flag", "throttle": "flag"}})
    verdict = gates.judge(flag, runs_of(_records(results)), None, skip_relative=True)
    assert {g.n for g in verdict.gates} == {3}
    assert all(g.reason.endswith(f"1 of 3 runs flagged (kept): {planted[0]}; {planted[1]}")
               for g in verdict.gates)
    # No host limits in the contract: judged exactly as before.
    plain = Contract.model_validate({**lt.task.contract.model_dump(), "host": None})
    assert all(g.n == 3 and "excluded" not in g.reason for g in gates.judge(
        plain, runs_of(_records(results)), None, skip_relative=True).gates)


def test_the_index_the_trace_and_the_wiki_show_each_runs_host_state(measured, tmp_path):
    ws, _, results, foreign = measured
    common = {"task_id": "hs", "block_id": "b1", "actor": PLANT}
    append_to_task(ws, "hs", [E.LoopBlockStarted(index=1, sub_goal="baseline", **common)] + [
        E.MeasurementRecorded(run_id=f"b1-r{i + 1}", source="forge-bench", metrics=r.metrics,
                              repeat=i, meta=r.meta, **common)
        for i, r in enumerate(results)] + [
        E.DeliverableAccepted(summary="host state shown", **common)])
    for sql_path in (True, False):
        con = I.connect(tmp_path / f"index-{sql_path}.duckdb")
        try:
            I.catch_up(con, ws.ledger, sql_path=sql_path)
            rows = con.execute(
                "SELECT contaminated, host->>'$.gpus[0].foreign[0].pid', "
                "(host->>'$.cores')::INT FROM measurement_runs WHERE task_id = 'hs' "
                "ORDER BY repeat").fetchall()
        finally:
            con.close()
        cores = psutil.cpu_count()
        assert rows == [(False, None, cores), (True, str(foreign), cores),
                        (False, None, cores)], sql_path
    dirty = "; ".join(results[1].meta["contaminated"])
    (accepted,) = [x.event for x in ws.ledger.stream(task_stream("hs"))
                   if isinstance(x.event, E.DeliverableAccepted)]
    r = run_forge("trace", str(accepted.event_id), home=ws.home)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if "b1-r2" in x]
    assert line.endswith(f"[contaminated: {dirty}]"), line
    build(ws, embeddings=False)
    (page,) = (Path(ws.home) / "wiki").rglob(f"*{str(accepted.event_id)[:8]}*.md")
    text = page.read_text()
    assert f"CONTAMINATED: {dirty}" in text, text[-3000:]
    assert "GPU 0: SM 1110 MHz, 120/700 W, 38 C, hw_slowdown, 1 foreign" in text
