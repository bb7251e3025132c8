"""Running task graphs: parallel workers on one ledger, kill -9 + resume, rework
re-runs, loop nodes, and the serving-project example (39 task nodes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from infer_forge.harness.graph.commands import define_graph, request_rework
from infer_forge.harness.graph.run import run_graph
from infer_forge.ledger import events as E
from infer_forge.ledger.check import check_workspace
from infer_forge.ledger.streams import ENDPOINTS_STREAM, graph_stream
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.graph import load_graph, node_task_id
from infer_forge.projections.nodes import read_claims
from infer_forge.projections.repos import read_repo_history

from tests.conftest import FORGE, REPO, need, run_forge

SGLANG_PIN = "0.5.23"  # the example's pinned upstream (examples/graphs/serving-project/tasks.py)

# The first layer's nodes wait (bounded) until RENDEZVOUS of them have started: with several
# workers the run must overlap them, and the peak in flight shows it.
RENDEZVOUS = r'''
import os, pathlib, sys, time
d = pathlib.Path(os.environ["FORGE_WORKDIR"]) / "started"
d.mkdir(exist_ok=True)
(d / sys.argv[1]).touch()
need = int(os.environ.get("RENDEZVOUS", "1")) if sys.argv[1].startswith("l1-") else 0
end = time.monotonic() + 20
while len(list(d.glob("l1-*"))) < need and time.monotonic() < end:
    time.sleep(0.01)
print('{"value": %d}' % len(sys.argv[1]))
'''


def layered_graph(tmp_path: Path) -> Path:
    """16 tasks: a root, a layer of 6, a layer of 6 (diamonds), a join, a tail of 2."""
    (tmp_path / "rv.py").write_text(RENDEZVOUS)
    nodes, edges = ["root"], []
    for i in range(6):
        nodes.append(f"l1-{i}")
        edges.append(("root", f"l1-{i}", "handoff"))
    for i in range(6):
        nodes.append(f"l2-{i}")
        edges += [(f"l1-{i}", f"l2-{i}", "handoff"), (f"l1-{(i + 1) % 6}", f"l2-{i}", "handoff")]
    nodes.append("join")
    edges += [(f"l2-{i}", "join", "handoff") for i in range(6)]
    nodes += ["tail-0", "tail-1"]
    edges += [("join", "tail-0", "handoff"), ("tail-0", "tail-1", "control")]
    lines = ["name: layered", "nodes:"]
    for n in nodes:
        lines.append(f"  - id: {n}\n    type: evaluation\n    work:\n"
                     f"      argv: ['{{python}}', '{{graph_dir}}/rv.py', '{n}']\n"
                     f"      verify:\n        - {{name: value, metric: value, at_least: 1}}\n"
                     f"        - {{name: ran, sh: 'test -f started/{n}'}}")
    lines.append("edges:")
    lines += [f"  - {{from: {a}, to: {b}, kind: {k}}}" for a, b, k in edges]
    p = tmp_path / "layered.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p


def final_states(ws, graph_id: str) -> dict[str, tuple[str, bool]]:
    v = load_graph(ws.ledger, graph_id)
    return {n.id: (n.state, n.verified) for n in v.tasks()} | {
        e: (str(es.delivered), True) for e, es in v.edges.items()}


def test_four_workers_no_lost_or_duplicated_events_same_state_as_one(tmp_path, monkeypatch):
    yaml_path = layered_graph(tmp_path)
    results = {}
    for jobs in (1, 4):
        monkeypatch.setenv("RENDEZVOUS", "2" if jobs > 1 else "1")
        ws, _ = init_workspace(tmp_path / f"home-j{jobs}")
        with ws:
            define_graph(ws, yaml_path)
            s = run_graph(ws, "layered", jobs=jobs)
            assert s.outcome == "completed", s
            evs = [r.event for r in ws.ledger.stream(graph_stream("layered"))]
            starts = Counter(e.node for e in evs if isinstance(e, E.NodeStarted))
            delivered = Counter(e.node for e in evs if isinstance(e, E.NodeDelivered))
            handoffs = Counter(e.edge for e in evs if isinstance(e, E.HandoffDelivered))
            assert set(starts.values()) == {1} and len(starts) == 16
            assert set(delivered.values()) == {1} and len(delivered) == 16
            assert set(handoffs.values()) == {1} and len(handoffs) == 25
            # every node's task stream is whole: 1 definition, 1 block, 3 tools, 1 exit
            for n in starts:
                kinds = Counter(r.type for r in ws.ledger.stream(f"task:layered.{n}"))
                assert kinds["TaskDefined"] == kinds["TaskExited"] == 1
                assert kinds["LoopBlockStarted"] == 1 and kinds["ToolInvoked"] == 2
            ids = [r.event.event_id for r in ws.ledger.log()]
            assert len(ids) == len(set(ids))
            report = check_workspace(ws)
            assert report.ok, report.problems
            # Each attempt was a Node Registry claim held by its worker, released with it.
            book = read_claims(ws.ledger)
            assert len(book.claims) == 16 and not book.active()
            assert {c.holder.node for c in book.claims.values()} == set(starts)
            assert {c.end_reason for c in book.claims.values()} == {"delivered"}
            assert {c.holder.pid for c in book.claims.values()} == {
                e.pid for e in evs if isinstance(e, E.NodeStarted)}
            results[jobs] = (final_states(ws, "layered"), s)
    assert results[1][0] == results[4][0]
    assert results[1][1].peak_in_flight == 1
    assert 2 <= results[4][1].peak_in_flight <= 4


def test_rework_reruns_and_reverifies_only_downstream(tmp_path):
    p = layered_graph(tmp_path)
    ws, _ = init_workspace(tmp_path / "home")
    with ws:
        define_graph(ws, p)
        assert run_graph(ws, "layered", jobs=2).outcome == "completed"
        plan = request_rework(ws, "layered", "l2-3", "input schema changed")
        assert set(plan) == {"l2-3", "join", "tail-0"}  # tail-1 is only control/start
        s = run_graph(ws, "layered", jobs=2)
        assert s.outcome == "completed" and s.ran == 3
        v = load_graph(ws.ledger, "layered")
        assert {n.id for n in v.tasks() if n.attempt == 2} == {"l2-3", "join", "tail-0"}
        assert v.nodes["root"].attempt == 1 and v.nodes["tail-1"].attempt == 1
        kinds = Counter(r.type for r in ws.ledger.stream("task:layered.join"))
        assert kinds["TaskReopened"] == 1 and kinds["VerificationRecorded"] == 2


def test_failed_verification_rejects_and_refuses_handoff(tmp_path, workspace):
    p = tmp_path / "g.yaml"
    p.write_text("""name: g
nodes:
  - id: a
    type: kernel
    work: {sh: 'echo "{\\"err\\": 0.5}"', verify: [{name: acc, metric: err, at_most: 0.01}]}
  - {id: b, type: evaluation, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
edges:
  - {from: a, to: b, kind: handoff}
""")
    define_graph(workspace, p)
    s = run_graph(workspace, "g", jobs=1)
    assert s.outcome == "stuck" and "b" in s.blocked
    evs = [r.event for r in workspace.ledger.stream(graph_stream("g"))]
    refused = [e for e in evs if isinstance(e, E.HandoffRefused)]
    rejected = [e for e in evs if isinstance(e, E.NodeRejected)]
    assert refused and refused[0].reason == "deliverable failed verification"
    assert rejected[0].node == "a" and "acc" in rejected[0].reason
    ver = [r.event for r in workspace.ledger.stream("task:g.a")
           if isinstance(r.event, E.VerificationRecorded)][0]
    assert str(ver.event_id) in rejected[0].evidence  # the rejection links its evidence
    (acc,) = ver.gates  # one typed result, the same type the loop's gates are
    assert (acc.kind, acc.verdict, acc.passed, acc.metric) == ("metric", "fail", False, "err")
    assert (acc.median, acc.threshold, acc.direction) == (0.5, 0.01, "at_most")


def _wait_for(cond, timeout=60.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_kill_9_of_the_runner_then_resume(tmp_path, forge_home):
    p = tmp_path / "g.yaml"
    p.write_text("""name: crash
nodes:
  - {id: a, type: kernel, work: {sh: "echo a > a.txt", verify: [{name: ok, sh: "test -s a.txt"}]}}
  - id: b
    type: kernel
    work:
      sh: "while [ ! -f release ]; do sleep 0.05; done; echo b > b.txt"
      verify: [{name: ok, sh: "test -s b.txt"}]
  - id: c
    type: evaluation
    work: {sh: "cat a.txt b.txt > c.txt", verify: [{name: ok, sh: "grep -q b c.txt"}]}
  - {id: d, type: evaluation, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
edges:
  - {from: a, to: b, kind: handoff}
  - {from: b, to: c, kind: handoff}
  - {from: a, to: d, kind: handoff}
""")
    assert run_forge("init").returncode == 0
    assert run_forge("graph", "new", str(p)).returncode == 0
    env = {**os.environ, "FORGE_HOME": str(forge_home)}
    runner = subprocess.Popen([*FORGE, "graph", "run", "-j", "2"], cwd=str(REPO), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ws, _ = init_workspace(forge_home)
    with ws:
        def b_running():
            v = load_graph(ws.ledger, "crash")
            # d (after a) finishes at once; b waits for `release`: only b is in flight.
            return v.nodes["b"].state == "running" and v.nodes["a"].state == "delivered" \
                and v.nodes["d"].state == "delivered" and v

        v = _wait_for(b_running, what="b running")
        worker_pid = v.nodes["b"].pid
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
        _wait_for(lambda: _pid_gone(worker_pid), 30, "the worker to die with the runner")
        # b's claim outlives its holder; the stale rule sees the holder gone but keeps the
        # claim while its lease runs.
        (cl,) = read_claims(ws.ledger).active()
        assert cl.claim_id == "node:crash.b.a1" and cl.holder.pid == worker_pid
        r = run_forge("nodes", "cleanup", "--dry-run", "--json")
        (verdict,) = json.loads(r.stdout)
        assert verdict["action"] == "kept" and verdict["signals"]["holder_gone"] is True
        # the interrupted run must be resumed explicitly
        r = run_forge("graph", "run")
        assert r.returncode != 0 and "forge graph resume" in r.stderr
        (forge_home / "graphs" / "crash" / "work" / "release").touch()
        r = run_forge("graph", "resume", "-j", "2", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        evs = [rec.event for rec in ws.ledger.stream(graph_stream("crash"))]
    starts = Counter(e.node for e in evs if isinstance(e, E.NodeStarted))
    delivered = Counter(e.node for e in evs if isinstance(e, E.NodeDelivered))
    abandoned = [e for e in evs if isinstance(e, E.NodeAbandoned)]
    assert starts["a"] == 1 and delivered["a"] == 1  # never re-run
    assert starts["b"] == 2 and delivered["b"] == 1
    assert [(e.node, e.attempt) for e in abandoned] == [("b", 1)]
    assert delivered == Counter({"a": 1, "b": 1, "c": 1, "d": 1})
    assert [e.outcome for e in evs if isinstance(e, E.GraphRunFinished)][-2:] == [
        "interrupted", "completed"]
    ws, _ = init_workspace(forge_home)
    with ws:
        blocks = [r.event.block_id for r in ws.ledger.stream(f"task:{node_task_id('crash', 'b')}")
                  if isinstance(r.event, E.LoopBlockStarted)]
        assert blocks == ["a1", "a2"]  # the killed attempt's events stay, marked as attempt 1
        assert check_workspace(ws).ok
        claims = read_claims(ws.ledger).claims
        assert not [c for c in claims.values() if c.state == "active"]
        assert claims["node:crash.b.a1"].end_reason.startswith("abandoned: runner of")
        assert claims["node:crash.b.a2"].end_reason == "delivered"


@pytest.mark.slow
def test_serving_project_example_completes(forge_home):
    need(shutil.which("gcc") is not None, "gcc is needed by the example's kernel nodes")
    need(shutil.which("git") is not None, "git is needed by the example's sync nodes")
    from tests.helpers import real_sglang

    # The real parts: the pinned release from the kit's cache (fetched once, never per run).
    real_sglang.release(SGLANG_PIN)
    real = {"FORGE_SGLANG_CACHE": str(real_sglang.CACHE), "FORGE_SERVING_PROJECT": "real"}
    example = REPO / "examples" / "graphs" / "serving-project.yaml"
    assert run_forge("init").returncode == 0
    # The shared repos are MonoRepo members: the local manifest, its remotes made in tmp.
    mono = forge_home.parent / "monorepo-example"
    shutil.copytree(REPO / "examples" / "monorepo", mono,
                    ignore=shutil.ignore_patterns("remotes", "__pycache__"))
    subprocess.run([sys.executable, str(mono / "make_remotes.py")], check=True,
                   capture_output=True)
    r = run_forge("repos", "init", str(mono / "local.yaml"))
    assert r.returncode == 0, r.stderr
    r = run_forge("graph", "new", str(example))
    assert r.returncode == 0, r.stderr
    # The production endpoint: its stand-in server, monitored by the diagnosis node.
    prod = subprocess.Popen([sys.executable, str(example.parent / "serving-project" /
                                                 "prod-endpoint" / "serve.py"), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert prod.stdout is not None
        line = prod.stdout.readline()  # `listening on URL` once bound
        assert line.startswith("listening on "), line
        url = line.split()[-1]
        r = run_forge("graph", "run", "-j", "2", "--json", timeout=600,
                      env={**real, "FORGE_PROD_ENDPOINT": url})
    finally:
        prod.terminate()
        prod.wait(10)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "delivered" in r.stderr  # progress was printed while it ran
    out = forge_home / "graphs" / "serving-project" / "work" / "out"

    def result(node: str) -> dict:
        return json.loads((out / node / "result.json").read_text())

    # The real SGLang release was vendored, its parser took the profile's flags, and its
    # bench client measured the stand-ins: the tuned point inside the SLO, the default not.
    sync = result("sync-sglang")
    assert sync["real"] == 1 and sync["wheel"].startswith(f"sglang-{SGLANG_PIN}-")
    assert sync["vendored_files"] > 1000 and sync["version_matches"] == 1
    profile = result("tune-runtime-profile")
    assert profile["flags_parser"] == f"sglang {SGLANG_PIN} (vendored)"
    assert profile["flags_rejected"] == 0
    slo = result("eval-slo-goodput")
    assert slo["measured_by"] == f"sglang {SGLANG_PIN} bench client (vendored)"
    assert slo["completed"] == 16 and slo["meets_slo"] == 1 and slo["baseline_meets_slo"] == 0
    assert slo["baseline_tpot_p99_ms"] > 60 >= slo["tpot_p99_ms"]
    diag = result("diag-prod-latency")
    assert (diag["source"], diag["endpoint"], diag["scrapes"]) == ("forge monitor", "given", 60)
    assert diag["corr_queue_ttft"] >= 0.8 and 2.5 < diag["arrival_rate_per_s"] < 3.5
    ws, _ = init_workspace(forge_home)
    with ws:
        v = load_graph(ws.ledger, "serving-project")
        tasks = v.tasks()
        assert len(tasks) >= 38 and len({n.spec.type for n in tasks}) == 7
        rejected = {n.id: n for n in tasks if n.state == "rejected"}
        assert set(rejected) == {"kernel-fp8-per-tensor", "kernel-moe-deepgemm-h20"}
        assert all(n.evidence for n in rejected.values())  # rejected directions keep evidence
        assert all(n.state == "delivered" for n in tasks if n.id not in rejected)
        assert {n.kind for n in v.nodes.values()} == {"task", "repo", "system"}
        # the monitor's windows of the endpoint are in the ledger, every scrape answered
        windows = [r.event for r in ws.ledger.stream(ENDPOINTS_STREAM)
                   if isinstance(r.event, E.EndpointSummarized) and r.event.url == url]
        assert sum(w.samples for w in windows) == 60 and not any(w.errors for w in windows)
        # The repo nodes are worktrees of their members, pinned at the run's snapshot.
        started = [r.event for r in ws.ledger.stream("graph:serving-project")
                   if r.event.TYPE == "GraphRunStarted"]
        assert started and started[-1].repo_snapshot in \
            read_repo_history(ws.ledger).snapshots
        work = forge_home / "graphs" / "serving-project" / "work" / "repos"
        for node, member in (("repo-sglang", "sglang"), ("repo-kernels", "kernels")):
            d = work / member
            assert (d / ".git").is_file(), f"{node} is not a worktree"
            branch = subprocess.run(["git", "-C", str(d), "branch", "--show-current"],
                                    capture_output=True, text=True, check=True).stdout.strip()
            assert branch == f"forge/graph/serving-project/{node}"


LOOP_EVAL = r'''
import json, os
cand = json.loads(os.environ.get("FORGE_CANDIDATE") or "{}")
fast = cand.get("engine.continuous_batching", False)
print(json.dumps({"output_throughput": 130.0 if fast else 100.0, "median_ttft_ms": 50.0,
                  "token_match": 1.0, "completed": 8, "failed": 0}))
'''


def define_loop_graph(tmp_path: Path, workspace) -> None:
    """Graph `lg`: a loop node `tune` (a sweep over one flag, gated) handing off to `check`."""
    (tmp_path / "ev.py").write_text(LOOP_EVAL)
    point = REPO / "examples" / "points" / "tiny-cpu.yaml"
    (tmp_path / "tune.yaml").write_text(f"""id: ignored
type: deployment-tuning
goal: more throughput
point: {point}
scope:
  engine.continuous_batching: [true]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
    - {{name: stability, repeats: 2, max_cv: 0.10, max_failed_requests: 0}}
exit: {{max_blocks: 3, when: all_gates_pass}}
executor: {{kind: sweep}}
evaluator: {{kind: command, argv: ["{{python}}", "{{graph_dir}}/ev.py"]}}
""")
    (tmp_path / "g.yaml").write_text("""name: lg
nodes:
  - {id: tune, type: deployment-tuning, work: {kind: loop, task: tune.yaml}}
  - {id: check, type: evaluation, work: {sh: "true", verify: [{name: ok, sh: "true"}]}}
edges:
  - {from: tune, to: check, kind: handoff}
""")
    define_graph(workspace, tmp_path / "g.yaml")


def test_loop_node_runs_the_task_loop_inside_the_graph(tmp_path, workspace):
    define_loop_graph(tmp_path, workspace)
    s = run_graph(workspace, "lg", jobs=1)
    assert s.outcome == "completed", s
    kinds = Counter(r.type for r in workspace.ledger.stream("task:lg.tune.a1"))
    assert kinds["TaskDefined"] == 1 and kinds["DeliverableAccepted"] == 1
    ver = [r.event for r in workspace.ledger.stream("task:lg.tune")
           if isinstance(r.event, E.VerificationRecorded)][0]
    assert ver.passed and ver.gates[0].task == "lg.tune.a1"
    # The spec goes to the loop as an object: no YAML copy is written, and the definition's
    # source is the task file itself (its directory is where the evaluator runs).
    assert not (workspace.home / "graphs" / "lg" / "work" / "loops").exists()
    defined = workspace.ledger.stream("task:lg.tune.a1")[0].event
    assert defined.definition["source"] == str((tmp_path / "tune.yaml").resolve())
    assert defined.definition["evaluator"]["argv"] == [sys.executable, f"{tmp_path}/ev.py"]


GOOD_TASK = """id: x
type: deployment-tuning
goal: g
point: {point}
scope: {{engine.continuous_batching: [true]}}
contract: {{gates: [{{name: stability, repeats: 2, max_cv: 0.1, max_failed_requests: 0}}]}}
evaluator: {{kind: command, argv: [x]}}
"""


@pytest.mark.parametrize(("task_yaml", "says"), [
    ("- not a mapping\n", "tune.yaml is not a mapping"),
    (GOOD_TASK.format(point="nowhere.yaml"), "nowhere.yaml"),
    (GOOD_TASK.format(point=REPO / "examples/points/tiny-cpu.yaml").replace(
        "deployment-tuning", "no-such-type"), "tune.yaml:2: type"),
    ("id: x\nid: y\n", "tune.yaml:2"),
])
def test_a_bad_loop_task_rejects_the_node_with_one_line(tmp_path, workspace, task_yaml, says):
    (tmp_path / "tune.yaml").write_text(task_yaml)
    (tmp_path / "g.yaml").write_text(
        "name: bad\nnodes:\n  - {id: tune, type: deployment-tuning, "
        "work: {kind: loop, task: tune.yaml}}\n")
    define_graph(workspace, tmp_path / "g.yaml")
    s = run_graph(workspace, "bad", jobs=1, max_respawns=0)
    assert s.outcome == "completed" and s.counts.get("rejected") == 1, s
    rejected = [r.event for r in workspace.ledger.stream(graph_stream("bad"))
                if isinstance(r.event, E.NodeRejected)]
    reason = rejected[0].reason
    assert reason.startswith("node tune: loop task ") and says in reason, reason
    assert "\n" not in reason
