"""Deploying whole points (issue 18): plan computation and lifecycle overhead.

    .venv/bin/python bench/deploy.py [--plans 200] [--rounds 5]

- plan: `plan_point` for a 64-GPU PD point (4 prefill x TP8, 2 decode x TP16 with DP
  attention and EP16, the router) on 64 devices, median and p99 ms (target < 100 ms); a
  16-GPU point beside it.
- lifecycle: a PD deployment of stand-ins (2 prefill, 1 decode: the SGLang stand-in server;
  the stand-in router) started and stopped through `Deployment` (plan event, concurrent
  start, /server_info per role, the router's worker view, reverse teardown of process groups,
  ledger events, log artifacts) vs bare starts of the same four commands (Popen, poll
  /health, kill), in alternating rounds; the ratio of medians.
Each figure is printed with the 1-minute load average (2 shared cores).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infer_forge.harness.engines.deploy import Deployment
from infer_forge.harness.engines.host_plan import plan_with_free_ports
from infer_forge.harness.engines.plan import LaunchPlan, plan_point
from infer_forge.harness.engines.process import http_get
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile
from infer_forge.ledger.workspace import init_workspace

REPO = Path(__file__).resolve().parent.parent
FAKE = [sys.executable, str(REPO / "tests" / "data" / "sglang" / "fake_server.py")]
ROUTER = [sys.executable, str(REPO / "harness" / "testing" / "fake_router.py")]


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def point(roles: list[dict], count: int, vendor: str = "nvidia") -> DeploymentPoint:
    return DeploymentPoint.model_validate({
        "name": "bench", "model": {"name": "m", "source": "deepseek-ai/DeepSeek-V3"},
        "scenario": {"traffic": {"concurrency": 8}},
        "topology": {"architecture": "pd", "roles": roles},
        "runtime_profile": {"service": "s", "rev": 1},
        "accelerator": {"vendor": vendor, "model": "H200", "count": count}})


def profile(config: dict) -> RuntimeProfile:
    return RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": config,
        "framework": {"kind": "sglang", "version": "0.5.23"}})


def bench_plans(n: int) -> None:
    cfg = {"cuda_graph_max_bs": 128, "mem_fraction_static": 0.85,
           "role_config": {"decode": {"enable_dp_attention": True}}}
    cases = {
        "64-GPU PD (4P x TP8, 2D x TP16 DP16 EP16)": point(
            [{"role": "prefill", "count": 4, "parallelism": {"tp": 8}},
             {"role": "decode", "count": 2, "parallelism": {"tp": 16, "dp": 16, "ep": 16}}],
            64),
        "16-GPU PD (2P x TP4, 1D x TP8)": point(
            [{"role": "prefill", "count": 2, "parallelism": {"tp": 4}},
             {"role": "decode", "count": 1, "parallelism": {"tp": 8}}], 16),
    }
    prof = profile(cfg)
    for name, pt in cases.items():
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            plan_point(pt, prof, None)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        print(f"plan {name}: median {statistics.median(times):.2f} ms, "
              f"p99 {times[int(0.99 * (len(times) - 1))]:.2f} ms over {n} ({load()})",
              flush=True)


def stand_in_plan() -> LaunchPlan:
    pt = point([{"role": "prefill", "count": 2}, {"role": "decode", "count": 1}], 1, "cpu")
    return plan_with_free_ports(lambda base: plan_point(
        pt, profile({"launcher": FAKE, "router_launcher": ROUTER}), None, base_port=base))


def bare(plan: LaunchPlan) -> float:
    """The same four commands: Popen each, poll /health, kill each group."""
    t0 = time.perf_counter()
    procs = []
    try:
        for p in plan.processes:
            procs.append(subprocess.Popen(list(p.argv), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        for p in plan.processes:
            while http_get(p.health_url, timeout=2.0)[0] != 200:
                time.sleep(0.02)
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.perf_counter() - t0


def managed(plan: LaunchPlan, ws) -> float:
    t0 = time.perf_counter()
    with Deployment(plan, ws=ws, grace_s=5):
        pass
    return time.perf_counter() - t0


def bench_lifecycle(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws, _ = init_workspace(Path(tmp) / "home")
        with ws:
            b, m = [], []
            for i in range(rounds):  # alternate the order so drift hits both alike
                for arm in (("bare", "managed") if i % 2 == 0 else ("managed", "bare")):
                    plan = stand_in_plan()
                    (b if arm == "bare" else m).append(
                        bare(plan) if arm == "bare" else managed(plan, ws))
            mb, mm = statistics.median(b), statistics.median(m)
            print(f"PD of stand-ins (2 prefill, 1 decode, router), {rounds} rounds: bare "
                  f"starts {mb:.3f} s, deployment {mm:.3f} s, ratio {mm / mb:.2f} ({load()})",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    bench_plans(args.plans)
    bench_lifecycle(args.rounds)


if __name__ == "__main__":
    main()
