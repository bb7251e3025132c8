"""Task graph benchmarks. Prints figures for bench/RESULTS.md.

    .venv/bin/python bench/graph.py [--nodes 1000 --edges 5000] [--chain 40] [--skip-example]

1. Projection: a 1,000-node, 5,000-edge graph (one GraphDefined carrying the spec, then
   half the nodes run: started, verified, handoffs, delivered) folded from the SQLite
   ledger into the networkx-backed view, plus the ready queue, blocked reasons and critical
   path. Target: under 1 s. Baseline in the same run: reading and decoding the same stream.
2. Scheduling overhead per node: a chain of trivial nodes (`true`) run by `run_graph -j 1`;
   overhead = (wall - time inside the nodes' commands) / nodes, worker start-up included.
   Baseline in the same run: the same commands spawned back to back with no ledger.
3. The serving-project example (39 task nodes) end to end with -j 1 and -j 2.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))

from infer_forge.harness.graph.commands import define_graph, handoff_events  # noqa: E402
from infer_forge.harness.graph.run import run_graph  # noqa: E402
from infer_forge.ledger import events as E  # noqa: E402
from infer_forge.ledger.graphspec import parse_graph_spec  # noqa: E402
from infer_forge.ledger.streams import graph_stream  # noqa: E402
from infer_forge.ledger.workspace import init_workspace  # noqa: E402
from infer_forge.projections.graph import (  # noqa: E402
    fold,
    load_graph,
    rework_plan,
)
from infer_forge.repos import commands as repo_commands  # noqa: E402

WORK = {"argv": ["true"], "verify": [{"name": "ok", "argv": ["true"]}]}
TYPES = ["kernel", "communication", "engine-integration", "deployment-tuning", "evaluation",
         "diagnosis", "upstream-sync"]


def big_spec(n: int, m: int, seed: int = 0) -> dict:
    """A random DAG: edges go from lower to higher index; 60% handoff, 25% state, 15% control
    (start/stop/rework)."""
    r = random.Random(seed)
    nodes = [{"id": f"n{i:04d}", "type": TYPES[i % 7], "work": WORK, "est_s": 1 + i % 5}
             for i in range(n)]
    seen: set[tuple[int, int]] = set()
    edges = []
    while len(edges) < m:
        a = r.randrange(n - 1)
        b = r.randrange(a + 1, min(n, a + 60))
        if (a, b) in seen:
            continue
        seen.add((a, b))
        x = r.random()
        kind, extra = ("handoff", {}) if x < 0.6 else (("state", {}) if x < 0.85 else (
            "control", {"action": r.choice(["start", "stop", "rework"])}))
        edges.append({"from": f"n{a:04d}", "to": f"n{b:04d}", "kind": kind, **extra})
    return {"name": "big", "nodes": nodes, "edges": edges}


def bench_projection(n: int, m: int, repeats: int = 5) -> dict:
    t = time.perf_counter()
    spec = parse_graph_spec(big_spec(n, m))  # includes the cycle check
    check_s = time.perf_counter() - t
    # As define_graph writes it: the initial graph in one GraphDefined event.
    evs: list[E.Event] = [E.GraphDefined(
        graph_id="big", spec_hash=spec.spec_hash(),
        nodes=[x.model_dump(mode="json") for x in spec.nodes],
        edges=[x.dump() for x in spec.edges])]
    view = fold(evs)
    # run half the graph, in readiness order, through the real handoff gate
    run: list[E.Event] = []
    done = 0
    while done < n // 2:
        ready = view.ready()
        if not ready:
            break
        node = ready[0]
        batch: list[E.Event] = [
            E.NodeStarted(node=node, attempt=1, run_id="r", worker="w", pid=1),
            E.NodeVerified(node=node, attempt=1, passed=True)]
        for ev in batch:
            view.apply(ev)
        delivered, _ = handoff_events(view, node, 1)
        batch2 = [*delivered, E.NodeDelivered(node=node, attempt=1, duration_s=1.0)]
        for ev in batch2:
            view.apply(ev)
        run += batch + batch2
        done += 1
    with tempfile.TemporaryDirectory() as d:
        ws, _ = init_workspace(Path(d) / "home")
        with ws:
            stream = graph_stream("big")
            ws.ledger.append(stream, evs)
            for i in range(0, len(run), 1000):
                ws.ledger.append(stream, run[i:i + 1000])
            total = ws.ledger.version(stream)
            reads, projs = [], []
            for _ in range(repeats):
                t = time.perf_counter()
                ws.ledger.stream(stream)
                reads.append(time.perf_counter() - t)
                t = time.perf_counter()
                v = load_graph(ws.ledger, "big")
                ready, blocked = v.ready(), v.blocked()
                path, length = v.critical_path()
                projs.append(time.perf_counter() - t)
            t = time.perf_counter()
            plan = rework_plan(v, "n0000")
            rework_s = time.perf_counter() - t
    return {"nodes": n, "edges": m, "events": total, "cycle_check_s": check_s,
            "read_decode_s": statistics.median(reads), "projection_s": statistics.median(projs),
            "ratio_vs_read": statistics.median(projs) / statistics.median(reads),
            "ready": len(ready), "blocked": len(blocked), "critical_path_nodes": len(path),
            "rework_targets": len(plan), "rework_plan_s": rework_s}


def bench_overhead(chain: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        y = Path(d) / "chain.yaml"
        lines = ["name: chain", "nodes:"]
        lines += [f"  - {{id: c{i}, type: kernel, work: {{argv: ['true'], verify: "
                  f"[{{name: ok, argv: ['true']}}]}}}}" for i in range(chain)]
        lines += ["edges:"] + [f"  - {{from: c{i}, to: c{i + 1}, kind: handoff}}"
                               for i in range(chain - 1)]
        y.write_text("\n".join(lines) + "\n")
        ws, _ = init_workspace(Path(d) / "home")
        with ws:
            define_graph(ws, y)
            t = time.perf_counter()
            s = run_graph(ws, "chain", jobs=1)
            wall = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(chain * 2):  # the same commands (work + verify), no ledger
            subprocess.run(["true"], check=True)
        bare = time.perf_counter() - t
    per_node = (wall - s.work_s) / chain
    return {"nodes": chain, "outcome": s.outcome, "wall_s": wall, "work_s": s.work_s,
            "overhead_per_node_s": per_node, "in_node_overhead_s": s.overhead_per_node_s,
            "bare_spawn_per_node_s": bare / chain, "ratio_vs_bare": wall / bare}


def bench_example(jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        ws, _ = init_workspace(Path(d) / "home")
        with ws:
            # The shared repos are MonoRepo members of the local manifest (remotes in d).
            mono = Path(d) / "monorepo-example"
            shutil.copytree(REPO / "examples" / "monorepo", mono,
                            ignore=shutil.ignore_patterns("remotes", "__pycache__"))
            subprocess.run([sys.executable, str(mono / "make_remotes.py")], check=True,
                           capture_output=True)
            repo_commands.init(ws, mono / "local.yaml")
            define_graph(ws, REPO / "examples" / "graphs" / "serving-project.yaml")
            t = time.perf_counter()
            s = run_graph(ws, "serving-project", jobs=jobs)
            wall = time.perf_counter() - t
            v = load_graph(ws.ledger, "serving-project")
            _, cp = v.critical_path()
    return {"jobs": jobs, "outcome": s.outcome, "wall_s": wall, "work_s": s.work_s,
            "peak_in_flight": s.peak_in_flight, "delivered": s.counts.get("delivered", 0),
            "rejected": s.counts.get("rejected", 0), "critical_path_s": cp,
            "in_node_overhead_s": s.overhead_per_node_s}


def main() -> None:
    # the example's toy SGLang parts (no release fetched): these numbers are the graph
    # runner's, comparable across runs; tests/harness/graph/test_graph_run.py runs the real ones
    os.environ.setdefault("FORGE_SERVING_PROJECT", "fast")
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--edges", type=int, default=5000)
    ap.add_argument("--chain", type=int, default=40)
    ap.add_argument("--skip-example", action="store_true")
    a = ap.parse_args()
    print(f"cores: {os.cpu_count()}, load avg: {os.getloadavg()[0]:.1f}")
    p = bench_projection(a.nodes, a.edges)
    print(f"projection: {p['nodes']} nodes, {p['edges']} edges, {p['events']} events: "
          f"{p['projection_s'] * 1000:.0f} ms (load + ready + blocked + critical path; "
          f"read+decode alone {p['read_decode_s'] * 1000:.0f} ms, ratio "
          f"{p['ratio_vs_read']:.2f}x); {p['ready']} ready, {p['blocked']} blocked, "
          f"critical path {p['critical_path_nodes']} nodes; cycle check at definition "
          f"{p['cycle_check_s'] * 1000:.0f} ms; rework plan from the root "
          f"{p['rework_targets']} nodes in {p['rework_plan_s'] * 1000:.1f} ms "
          f"-> {'PASS' if p['projection_s'] < 1.0 else 'FAIL'} (< 1 s)")
    o = bench_overhead(a.chain)
    print(f"scheduling overhead: chain of {o['nodes']} trivial nodes, -j 1: wall "
          f"{o['wall_s']:.2f} s, in commands {o['work_s']:.2f} s -> "
          f"{o['overhead_per_node_s'] * 1000:.0f} ms/node not in tasks (worker start-up "
          f"included; claim-to-conclusion part {o['in_node_overhead_s'] * 1000:.0f} ms); "
          f"bare spawns {o['bare_spawn_per_node_s'] * 1000:.0f} ms/node, ratio "
          f"{o['ratio_vs_bare']:.1f}x")
    if not a.skip_example:
        for jobs in (1, 2):
            x = bench_example(jobs)
            print(f"example serving-project -j {jobs}: {x['outcome']} in {x['wall_s']:.1f} s "
                  f"(in commands {x['work_s']:.1f} s, peak in flight {x['peak_in_flight']}, "
                  f"delivered {x['delivered']}, rejected {x['rejected']}, critical path "
                  f"{x['critical_path_s']:.1f} s)")


if __name__ == "__main__":
    main()
