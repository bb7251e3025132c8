"""Launching a 2-host plan through Ray (issue 35): overhead over bare process starts.

    .venv/bin/python bench/ray_launch.py [--rounds 5]

A local Ray cluster of two nodes (two raylets on this machine, `ray.cluster_utils.Cluster`,
each offering `host:127.0.0.1` / `host:127.0.0.2`, its files under a temp dir) and the
2-host PD plan of tests/harness/engines/test_ray_launch.py (prefill on one host, decode on
the other, the router; the stand-in SGLang server and router). Per round, the same lifecycle
(deploy.py: health per process, role check, router started and its worker view checked),
start to ready and teardown timed apart:
- bare: `Deployment` spawning the three processes here (subprocess + process group);
- ray: `RayDeployment`, the processes spawned by one agent actor per node; every launch
  starts its own two agents (each a Ray worker process: Python, Ray and infer_forge
  imported), the bulk of the difference. The warm-up round is shown apart (`ray first`).
Ratio of the medians (ray / bare). Printed with the 1-minute load average (2 shared cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `tests` importable, as in the test suite


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="forge-rlb-")
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_TMPDIR=tmp)
    import ray
    from infer_forge.harness.engines.deploy import Deployment
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes
    from ray.cluster_utils import Cluster

    from tests.harness.engines.test_ray_launch import HOSTS, two_host_plan

    class Bare(Deployment):
        LOCAL_ONLY = False  # 127.0.0.2 is this machine's loopback too

    logs = Path(tmp) / "logs"
    c = None
    try:
        t0 = time.perf_counter()
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "num_gpus": 2, "include_dashboard": False,
            "node_ip_address": "127.0.0.1", "resources": {f"host:{HOSTS[0]}": 1}})
        c.add_node(num_cpus=1, num_gpus=2, node_ip_address="127.0.0.1",
                   resources={f"host:{HOSTS[1]}": 1})  # the GPUs each agent reserves
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        cluster_s = time.perf_counter() - t0
        nodes = ray_nodes(HOSTS)
        times: dict[str, list[tuple[float, float]]] = {"bare": [], "ray": []}
        for _ in range(args.rounds + 1):
            for kind in ("bare", "ray"):
                plan = two_host_plan()  # a free block of ports here
                dep = (Bare(plan, grace_s=5, logs=logs) if kind == "bare"
                       else RayDeployment(plan, nodes, grace_s=5, logs=logs))
                t1 = time.perf_counter()
                dep.start()
                t2 = time.perf_counter()
                dep.stop()
                t3 = time.perf_counter()
                times[kind].append((t2 - t1, t3 - t2))
        first = times["ray"].pop(0)
        times["bare"].pop(0)  # the warm-up round of each
        med = {k: (statistics.median(s for s, _ in v), statistics.median(t for _, t in v))
               for k, v in times.items()}
        load = os.getloadavg()[0]
        print(f"2-node local Ray cluster up in {cluster_s:.1f} s; {args.rounds} rounds of a "
              f"3-process 2-host PD plan (stand-ins), load {load:.2f}")
        print(f"  ray first : start {first[0] * 1000:7.0f} ms  stop {first[1] * 1000:6.0f} ms "
              "(the warm-up round, not in the medians)")
        for k in ("bare", "ray"):
            print(f"  {k:<10}: start {med[k][0] * 1000:7.0f} ms  stop {med[k][1] * 1000:6.0f} "
                  "ms (median)")
        print(f"  ratio ray/bare: start {med['ray'][0] / med['bare'][0]:.2f}x "
              f"(+{(med['ray'][0] - med['bare'][0]) * 1000:.0f} ms: two agent actors, each a "
              f"worker process, per launch), stop {med['ray'][1] / med['bare'][1]:.2f}x")
    finally:
        ray.shutdown()
        if c is not None:
            c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
