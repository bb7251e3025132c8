"""A task whose runs stored per-request records, for the compare view's tests.

The example task `tune-tiny-cpu` through the real CLI and writers:
- b1 (baseline): two runs by the bench's own writer (`harness.bench.client.record_measurement`,
  the records artifact as a measured run stores it: 20 successful requests with TTFT 100, 105,
  ... 195 ms, four 20 ms token gaps and E2E = TTFT + 80 ms; one failed request; one warm-up
  request of 9 s), and one run typed in (`forge measure`), which has no records;
- b2 (continuous batching on): one bench run (TTFT 50, 52, ... 88 ms, E2E = TTFT + 80 ms) and
  the three result lines of a real `sglang.bench_serving` file (`forge bench import`), whose
  details hold per-request TTFTs and ITLs but no per-request E2E.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer_forge.harness.bench.client import BenchResult, record_measurement
from infer_forge.harness.bench.metrics import RequestRecord, compute_metrics

from tests.conftest import run_forge

TASK = "tune-tiny-cpu"
BENCH_SERVING = Path(__file__).parents[1] / "data/sglang/golden/bench/sglang-0.5.1.jsonl"
CB = {"engine.continuous_batching": True}


def requests(ttft0_ms: float, step_ms: float, n: int = 20, t0: float = 0.0
             ) -> list[RequestRecord]:
    """`n` successful requests (TTFT ttft0 + i * step ms, sent from `t0` on) and one failed
    one."""
    ok = [RequestRecord(success=True, prompt_len=16, output_len=5,
                        ttft=(ttft0_ms + step_ms * i) / 1e3, itl=[0.02] * 4,
                        e2e=(ttft0_ms + step_ms * i + 80.0) / 1e3, start_time=t0 + i * 0.01,
                        index=i)
          for i in range(n)]
    return ok + [RequestRecord(success=False, error="connection reset", index=n)]


def bench_result(ttft0_ms: float, step_ms: float, t0: float = 0.0) -> BenchResult:
    recs = requests(ttft0_ms, step_ms, t0=t0)
    warm = [RequestRecord(success=True, prompt_len=16, output_len=5, ttft=9.0, itl=[0.5],
                          e2e=9.5, warmup=True)]
    return BenchResult({"num_prompts": len(recs)}, recs, warm, 1.0, compute_metrics(recs, 1.0))


def _cli(home: Path, *args: str) -> Any:
    r = run_forge(*args, home=home)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def build_records(ws) -> None:
    """Record the task (see the module)."""
    home = Path(ws.home)
    _cli(home, "task", "new", "examples/tasks/tune-tiny-cpu.yaml")
    _cli(home, "block", "start", TASK, "--sub-goal", "baseline")
    for i in range(2):
        # Sent at another time: other records (a run's command id is its records' digest).
        record_measurement(ws, bench_result(100.0, 5.0, t0=10.0 * i), task_id=TASK, block_id="b1",
                           run_id=f"b1-bench-{i}", repeat=i)
    _cli(home, "measure", TASK, "--metric", "output_throughput=90", "--metric",
         "median_ttft_ms=150")
    _cli(home, "block", "handoff", TASK, "--state-reached", "baseline measured")
    _cli(home, "block", "start", TASK, "--sub-goal", "continuous batching", "--set",
         "engine.continuous_batching=true")
    record_measurement(ws, bench_result(50.0, 2.0), task_id=TASK, block_id="b2",
                       run_id="b2-bench-0", candidate=CB)
    _cli(home, "bench", "import", str(BENCH_SERVING), "--task", TASK, "--block", "b2")


def recorded(ws, block: str, metric: str) -> list[float]:
    """The values of `metric` the ledger holds for the task's block (successful runs)."""
    return [float(r.event.metrics[metric]) for r in ws.ledger.log(types=["MeasurementRecorded"])
            if r.event.block_id == block and r.event.success and metric in r.event.metrics]
