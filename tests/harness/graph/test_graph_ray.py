"""The Ray backend of the graph runner (`forge graph run --backend ray`) on a real local Ray
instance bound to 127.0.0.1 with 2 CPUs (2 workers), shared by the module: the same final
state as the local backend, a worker killed mid-node retried without a duplicated event,
resources from the deployment point, Ray's node table in the Node Registry."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from infer_forge.harness.graph.commands import define_graph
from infer_forge.harness.graph.ray_backend import point_gpus, run_graph_ray
from infer_forge.harness.graph.run import run_graph
from infer_forge.harness.nodes.ray_table import ray_inventory
from infer_forge.harness.proc import alive
from infer_forge.ledger import events as E
from infer_forge.ledger.check import check_workspace
from infer_forge.ledger.specs import load_point
from infer_forge.ledger.streams import graph_stream
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.graph import load_graph, node_task_id

from tests.conftest import REPO, need, run_forge

from .test_graph_run import final_states, layered_graph

HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture(scope="module")
def ray_address():
    """One local Ray instance for the module: 2 CPUs, every address on the loopback, its
    session under a short temp dir (Ray's sockets live there); no process left behind."""
    need(HAS_RAY, "ray is not installed: pip install 'infer-forge[ray]'")
    import psutil

    # Read when ray is imported: Ray then addresses itself on the loopback (on Linux it
    # otherwise swaps 127.0.0.1 for the host's reachable address).
    before = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # The workers' node commands inherit the raylet's environment, fixed here: the
    # serving-project example's toy parts (no SGLang release; test_graph_run.py runs the
    # real ones), the same in the local run of the equality test.
    before_mode = os.environ.get("FORGE_SERVING_PROJECT")
    os.environ["FORGE_SERVING_PROJECT"] = "fast"
    import ray

    tmp = tempfile.mkdtemp(prefix="forge-ray-")
    # Children this process had before Ray (a session's engine server, PostgreSQL): not Ray's.
    others = {p.pid for p in psutil.Process().children(recursive=True)}
    ray.init(_node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False,
             log_to_driver=False, _temp_dir=tmp)
    try:
        assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
        assert any(p.name() == "raylet" for p in psutil.Process().children(recursive=True))
        yield ray.get_runtime_context().gcs_address
    finally:
        procs = [p for p in psutil.Process().children(recursive=True)  # raylet, GCS, ...
                 if p.pid not in others]
        ray.shutdown()
        if before is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = before
        if before_mode is None:
            os.environ.pop("FORGE_SERVING_PROJECT", None)
        else:
            os.environ["FORGE_SERVING_PROJECT"] = before_mode
        _, left = psutil.wait_procs(procs, timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"


def _graph_events(ws, graph_id: str) -> list[E.Event]:
    return [r.event for r in ws.ledger.stream(graph_stream(graph_id))]


def test_point_gpus_come_from_the_topology():
    point = load_point(REPO / "examples" / "points" / "qwen-h200.yaml")
    assert point_gpus(point) == 1
    tp2pp2 = point.model_copy(update={"topology": point.topology.model_copy(update={
        "parallelism": point.topology.parallelism.model_copy(update={"tp": 2, "pp": 2})})})
    assert point_gpus(tp2pp2) == 4
    roles = type(point.topology).model_validate({"architecture": "pd", "roles": [
        {"role": "prefill", "count": 1, "parallelism": {"tp": 2}},
        {"role": "decode", "count": 3, "parallelism": {"tp": 1, "dp": 2}}]})
    assert point_gpus(point.model_copy(update={"topology": roles})) == 8
    assert point_gpus(load_point(REPO / "examples" / "points" / "tiny-cpu.yaml")) == 0


def test_a_ray_node_row_becomes_a_host_inventory():
    host, inv = ray_inventory({
        "NodeManagerHostname": "gpu-7", "NodeManagerAddress": "10.0.0.7", "Alive": True,
        "Resources": {"CPU": 96.0, "GPU": 8.0, "memory": 512 * 2**30,
                      "accelerator_type:H200": 1.0, "node:10.0.0.7": 1.0}})
    assert host == "gpu-7" and inv.source == "ray" and inv.cpus == 96
    assert inv.memory_mib == 512 * 1024
    assert [(g.index, g.model, g.vendor) for g in inv.gpus] == [(i, "H200", "nvidia")
                                                                for i in range(8)]
    assert "no GPU UUIDs" in inv.accelerator_note


def test_layered_graph_on_ray_equals_the_local_backend(ray_address, tmp_path, monkeypatch):
    from infer_forge.projections.nodes import read_hosts

    monkeypatch.setenv("RENDEZVOUS", "1")  # the Ray workers keep their own environment
    yaml_path = layered_graph(tmp_path)
    states = {}
    for backend in ("local", "ray"):
        ws, _ = init_workspace(tmp_path / f"home-{backend}")
        with ws:
            define_graph(ws, yaml_path)
            s = run_graph(ws, "layered", jobs=2, backend=backend)
            assert s.outcome == "completed", s
            evs = _graph_events(ws, "layered")
            starts = [e for e in evs if isinstance(e, E.NodeStarted)]
            assert len(starts) == 16 and set(Counter(e.node for e in starts).values()) == {1}
            assert len({e.event_id for e in evs}) == len(evs)
            assert check_workspace(ws).ok
            states[backend] = final_states(ws, "layered")
            if backend == "ray":
                assert all(e.worker.startswith("ray-") for e in starts)
                assert 1 <= s.peak_in_flight <= 2
                # Ray's node table fed the registry: this machine, as Ray sees it
                hosts = read_hosts(ws.ledger).hosts
                assert len(hosts) == 1
                (inv,) = [h.inventory for h in hosts.values()]
                assert inv.source == "ray" and inv.cpus == 2 and inv.gpus == ()
    assert states["ray"] == states["local"]


KILL_PARENT = r'''
import os, pathlib, signal
if os.environ["FORGE_ATTEMPT"] == "1":
    # The Ray worker running this node is our grandparent (our parent is the leader of the
    # command's session, proc.session_launch): note its pid, then kill it.
    stat = pathlib.Path(f"/proc/{os.getppid()}/stat").read_text()
    worker = int(stat[stat.rfind(")") + 2:].split()[1])
    pathlib.Path("killed.pid").write_text(str(worker))
    os.kill(worker, signal.SIGKILL)
print('{"value": 1}')
'''


def killing_graph(tmp_path: Path) -> Path:
    """a -> victim -> c; victim's first attempt kills the Ray worker running it."""
    (tmp_path / "kill_parent.py").write_text(KILL_PARENT)
    (tmp_path / "g.yaml").write_text("""name: killed
nodes:
  - {id: a, type: kernel, work: {sh: "echo a > a.txt", verify: [{name: ok, sh: "test -s a.txt"}]}}
  - id: victim
    type: kernel
    work:
      argv: ["{python}", "{graph_dir}/kill_parent.py"]
      verify: [{name: value, metric: value, equals: 1}]
  - {id: c, type: evaluation, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
edges:
  - {from: a, to: victim, kind: handoff}
  - {from: victim, to: c, kind: handoff}
""")
    return tmp_path / "g.yaml"


def test_a_worker_killed_mid_node_is_retried_without_duplicated_events(ray_address,
                                                                        tmp_path):
    ws, _ = init_workspace(tmp_path / "home")
    with ws:
        define_graph(ws, killing_graph(tmp_path))
        s = run_graph(ws, "killed", jobs=2, backend="ray")
        assert s.outcome == "completed", s
        evs = _graph_events(ws, "killed")
        starts = [e for e in evs if isinstance(e, E.NodeStarted)]
        abandoned = [e for e in evs if isinstance(e, E.NodeAbandoned)]
        delivered = Counter(e.node for e in evs if isinstance(e, E.NodeDelivered))
        assert [(e.node, e.attempt) for e in starts] == [("a", 1), ("victim", 1),
                                                         ("victim", 2), ("c", 1)]
        assert [(e.node, e.attempt) for e in abandoned] == [("victim", 1)]
        assert "Ray retried" in abandoned[0].reason
        assert delivered == Counter({"a": 1, "victim": 1, "c": 1})
        # the killed process is the one that claimed attempt 1; Ray's retry ran in another
        killed = int((tmp_path / "home" / "graphs" / "killed" / "work" / "killed.pid")
                     .read_text())
        first, second = starts[1], starts[2]
        assert first.pid == killed and not alive(killed)
        assert second.pid != killed and second.worker == first.worker  # the same Ray task
        assert len({e.event_id for e in evs}) == len(evs)
        task = [r.event for r in ws.ledger.stream(f"task:{node_task_id('killed', 'victim')}")]
        kinds = Counter(e.TYPE for e in task)
        assert [e.block_id for e in task if isinstance(e, E.LoopBlockStarted)] == ["a1", "a2"]
        assert kinds["TaskDefined"] == kinds["TaskExited"] == 1
        assert kinds["ToolInvoked"] == 1  # attempt 1 died inside its command
        assert check_workspace(ws).ok
        assert load_graph(ws.ledger, "killed").finished()


def test_when_ray_gives_up_the_attempt_is_abandoned_once_and_the_run_fails(ray_address,
                                                                          tmp_path):
    ws, _ = init_workspace(tmp_path / "home")
    with ws:
        define_graph(ws, killing_graph(tmp_path))
        lines: list[str] = []
        s = run_graph_ray(ws, "killed", jobs=2, echo=lines.append, max_retries=0)
        assert s.outcome == "failed"
        evs = _graph_events(ws, "killed")
        assert [(e.node, e.attempt) for e in evs if isinstance(e, E.NodeStarted)] == [
            ("a", 1), ("victim", 1)]  # not resubmitted; c never became ready
        (abandoned,) = [e for e in evs if isinstance(e, E.NodeAbandoned)]
        assert (abandoned.node, abandoned.attempt) == ("victim", 1)
        assert abandoned.reason.startswith("Ray task ray-2 failed: ")
        assert any(x.startswith("Ray task ray-2 for victim failed: ") for x in lines)
        assert s.counts["delivered"] == 1 and s.counts["pending"] == 2
        assert check_workspace(ws).ok


def test_a_node_needing_more_gpus_than_the_cluster_is_reported_not_hung(ray_address,
                                                                        tmp_path):
    point = REPO / "examples" / "points" / "qwen-h200.yaml"  # tp 1 on an H200: 1 GPU
    (tmp_path / "tune.yaml").write_text(f"""id: tune
type: deployment-tuning
goal: tune on the GPU
point: {point}
scope: {{engine.continuous_batching: [true]}}
contract:
  gates: [{{name: t, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}]
evaluator: {{kind: command, argv: ["true"]}}
""")
    (tmp_path / "g.yaml").write_text("""name: gpu
nodes:
  - {id: tune, type: deployment-tuning, work: {kind: loop, task: tune.yaml}}
  - {id: cpu, type: evaluation, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
""")
    ws, _ = init_workspace(tmp_path / "home")
    with ws:
        define_graph(ws, tmp_path / "g.yaml")
        lines: list[str] = []
        s = run_graph(ws, "gpu", jobs=2, backend="ray", echo=lines.append)
        assert s.outcome == "stuck"
        assert s.counts["delivered"] == 1 and s.counts["pending"] == 1
        why = "needs 1 GPU(s) (its deployment point's topology); the largest node of the " \
              "Ray cluster has 0"
        assert s.blocked == {"tune": [why]}
        assert f"cannot schedule tune: {why}" in lines
        assert not any(isinstance(e, E.NodeStarted) and e.node == "tune"
                       for e in _graph_events(ws, "gpu"))


def test_cli_backend_errors_are_one_line(tmp_path, forge_home):
    (tmp_path / "g.yaml").write_text("""name: one
nodes:
  - {id: a, type: kernel, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
""")
    assert run_forge("init").returncode == 0
    assert run_forge("graph", "new", str(tmp_path / "g.yaml")).returncode == 0
    r = run_forge("graph", "run", "--address", "127.0.0.1:1")
    assert r.returncode == 1
    assert r.stderr.strip() == ("Error: --address is for --backend ray (the local backend "
                                "has no cluster)")
    # ray missing: a package that fails to import, first on the path
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no ray here')\n")
    r = run_forge("graph", "run", "--backend", "ray", process=True,
                  env={"PYTHONPATH": f"{shadow.parent}{os.pathsep}"
                                     f"{os.environ.get('PYTHONPATH', '')}"})
    assert r.returncode == 1
    assert r.stderr.strip() == ("Error: the Ray backend needs ray: pip install "
                                "'infer-forge[ray]'")
    if HAS_RAY:  # nothing listening there: refused at once, not retried for minutes
        r = run_forge("graph", "run", "--backend", "ray", "--address", "127.0.0.1:1",
                      process=True)  # in process, ray.init keeps the cluster it joined first
        assert r.returncode == 1
        assert r.stderr.strip().startswith("Error: cannot reach Ray at 127.0.0.1:1: ")
    # none of these recorded a run
    ws, _ = init_workspace(forge_home)
    with ws:
        assert load_graph(ws.ledger, "one").runs == []


# The serving-project nodes whose deliverables carry measured timings or fresh commits: their
# digests differ between any two runs, local or Ray (two local runs differ in these 8 only).
MEASURED = {"sync-lockfile", "comm-kv-transfer", "comm-bandwidth-model", "tune-opt-level",
            "tune-moe-batch", "tune-runtime-profile", "eval-regression", "eval-release-gate"}


def _deliverables(ws, graph_id: str) -> dict[str, tuple[str, dict[str, str]]]:
    """node -> (state, {deliverable name: digest}) of its final attempt."""
    v = load_graph(ws.ledger, graph_id)
    verified = {(e.node, e.attempt): e.deliverable for e in _graph_events(ws, graph_id)
                if isinstance(e, E.NodeVerified)}
    return {n.id: (n.state, verified.get((n.id, n.attempt), {})) for n in v.tasks()}


@pytest.mark.slow
def test_serving_project_on_ray_with_2_workers_equals_the_local_backend(ray_address,
                                                                          tmp_path):
    need(shutil.which("gcc") is not None, "gcc is needed by the example's kernel nodes")
    need(shutil.which("git") is not None, "git is needed by the example's sync nodes")
    results = {}
    for backend in ("local", "ray"):
        home = tmp_path / backend / "home"
        assert run_forge("init", home=home).returncode == 0
        mono = tmp_path / backend / "monorepo-example"
        shutil.copytree(REPO / "examples" / "monorepo", mono,
                        ignore=shutil.ignore_patterns("remotes", "__pycache__"))
        subprocess.run([sys.executable, str(mono / "make_remotes.py")], check=True,
                       capture_output=True)
        assert run_forge("repos", "init", str(mono / "local.yaml"), home=home).returncode == 0
        r = run_forge("graph", "new", str(REPO / "examples" / "graphs" /
                                          "serving-project.yaml"), home=home)
        assert r.returncode == 0, r.stderr
        args = ["--backend", "ray", "--address", ray_address] if backend == "ray" else []
        # Ray's driver as a process of its own: ray.init joins a process to one cluster for
        # its life, and the tasks' workers flush what they did when their driver exits.
        r = run_forge("graph", "run", "-j", "2", *args, "--json", home=home, timeout=600,
                      process=backend == "ray", env={"FORGE_SERVING_PROJECT": "fast"})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        ws, _ = init_workspace(home)
        with ws:
            evs = _graph_events(ws, "serving-project")
            starts = [e for e in evs if isinstance(e, E.NodeStarted)]
            assert len(load_graph(ws.ledger, "serving-project").tasks()) == 39
            # each started once; one (stopped by a control edge) never starts
            assert len(starts) == 38 and len({e.node for e in starts}) == 38
            assert len({e.event_id for e in evs}) == len(evs)
            if backend == "ray":
                assert all(e.worker.startswith("ray-") for e in starts)
            assert 1 <= json.loads(r.stdout)["peak_in_flight"] <= 2
            results[backend] = (_deliverables(ws, "serving-project"),
                                final_states(ws, "serving-project"))
    (local, local_states), (ray_, ray_states) = results["local"], results["ray"]
    assert ray_states == local_states
    assert {n: s for n, (s, _) in ray_.items()} == {n: s for n, (s, _) in local.items()}
    assert Counter(s for s, _ in ray_.values()) == Counter(delivered=37, rejected=2)
    for node, (_, deliverable) in ray_.items():
        if node in MEASURED:
            assert deliverable.keys() == local[node][1].keys(), node
        else:
            assert deliverable == local[node][1], node


def _descendants(root: int) -> dict[int, str]:
    """Every live process below `root`, by pid, with its start time (from /proc)."""
    from infer_forge.harness.proc import stat_fields
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        f = stat_fields(int(d)) if d.isdigit() else None
        if f and len(f) > 19:
            children.setdefault(int(f[1]), []).append(int(d))
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            f = stat_fields(c)
            if f and len(f) > 19 and f[0] != "Z":
                out[c] = f[19]
                todo.append(c)
    return out


@pytest.mark.slow
def test_kill_9_of_a_ray_run_leaves_no_process_it_started(tmp_path):
    """Where no cluster is found, forge starts a Ray instance of its own: kill -9 forge in
    the middle of a node, and every process it started (Ray's GCS, raylet, dashboard and
    runtime-env agents, workers, the node's command) is gone. Found by the process tree
    below forge before the kill, and each judged by its pid and start time after."""
    need(HAS_RAY, "ray is not installed: pip install 'infer-forge[ray]'")
    from infer_forge.harness.proc import start_time

    from tests.conftest import FORGE

    (tmp_path / "g.yaml").write_text("""name: rk
nodes:
  - id: slow
    type: evaluation
    work: {sh: "echo $$ > cmd.pid && touch started && exec sleep 600",
           verify: [{name: ok, sh: "true"}]}
""")
    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    assert run_forge("graph", "new", str(tmp_path / "g.yaml"), home=home).returncode == 0
    ray_tmp = tempfile.mkdtemp(prefix="fr-")  # no cluster of this machine's found there
    env = {**os.environ, "FORGE_HOME": str(home), "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    work = home / "graphs" / "rk" / "work"
    started: dict[int, str] = {}
    with (tmp_path / "run.log").open("w") as log:
        p = subprocess.Popen([*FORGE, "graph", "run", "--graph", "rk", "--backend", "ray"],
                             env=env, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not (work / "started").exists():
            assert p.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the node never started"
            time.sleep(0.1)
        started = _descendants(p.pid)
        cmd = int((work / "cmd.pid").read_text())
        assert cmd in started and len(started) >= 5, started  # Ray's processes and the node's
        p.kill()
        p.wait()
        deadline = time.monotonic() + 60
        while left := [q for q, t in started.items() if start_time(q) == t and alive(q, t)]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not left, f"processes forge started outlived it: {left}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for q, t in started.items():  # a failed run: nothing left behind by the test either
            if alive(q, t):
                os.kill(q, 9)
        shutil.rmtree(ray_tmp, ignore_errors=True)
