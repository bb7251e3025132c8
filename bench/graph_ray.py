"""Graph scheduling overhead per node: the Ray backend against the local runner, in the same
run. Prints figures for bench/RESULTS.md.

    .venv/bin/python bench/graph_ray.py [--chain 40] [--fan 40] [--repeats 3] [--skip-example]

A local Ray instance (2 CPUs, loopback) is started once and timed apart; then, alternating
local and Ray so that machine load hits both alike:
1. A chain of trivial nodes (`true`, verified by `true`) with 1 worker: overhead per node =
   (wall - time inside the nodes' commands) / nodes, start-up included (local: its worker
   process; Ray: workers are already up, the driver's connection is not); and the part of it
   between claim and conclusion (ledger saves, artifacts), as the run summary measures it.
2. A fan of independent trivial nodes with 2 in flight: wall per node.
3. `forge graph run` of a 1-node graph in a fresh process, local and `--backend ray
   --address` of the running instance: the fixed cost of a run (Ray: connecting).
4. The serving-project example (39 task nodes) with 2 workers on each backend.
Median of `--repeats` runs for 1 to 3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))

from infer_forge.harness.graph.commands import define_graph  # noqa: E402
from infer_forge.harness.graph.run import run_graph  # noqa: E402
from infer_forge.ledger.workspace import init_workspace  # noqa: E402
from infer_forge.repos import commands as repo_commands  # noqa: E402

NODE = ("{{id: {id}, type: kernel, work: {{argv: ['true'], "
        "verify: [{{name: ok, argv: ['true']}}]}}}}")


def graph_yaml(d: Path, name: str, n: int, chain: bool) -> Path:
    lines = [f"name: {name}", "nodes:"] + [f"  - {NODE.format(id=f'n{i}')}" for i in range(n)]
    if chain:
        lines += ["edges:"] + [f"  - {{from: n{i}, to: n{i + 1}, kind: handoff}}"
                               for i in range(n - 1)]
    y = d / f"{name}.yaml"
    y.write_text("\n".join(lines) + "\n")
    return y


def one_run(yaml_path: Path, name: str, backend: str, jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        ws, _ = init_workspace(Path(d) / "home")
        with ws:
            define_graph(ws, yaml_path)
            t = time.perf_counter()
            s = run_graph(ws, name, jobs=jobs, backend=backend)
            wall = time.perf_counter() - t
    assert s.outcome == "completed", s
    return {"wall_s": wall, "work_s": s.work_s, "in_node_s": s.overhead_per_node_s,
            "ran": s.ran, "peak": s.peak_in_flight}


def example(backend: str, jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        ws, _ = init_workspace(Path(d) / "home")
        with ws:
            mono = Path(d) / "monorepo-example"
            shutil.copytree(REPO / "examples" / "monorepo", mono,
                            ignore=shutil.ignore_patterns("remotes", "__pycache__"))
            subprocess.run([sys.executable, str(mono / "make_remotes.py")], check=True,
                           capture_output=True)
            repo_commands.init(ws, mono / "local.yaml")
            define_graph(ws, REPO / "examples" / "graphs" / "serving-project.yaml")
            t = time.perf_counter()
            s = run_graph(ws, "serving-project", jobs=jobs, backend=backend)
            wall = time.perf_counter() - t
    return {"outcome": s.outcome, "wall_s": wall, "work_s": s.work_s,
            "peak": s.peak_in_flight, "delivered": s.counts.get("delivered", 0),
            "rejected": s.counts.get("rejected", 0), "in_node_s": s.overhead_per_node_s}


def main() -> None:
    # the example's toy SGLang parts (no release fetched): these numbers are the graph
    # runner's, comparable across runs; tests/harness/graph/test_graph_run.py runs the real ones
    os.environ.setdefault("FORGE_SERVING_PROJECT", "fast")
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", type=int, default=40)
    ap.add_argument("--fan", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-example", action="store_true")
    a = ap.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on the loopback only
    import ray

    print(f"cores: {os.cpu_count()}, load avg: {os.getloadavg()[0]:.1f}, ray {ray.__version__}")
    tmp = tempfile.mkdtemp(prefix="forge-ray-")
    try:
        t = time.perf_counter()
        ray.init(_node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False,
                 log_to_driver=False, _temp_dir=tmp)
        print(f"ray start (local instance, 2 CPUs): {time.perf_counter() - t:.2f} s "
              "(not in the figures below)")
        with tempfile.TemporaryDirectory() as d:
            chain = graph_yaml(Path(d), "chain", a.chain, chain=True)
            fan = graph_yaml(Path(d), "fan", a.fan, chain=False)
            one_run(fan, "fan", "ray", 2)  # warm-up: Ray's first tasks import the package
            res: dict[tuple[str, str], list[dict]] = {}
            for _ in range(a.repeats):
                for backend in ("local", "ray"):
                    res.setdefault(("chain", backend), []).append(
                        one_run(chain, "chain", backend, 1))
                    res.setdefault(("fan", backend), []).append(one_run(fan, "fan", backend, 2))
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "work_s",
                                                                   "in_node_s")}
               for k, v in res.items()}
        for backend in ("local", "ray"):
            c = med[("chain", backend)]
            per = (c["wall_s"] - c["work_s"]) / a.chain
            print(f"chain of {a.chain}, 1 worker, {backend:5}: wall {c['wall_s']:.2f} s, in "
                  f"commands {c['work_s']:.2f} s -> {per * 1000:.0f} ms/node not in tasks "
                  f"(claim-to-conclusion part {c['in_node_s'] * 1000:.0f} ms)")
        for backend in ("local", "ray"):
            f = med[("fan", backend)]
            print(f"fan of {a.fan}, 2 in flight, {backend:5}: wall {f['wall_s']:.2f} s -> "
                  f"{f['wall_s'] / a.fan * 1000:.0f} ms/node (claim-to-conclusion "
                  f"{f['in_node_s'] * 1000:.0f} ms)")
        lc, rc = med[("chain", "local")], med[("chain", "ray")]
        print(f"ratio ray/local, chain wall: {rc['wall_s'] / lc['wall_s']:.2f}; fan wall: "
              f"{med[('fan', 'ray')]['wall_s'] / med[('fan', 'local')]['wall_s']:.2f}")
        # A fresh `forge` process per run: the fixed cost of connecting to a running cluster.
        with tempfile.TemporaryDirectory() as d:
            one = graph_yaml(Path(d), "one", 1, chain=False)
            env = {**os.environ, "FORGE_HOME": str(Path(d) / "home")}
            forge = [sys.executable, "-m", "infer_forge.cli"]
            subprocess.run([*forge, "init"], env=env, check=True, capture_output=True)
            subprocess.run([*forge, "graph", "new", str(one)], env=env, check=True,
                           capture_output=True)
            address = ray.get_runtime_context().gcs_address
            for backend, extra in (("local", []), ("ray", ["--address", address])):
                walls = []
                for _ in range(a.repeats):
                    t = time.perf_counter()
                    subprocess.run([*forge, "graph", "run", "--backend", backend, *extra],
                                   env=env, check=True, capture_output=True)
                    walls.append(time.perf_counter() - t)
                    subprocess.run([*forge, "graph", "rework", "n0", "--reason", "again"],
                                   env=env, check=True, capture_output=True)
                print(f"`forge graph run --backend {backend}` of 1 node, fresh process: "
                      f"{statistics.median(walls):.2f} s")
        if not a.skip_example:
            for backend in ("local", "ray"):
                x = example(backend, 2)
                print(f"example serving-project, 2 workers, {backend:5}: {x['outcome']} in "
                      f"{x['wall_s']:.1f} s (in commands {x['work_s']:.1f} s, peak in flight "
                      f"{x['peak']}, delivered {x['delivered']}, rejected {x['rejected']}, "
                      f"claim-to-conclusion {x['in_node_s'] * 1000:.0f} ms/node)")
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
