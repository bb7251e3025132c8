"""Planning a point over several hosts (issue 35): time per plan, against a one-host plan.

    .venv/bin/python bench/plan_multinode.py [--plans 200]

- 4-node x 8-GPU PD: examples/points/deepseek-r1-pd-4x8-h200.yaml (prefill TP16 over two
  hosts, decode TP16 DP16 EP16 over two, MTP, DeepEP, EPLB; five processes: each server's
  two ranks and the router), planned on four named hosts with per-host IB devices
  (target < 100 ms a plan);
- the one-host PD example (examples/points/qwen3-235b-pd-h200.yaml) in the same process,
  the same way; the ratio of the medians.
Both after one warm-up plan (the flag table loads once). Printed with the 1-minute load
average (2 shared cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from infer_forge.harness.engines.plan import plan_point
from infer_forge.harness.engines.point_up import point_and_profile

REPO = Path(__file__).resolve().parent.parent
POINTS = REPO / "examples" / "points"


def timed(n: int, plan: Callable[[], None]) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        plan()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=200)
    n = ap.parse_args().plans
    multi, multi_profile = point_and_profile(POINTS / "deepseek-r1-pd-4x8-h200.yaml")
    hosts = {f"gpu-{i}": list(range(8)) for i in range(4)}
    ib = {h: ",".join(f"mlx5_{k}" for k in range(8)) for h in hosts}
    one, one_profile = point_and_profile(POINTS / "qwen3-235b-pd-h200.yaml")

    def plan_multi() -> None:
        plan = plan_point(multi, multi_profile, hosts, ib_devices=ib)
        assert len(plan.processes) == 5 and plan.devices_used == 32

    def plan_one() -> None:
        plan_point(one, one_profile, None)

    plan_multi(), plan_one()  # warm-up: the flag table loads once
    rows = {"4-node x 8-GPU PD (DeepSeek-R1, 2+2 hosts, 5 processes)": timed(n, plan_multi),
            "1-host PD (Qwen3-235B, 3 processes)": timed(n, plan_one)}
    for name, t in rows.items():
        print(f"plan {name}: median {statistics.median(t):.2f} ms, "
              f"p99 {t[int(0.99 * (len(t) - 1))]:.2f} ms over {n}")
    medians = [statistics.median(t) for t in rows.values()]
    print(f"ratio 4-node / 1-host: {medians[0] / medians[1]:.2f}x; target < 100 ms a plan: "
          f"{'met' if medians[0] < 100 else 'MISSED'} "
          f"(load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
