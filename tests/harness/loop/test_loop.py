"""Task loop: a full run, the state machine's invariants, exits and anti-spin.

The evaluator is a real subprocess (a small script) whose metrics are a deterministic function
of the candidate: continuous batching multiplies throughput by 1.3, eager attention by 1.02;
continuous batching with sdpa breaks the TTFT SLO. So the grid sweep goes
b1 baseline → b2 eager (too small a gain: rejected) → b3 cb+sdpa (TTFT: rejected) →
b4 cb+eager (passes: delivered).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    accept,
    exit_task,
    handoff_block,
    record_measurement,
    run_command,
    start_block,
    verify_block,
)
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import events as E
from infer_forge.ledger.store import Append
from infer_forge.ledger.streams import task_stream
from infer_forge.projections.memory import task_memory

from tests.conftest import REPO, run_forge

EVAL_SCRIPT = r'''
import json, os, sys
cand = json.load(sys.stdin)
r = int(os.environ.get("FORGE_REPEAT", "0"))
log = os.environ.get("EVAL_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps(cand, sort_keys=True) + "\n")
block_on = os.environ.get("EVAL_BLOCK_FIFO")
if block_on and cand.get("engine.continuous_batching") and r == 1:
    print("blocking on fifo", file=sys.stderr, flush=True)
    open(block_on).read()          # blocks until a writer comes: the test kills us first
cb = cand.get("engine.continuous_batching", False)
eager = cand.get("engine.attn_implementation", "sdpa") == "eager"
mode = os.environ.get("EVAL_MODE", "")
jitter = (1.0, 1.01, 0.99)[r % 3]
if mode == "noisy":
    jitter = (1.0, 1.5, 0.6)[r % 3]
if mode == "fail-baseline" and not cand:
    sys.exit(3)
tput = 100.0 * (1.02 if eager else 1.0) * (1.3 if cb else 1.0) * jitter
ttft = 100.0 * (9 if cb and not eager else 1)
print("warming up")
print(json.dumps({"output_throughput": tput, "median_ttft_ms": ttft, "token_match": 1.0,
                  "completed": 64, "failed": 0}))
'''

TASK_YAML = """\
id: {task_id}
type: deployment-tuning
goal: Raise output throughput without breaking the TTFT SLO or the outputs
point: ../points/tiny-cpu.yaml
scope:
  engine.continuous_batching: [false, true]
  engine.attn_implementation: [sdpa, eager]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
    - {{name: ttft-slo, metric: median_ttft_ms, at_most: 500}}
    - {{name: correctness, metric: token_match, at_least: 0.99}}
    - {{name: stability, repeats: 3, max_cv: 0.10, max_failed_requests: 0}}
exit: {{max_blocks: {max_blocks}, no_progress_blocks: {no_progress}, when: {when}}}
executor: {executor}
evaluator: {{kind: command, argv: [{python}, evalscript.py]}}
sandbox: {{env: [EVAL_LOG, EVAL_MODE, EVAL_BLOCK_FIFO]}}
"""


def make_task_dir(root: Path, task_id: str = "t1", *, max_blocks: int = 8,
                  no_progress: int = 3, when: str = "all_gates_pass",
                  executor: str = "{kind: sweep}") -> Path:
    """A task dir laid out like examples/: points/, profiles/, tasks/ (with the eval script)."""
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "examples/points/tiny-cpu.yaml", root / "points/tiny-cpu.yaml")
    shutil.copy(REPO / "examples/profiles/tiny-cpu.yaml", root / "profiles/tiny-cpu.yaml")
    (root / "tasks/evalscript.py").write_text(EVAL_SCRIPT)
    path = root / "tasks" / f"{task_id}.yaml"
    path.write_text(TASK_YAML.format(task_id=task_id, max_blocks=max_blocks,
                                     no_progress=no_progress, when=when, executor=executor,
                                     python=json.dumps(sys.executable)))
    return path


def command_executor(script: Path) -> str:
    """The task YAML's executor mapping for a command policy script."""
    return f"{{kind: command, argv: [{json.dumps(sys.executable)}, {json.dumps(str(script))}]}}"


def history(ws, task_id: str) -> list[dict]:
    """The task's events without what legitimately differs between runs (ids, times,
    durations, environment digests)."""
    out = []
    for r in ws.ledger.stream(task_stream(task_id)):
        d = r.event.model_dump(mode="json", exclude={
            "event_id", "occurred_at", "evidence", "verification_event_id", "duration_s",
            "env_digest", "causation_id", "repo_digest", "actor", "sandbox"})
        if "meta" in d:
            d["meta"] = {k: v for k, v in d["meta"].items() if k != "duration_s"}
        out.append({"type": r.type, **d})
    return out


@pytest.fixture
def task_file(tmp_path) -> Path:
    return make_task_dir(tmp_path / "specs")


def test_full_run_delivers_the_passing_candidate(workspace, task_file):
    info = define_task(workspace, task_file)
    assert info["created"] and info["task_id"] == "t1"
    lines: list[str] = []
    result = run_task(workspace, "t1", progress=lines.append)
    assert (result.status, result.exit_state, result.blocks) == ("exited", "delivered", 4)
    mem = task_memory(workspace.ledger, "t1")
    assert [b.decision for b in mem.execution_record] == [None, "rejected", "rejected",
                                                          "accepted"]
    assert mem.accepted[0]["candidate"] == {"engine.continuous_batching": True,
                                            "engine.attn_implementation": "eager"}
    assert "throughput fail" in mem.rejected[0]["reason"] and "1.05" in mem.rejected[0]["reason"]
    assert "ttft-slo fail" in mem.rejected[1]["reason"]
    # Every block records routing, even though the sweep is not a model.
    assert all(b.routing == {"executor": "sweep", "model_tier": "none",
                             "agent_topology": "single"} for b in mem.execution_record)
    # Each evaluator run is a tool call with its stdout kept as an artifact.
    b1 = mem.execution_record[0]
    assert len(b1.tool_calls) == 3 and len(b1.measurements) == 3
    ev = next(r.event for r in workspace.ledger.stream(task_stream("t1"))
              if isinstance(r.event, E.ToolInvoked))
    assert ev.exit_code == 0 and "warming up" in workspace.artifacts.text(ev.stdout_digest)
    # One step per save: every step's command id is deterministic.
    assert workspace.ledger.command_done("t1:b4:verify")
    assert "saved b4:handoff (DeliverableAccepted, LoopBlockHandedOff)" in lines
    # Running again does nothing: the task has exited.
    before = workspace.ledger.version(task_stream("t1"))
    assert run_task(workspace, "t1").exit_state == "delivered"
    assert workspace.ledger.version(task_stream("t1")) == before


def test_task_new_is_idempotent_and_pins_point_and_profile(workspace, task_file):
    a = define_task(workspace, task_file)
    b = define_task(workspace, task_file)
    assert a["definition_hash"] == b["definition_hash"] and not b["created"]
    types = [r.type for r in workspace.ledger.stream("workspace")]
    assert types.count("DeploymentPointPinned") == 1
    assert types.count("RuntimeProfileRevised") == 1
    task_file.write_text(task_file.read_text().replace("no_progress_blocks: 3",
                                                       "no_progress_blocks: 4"))
    with pytest.raises(HarnessError, match="already defined with other content"):
        define_task(workspace, task_file)


def test_no_measurement_or_tool_call_outside_a_block(workspace, task_file):
    define_task(workspace, task_file)
    v = workspace.ledger.version(task_stream("t1"))
    with pytest.raises(HarnessError, match="no open loop block"):
        record_measurement(workspace, "t1", {"output_throughput": 1.0})
    with pytest.raises(HarnessError, match="no open loop block"):
        run_command(workspace, "t1", ["true"], tee=False)
    with pytest.raises(HarnessError, match="no open loop block"):
        handoff_block(workspace, "t1", state_reached="x")
    assert workspace.ledger.version(task_stream("t1")) == v
    # Through the CLI too: non-zero exit, nothing recorded.
    p = run_forge("measure", "t1", "--metric", "output_throughput=5")
    assert p.returncode != 0 and "no open loop block" in p.stderr
    assert workspace.ledger.version(task_stream("t1")) == v


def _manual_block(ws, cand, values):
    start_block(ws, "t1", "manual try", cand)
    for x in values:
        record_measurement(ws, "t1", {"output_throughput": x, "median_ttft_ms": 100,
                                      "token_match": 1.0, "failed": 0})
    return verify_block(ws, "t1")


def test_acceptance_needs_a_passing_verification_of_the_same_contract_and_point(
        workspace, task_file):
    define_task(workspace, task_file)
    _manual_block(workspace, {}, [100, 101, 99])
    handoff_block(workspace, "t1", state_reached="baseline")
    # A failing candidate cannot be accepted.
    v = _manual_block(workspace, {"engine.attn_implementation": "eager"}, [101, 102, 100])
    assert v["verdict"] == "fail"
    with pytest.raises(HarnessError, match="acceptance needs pass"):
        accept(workspace, "t1")
    handoff_block(workspace, "t1", state_reached="too small", outcome="no-progress")
    # No verification at all: refused.
    start_block(workspace, "t1", "try cb", {"engine.continuous_batching": True})
    with pytest.raises(HarnessError, match="has no verification"):
        accept(workspace, "t1")
    for x in (130, 131, 129):
        record_measurement(workspace, "t1", {"output_throughput": x, "median_ttft_ms": 100,
                                             "token_match": 1.0, "failed": 0})
    # A passing verification of another contract (or on another point) is not enough.
    ver = workspace.ledger.version(task_stream("t1"))
    workspace.ledger.append(task_stream("t1"), [E.VerificationRecorded(
        contract_hash="sha256:" + "0" * 64, point_hash=None, passed=True, verdict="pass",
        candidate={"engine.continuous_batching": True}, task_id="t1", block_id="b3")],
        expected_version=ver)
    with pytest.raises(HarnessError, match="verified against contract"):
        accept(workspace, "t1")
    assert verify_block(workspace, "t1")["verdict"] == "pass"
    accept(workspace, "t1", summary="cb wins")
    assert task_memory(workspace.ledger, "t1").accepted[0]["block_id"] == "b3"


def test_exit_needs_its_criteria(workspace, task_file):
    define_task(workspace, task_file)
    with pytest.raises(HarnessError, match="needs an accepted deliverable"):
        exit_task(workspace, "t1", "delivered", "done")
    with pytest.raises(HarnessError, match="needs --handoff"):
        exit_task(workspace, "t1", "follow-up-handoff", "later")
    with pytest.raises(HarnessError, match="budget not spent"):
        exit_task(workspace, "t1", "failed-budget", "tired")
    with pytest.raises(HarnessError, match="no-progress blocks"):
        exit_task(workspace, "t1", "failed-no-progress", "stuck")
    assert task_memory(workspace.ledger, "t1").status == "defined"
    exit_task(workspace, "t1", "follow-up-handoff", "later", handoff="try fp8 next")
    mem = task_memory(workspace.ledger, "t1")
    assert (mem.status, mem.exit_state) == ("exited", "follow-up-handoff")
    with pytest.raises(HarnessError, match="has exited"):
        start_block(workspace, "t1", "more")


def test_a_tried_candidate_is_not_run_again_and_no_progress_ends_the_loop(
        workspace, tmp_path, monkeypatch):
    # A command policy that keeps proposing the same candidate.
    policy = tmp_path / "policy.py"
    policy.write_text("import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'action': "
                      "'try', 'candidate': {'engine.attn_implementation': 'eager'}, "
                      "'model': 'test-model'}))\n")
    path = make_task_dir(tmp_path / "specs", executor=command_executor(policy), no_progress=2)
    log = workspace.home / "scratch" / "t1" / "eval.log"  # where the task's calls may write
    monkeypatch.setenv("EVAL_LOG", str(log))
    define_task(workspace, path)
    r = run_task(workspace, "t1")
    assert r.exit_state == "failed-no-progress"
    mem = task_memory(workspace.ledger, "t1")
    # b1 baseline, b2 eager (measured, rejected, but a new best: progress), b3 and b4 eager
    # again: not run, no progress twice → exit.
    assert len(mem.execution_record) == 4
    assert mem.execution_record[1].handoff["outcome"] == "progress"
    for b in mem.execution_record[2:]:
        assert "already tried in block b2" in b.handoff["findings"][0]
        assert not b.measurements and b.handoff["outcome"] == "no-progress"
    assert log.read_text().count("eager") == 3  # only b2's three repeats ran it
    # The policy's call is a tool call of the block it started, and routing says command.
    assert mem.execution_record[1].tool_calls[0]["tool"] == "executor"
    assert mem.execution_record[1].routing["executor"] == "command"


def test_block_budget_exit_and_scope_exhausted_handoff(workspace, tmp_path):
    path = make_task_dir(tmp_path / "a", "budget", max_blocks=2)
    define_task(workspace, path)
    r = run_task(workspace, "budget")
    assert (r.exit_state, r.blocks) == ("failed-budget", 2)
    assert "2 of 2 blocks" in r.exit_reason
    # best_in_scope explores everything, then delivers the best passing candidate.
    path = make_task_dir(tmp_path / "b", "best", when="best_in_scope", no_progress=5)
    define_task(workspace, path)
    r = run_task(workspace, "best")
    assert (r.exit_state, r.blocks) == ("delivered", 4)
    assert r.memory.accepted[0]["block_id"] == "b4"


def test_unstable_or_failing_baseline_ends_the_task(workspace, tmp_path, monkeypatch):
    monkeypatch.setenv("EVAL_MODE", "noisy")
    define_task(workspace, make_task_dir(tmp_path / "n", "noisy"))
    r = run_task(workspace, "noisy")
    assert r.exit_state == "failed-unverifiable" and "CV" in r.exit_reason
    monkeypatch.setenv("EVAL_MODE", "fail-baseline")
    define_task(workspace, make_task_dir(tmp_path / "f", "failing"))
    r = run_task(workspace, "failing")
    assert r.exit_state == "failed-blocked" and "exited 3" in r.exit_reason


def test_missing_evaluator_executable_is_failed_blocked(workspace, tmp_path):
    path = make_task_dir(tmp_path / "m", "missing")
    path.write_text(path.read_text().replace(json.dumps(sys.executable),
                                             "/nonexistent/python"))
    define_task(workspace, path)
    r = run_task(workspace, "missing")
    assert r.exit_state == "failed-blocked" and "not found" in r.exit_reason


def test_manual_task_driven_through_the_cli(forge_home, tmp_path):
    path = make_task_dir(tmp_path / "s", "man", executor="{kind: manual}")
    assert run_forge("init").returncode == 0
    assert run_forge("task", "new", str(path)).returncode == 0
    p = run_forge("task", "run", "man")
    assert p.returncode == 0 and "waiting" in p.stdout
    assert run_forge("block", "start", "man", "--sub-goal", "baseline").returncode == 0
    p = run_forge("run", "--task", "man", "--json", "--", sys.executable, "-c",
                  "print('hello tool'); raise SystemExit(4)")
    assert p.returncode == 4 and json.loads(p.stdout)["exit_code"] == 4
    assert run_forge("measure", "man", "--metric", "output_throughput=100",
                     "--metric", "median_ttft_ms=90", "--metric", "token_match=1",
                     "--metric", "failed=0").returncode == 0
    from infer_forge.ledger.workspace import open_workspace

    with open_workspace(forge_home) as ws:  # the other two repeats in-process (faster)
        for x in (101, 99):
            record_measurement(ws, "man", {"output_throughput": x, "median_ttft_ms": 90,
                                           "token_match": 1, "failed": 0})
    p = run_forge("block", "verify", "man", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["verdict"] == "pass"
    assert run_forge("block", "handoff", "man", "--state-reached", "baseline 100 tok/s",
                     "--next", "try cb").returncode == 0
    p = run_forge("task", "memory", "man", "--json")
    mem = json.loads(p.stdout)
    assert mem["last_handoff"]["next_sub_goal"] == "try cb"
    assert mem["execution_record"][0]["tool_calls"][0]["exit_code"] == 4
    assert mem["execution_record"][0]["routing"]["model_tier"] == "human"
    p = run_forge("block", "start", "man", "--sub-goal", "x", "--set", "engine.dtype=float16")
    assert p.returncode != 0 and "out of scope" in p.stderr
    p = run_forge("task", "exit", "man", "--state", "aborted-by-human", "--reason", "demo")
    assert p.returncode == 0
    p = run_forge("task", "list", "--json")
    assert json.loads(p.stdout)[0]["exit_state"] == "aborted-by-human"


def test_save_conflict_is_reported(workspace, task_file):
    define_task(workspace, task_file)
    start_block(workspace, "t1", "baseline")
    # A second writer moved the stream: a step computed on the old version is refused.
    from infer_forge.harness.loop.steps import Stepper
    from infer_forge.harness.task import load_task_from_ledger

    lt = load_task_from_ledger(workspace, "t1")
    workspace.ledger.save(Append(task_stream("t1"), [E.LoopBlockHandedOff(
        state_reached="x", task_id="t1", block_id="b1")]))
    st = Stepper(workspace, lt, lambda s: None)
    with pytest.raises(HarnessError, match="changed while step"):
        st.save("b1:measure", [E.LoopBlockHandedOff(state_reached="y", task_id="t1",
                                                    block_id="b1")], version=2)


def test_run_task_file_for_graph_nodes(workspace, task_file):
    from infer_forge.harness.loop.run import run_task_file

    r = run_task_file(workspace, task_file, task_id="node-a")
    assert (r.task_id, r.exit_state) == ("node-a", "delivered")
    # A caller's wall cap that is already spent ends the loop before another block.
    r = run_task_file(workspace, task_file, task_id="node-b", max_wall_s=1e-9)
    assert (r.exit_state, r.blocks) == ("failed-budget", 1)
    assert "wall-time budget spent" in r.exit_reason


def test_best_in_scope_delivers_a_contender_when_the_budget_runs_out(workspace, tmp_path):
    # Grid order: b2 eager (fails), b3 cb+sdpa (fails), b4 cb+eager (passes) = 4 blocks.
    path = make_task_dir(tmp_path / "c", "cap", when="best_in_scope", max_blocks=4,
                         no_progress=5)
    define_task(workspace, path)
    r = run_task(workspace, "cap")
    assert (r.exit_state, r.blocks) == ("delivered", 4)
    assert "block budget spent" in r.exit_reason
