"""A task's `verification:` path is run, in order, at every block's verification: the loop's
phases (baseline, measure, gates, decide) and command steps, each recorded with its outcome in
the VerificationRecorded; the first step that does not pass fails the verification and the
steps after it are recorded not-run. Automatic loop, manual path, a timeout, a crash while
steps run, the input checks and older ledgers.

The evaluator is tests/harness/loop/test_loop.py's script (b1 baseline, b2 rejected, b3 rejected, b4
delivered when only the gates judge)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    accept,
    handoff_block,
    record_measurement,
    start_block,
    verify_block,
)
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.loop.verify import verify
from infer_forge.harness.task import LOOP_ACTOR, load_task_from_ledger
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.codec import decode
from infer_forge.ledger.ids import LEDGER_CONTEXT
from infer_forge.ledger.replay import replay_task
from infer_forge.ledger.specs import SpecError, TaskDefinition, load_spec
from infer_forge.ledger.state import view
from infer_forge.ledger.store import Append, task_stream
from infer_forge.ledger.task import Task, apply
from infer_forge.projections.memory import task_memory
from infer_forge.wiki.build import build as build_wiki

from tests.conftest import FORGE, REPO, run_forge
from tests.helpers.sandboxed import processes_naming, still_alive

from .test_loop import make_task_dir

PY = json.dumps(sys.executable)
# A command step that logs "<block> <name>" to steps.log (in the task's scratch directory: the
# task file's directory, where steps run, is read-only in the sandbox) and exits with CODE.
LOG_STEP = ("{{name: {name}, argv: [{py}, -c, \"import os,sys; open(os.environ['FORGE_SCRATCH']"
            " + '/steps.log','a').write("
            "os.environ['FORGE_BLOCK_ID'] + ' {name}\\\\n'); print('step {name} ok'); "
            "sys.exit({code})\"]}}")


def step(name: str, code: int = 0) -> str:
    return LOG_STEP.format(name=name, py=PY, code=code)


def with_path(path: Path, entries: list[str]) -> Path:
    path.write_text(path.read_text() + f"verification: [{', '.join(entries)}]\n")
    return path


def log_lines(home: Path, task_id: str = "t1") -> list[str]:
    log = home / "scratch" / task_id / "steps.log"
    return log.read_text().splitlines() if log.exists() else []


def verifications(ws, task_id: str = "t1") -> list[E.VerificationRecorded]:
    return [r.event for r in ws.ledger.stream(task_stream(task_id))
            if isinstance(r.event, E.VerificationRecorded)]


def outcomes(ev: E.VerificationRecorded) -> list[tuple[str, str]]:
    return [(s.name, s.outcome) for s in ev.steps]



def measured_baseline(workspace, path) -> None:
    """Define task t1 from `path`, start its baseline block and record three good runs."""
    define_task(workspace, path)
    start_block(workspace, "t1", "baseline")
    for x in (100, 101, 99):
        record_measurement(workspace, "t1", {"output_throughput": x, "median_ttft_ms": 100,
                                             "token_match": 1.0, "failed": 0})

def test_every_step_passes_each_recorded_in_order(workspace, tmp_path):
    path = with_path(make_task_dir(tmp_path / "s"),
                     ["baseline", "measure", step("one"), "gates", step("two"), "decide"])
    define_task(workspace, path)
    result = run_task(workspace, "t1")
    assert result.exit_state == "delivered"
    vers = verifications(workspace)
    assert [v.block_id for v in vers] == ["b1", "b2", "b3", "b4"]
    # b4 passes every step; b2 and b3 fail at the gates, so step two never runs for them.
    assert outcomes(vers[3]) == [("baseline", "pass"), ("measure", "pass"), ("one", "pass"),
                                 ("gates", "pass"), ("two", "pass"), ("decide", "deferred")]
    assert vers[3].passed and vers[3].verdict == "pass"
    assert outcomes(vers[1])[3:] == [("gates", "fail"), ("two", "not-run"),
                                     ("decide", "deferred")]
    assert log_lines(workspace.home) == ["b1 one", "b1 two", "b2 one", "b3 one", "b4 one", "b4 two"]
    # Each command step is a recorded tool call of its block, named in the step's result,
    # its output kept as an artifact and its tail in the result.
    tools = {str(r.event.event_id): r.event for r in workspace.ledger.stream(task_stream("t1"))
             if isinstance(r.event, E.ToolInvoked) and r.event.tool.startswith("verify:")}
    two = vers[3].steps[4]
    assert two.kind == "command" and two.exit_code == 0 and two.output_tail == "step two ok"
    tool = tools[two.tool_event_id]
    assert (tool.tool, tool.block_id, tool.exit_code) == ("verify:two", "b4", 0)
    assert tool.cwd == str(path.parent.resolve())
    assert workspace.artifacts.text(tool.stdout_digest) == "step two ok\n"
    assert two.tool_event_id in vers[3].evidence
    assert len(tools) == 6
    # Task Memory, replay and the CLI show the path.
    mem = task_memory(workspace.ledger, "t1")
    assert [s["outcome"] for s in mem.execution_record[3].verification["steps"]] == \
        ["pass", "pass", "pass", "pass", "pass", "deferred"]
    state = replay_task(workspace.ledger, "t1")
    assert state.blocks[1].steps[3] == {"name": "gates", "outcome": "fail"}
    # Replay's fast path reads the stored steps as they are and folds them as the full
    # decode does.
    rows = workspace.ledger.stream_rows(task_stream("t1"))
    assert all(codec.load_current(topic, raw) is not None for _p, _v, topic, raw in rows
               if topic == "VerificationRecorded")
    full = Task()
    for _p, version, topic, raw in rows:
        apply(full, codec.decode(task_stream("t1"), version, topic, raw))
    full.last_position = rows[-1][0]
    assert view(full).model_dump() == state.model_dump()
    shown = run_forge("replay", "t1", home=workspace.home)
    assert "steps: baseline pass, measure pass, one pass, gates pass, two pass, decide " \
        "deferred" in shown.stdout


def test_a_failing_step_fails_the_verification_and_stops_the_rest(workspace, tmp_path):
    path = with_path(make_task_dir(tmp_path / "s"),
                     ["measure", step("first"), step("broken", 3), step("after"), "gates",
                      "decide"])
    define_task(workspace, path)
    result = run_task(workspace, "t1")
    mem = task_memory(workspace.ledger, "t1")
    assert result.exit_state != "delivered" and not mem.accepted
    for v in verifications(workspace):
        assert (v.passed, v.verdict) == (False, "fail")
        assert outcomes(v) == [("measure", "pass"), ("first", "pass"), ("broken", "fail"),
                               ("after", "not-run"), ("gates", "not-run"),
                               ("decide", "deferred")]
        assert v.steps[2].detail == "exit 3" and v.steps[2].exit_code == 3
        assert v.steps[3].detail == "not run: step broken fail"
        assert v.gates == []  # the gates were not judged
    # `after` never ran, in any block; the others once per block.
    blocks = [b.block_id for b in mem.execution_record if b.measurements]
    assert log_lines(workspace.home) == [f"{b} {n}" for b in blocks for n in ("first", "broken")]
    # The candidates are rejected naming the failing step.
    assert mem.rejected and all("step broken fail: exit 3" in r["reason"]
                                for r in mem.rejected)


def test_a_step_that_times_out_fails_and_its_whole_group_is_killed(workspace, tmp_path):
    # The shell's child would keep the output pipes open: only a group kill ends the step.
    slow = ("{name: slow, sh: 'sleep 60 & sleep 60; echo never', timeout_s: 0.5}")
    path = with_path(make_task_dir(tmp_path / "s", executor="{kind: manual}"),
                     ["measure", slow, "gates"])
    measured_baseline(workspace, path)
    t0 = time.monotonic()
    info = verify_block(workspace, "t1")
    assert time.monotonic() - t0 < 20
    assert info["verdict"] == "fail"
    slow_res = info["steps"][1]
    assert (slow_res["outcome"], slow_res["detail"]) == ("fail", "timed out after 0.5s")
    assert slow_res["exit_code"] is not None  # killed, so a signal's code
    assert info["steps"][2]["outcome"] == "not-run"
    assert "slow fail: timed out after 0.5s" in info["reason"]


def test_manual_path_runs_the_steps_and_a_failed_one_blocks_acceptance(workspace, tmp_path):
    path = with_path(make_task_dir(tmp_path / "s", executor="{kind: manual}"),
                     ["baseline", "measure", "gates",
                      "{name: check, sh: 'test \"$FORGE_BLOCK_ID\" = b1'}", "decide"])
    measured_baseline(workspace, path)
    info = verify_block(workspace, "t1")
    assert info["verdict"] == "pass"
    assert [(s["name"], s["outcome"]) for s in info["steps"]] == [
        ("baseline", "pass"), ("measure", "pass"), ("gates", "pass"), ("check", "pass"),
        ("decide", "deferred")]
    handoff_block(workspace, "t1", state_reached="baseline")
    # b2 passes the gates (throughput x1.3) but its step fails: no acceptance.
    start_block(workspace, "t1", "cb", {"engine.continuous_batching": True})
    for x in (130, 131, 129):
        record_measurement(workspace, "t1", {"output_throughput": x, "median_ttft_ms": 100,
                                             "token_match": 1.0, "failed": 0})
    p = run_forge("block", "verify", "t1", home=workspace.home)
    assert p.returncode == 0, p.stderr
    assert "t1/b2: fail" in p.stdout and "step check" in p.stdout
    v = verifications(workspace)[-1]
    assert v.actor.kind == "human" and outcomes(v)[2:4] == [("gates", "pass"),
                                                            ("check", "fail")]
    with pytest.raises(Exception, match="acceptance needs pass"):
        accept(workspace, "t1")


def test_inconclusive_gates_stop_the_path_and_make_the_verdict(workspace, tmp_path):
    path = with_path(make_task_dir(tmp_path / "s", executor="{kind: manual}"),
                     ["measure", "gates", step("after"), "decide"])
    define_task(workspace, path)
    start_block(workspace, "t1", "baseline")
    for ttft in (100, 900, 450):  # the TTFT interval straddles the 500 ms SLO
        record_measurement(workspace, "t1", {"output_throughput": 100, "median_ttft_ms": ttft,
                                             "token_match": 1.0, "failed": 0})
    info = verify_block(workspace, "t1")
    assert info["verdict"] == "inconclusive"
    assert [(s["name"], s["outcome"]) for s in info["steps"]] == [
        ("measure", "pass"), ("gates", "inconclusive"), ("after", "not-run"),
        ("decide", "deferred")]
    assert info["steps"][1]["detail"] == "ttft-slo inconclusive"
    assert info["reason"].startswith("gates inconclusive: ttft-slo inconclusive: ")
    assert log_lines(workspace.home) == []


def test_command_step_output_is_redacted(workspace, tmp_path, monkeypatch):
    secret = "sk-verif1cation-Zq9x7Lm2Wp4Rt6Yu8Io0"
    monkeypatch.setenv("MY_API_KEY", secret)
    path = with_path(make_task_dir(tmp_path / "s", executor="{kind: manual}"),
                     ["measure", "gates", "{name: leak, sh: 'echo key=$MY_API_KEY; exit 1'}"])
    measured_baseline(workspace, path)
    info = verify_block(workspace, "t1")
    leak = info["steps"][2]
    assert leak["outcome"] == "fail" and leak["output_tail"].startswith("key=")
    assert secret not in leak["output_tail"]
    raw = (workspace.home / "ledger.sqlite").read_bytes()
    assert secret.encode() not in raw
    tool = next(r.event for r in workspace.ledger.stream(task_stream("t1"))
                if isinstance(r.event, E.ToolInvoked))
    assert secret not in workspace.artifacts.text(tool.stdout_digest)


def _comparable(ws) -> list[dict]:
    """The task's events without what differs between two runs (ids, times, durations)."""
    out = []
    for r in ws.ledger.stream(task_stream("t1")):
        d = r.event.model_dump(mode="json", exclude={
            "event_id", "occurred_at", "evidence", "verification_event_id", "duration_s",
            "env_digest", "causation_id", "repo_digest", "actor", "stdout_digest",
            "sandbox"})
        for s in d.get("steps", []):
            s.pop("duration_s"), s.pop("tool_event_id")
        if "meta" in d:
            d["meta"] = {k: v for k, v in d["meta"].items() if k != "duration_s"}
        out.append({"type": r.type, **d})
    return out


def test_kill_9_while_a_step_runs_then_resume(tmp_path):
    """A verification is one save: killed while its second step runs, nothing of it is
    recorded; the resumed loop runs the path again from its first step (so `first` runs twice
    for that block, by design) and the history equals an uninterrupted run's."""
    from infer_forge.ledger.workspace import init_workspace

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    flag = tmp_path / "home" / "scratch" / "t1" / "block-once"  # the step may remove it
    # `wait` blocks on the FIFO once, in b2, after removing the flag: the resumed run passes.
    wait = ("{name: wait, sh: 'echo \"$FORGE_BLOCK_ID wait\" >> $FORGE_SCRATCH/steps.log; "
            f"if [ \"$FORGE_BLOCK_ID\" = b2 ] && rm {flag} 2>/dev/null; then "
            "echo $$ > $FORGE_SCRATCH/wait.pid; cat " + str(fifo) + "; fi'}")
    path = with_path(make_task_dir(tmp_path / "s"),
                     ["baseline", "measure", step("first"), wait, "gates", "decide"])
    ref_ws, _ = init_workspace(tmp_path / "ref")
    with ref_ws:
        define_task(ref_ws, path)
        assert run_task(ref_ws, "t1").exit_state == "delivered"
        ref = _comparable(ref_ws)
    flag.parent.mkdir(parents=True)
    flag.touch()
    ws, _ = init_workspace(tmp_path / "home")
    define_task(ws, path)
    env = {**os.environ, "FORGE_HOME": str(ws.home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*FORGE, "task", "run", "t1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
                            start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "verify b2: step wait" in line:
            break
    pidfile = ws.home / "scratch" / "t1" / "wait.pid"
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text().strip():  # the step is blocked
        assert time.monotonic() < deadline, "the wait step never started"
        time.sleep(0.02)
    # The step's processes, seen from the host (inside its sandbox, `$$` is the pid
    # namespace's): its shell and the shell's `cat`, under the sandbox and its own session.
    running = processes_naming(str(fifo))
    assert len(running) >= 2, running
    assert all(os.getpgid(p) != os.getpgid(proc.pid) for p in running)  # not the loop's group
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    # The step dies with the loop, its children too (the session's leader kills the group).
    deadline = time.monotonic() + 30
    while still_alive(running):
        assert time.monotonic() < deadline, \
            f"the step's processes outlived the killed loop: {still_alive(running)}"
        time.sleep(0.02)
    types = [r.type for r in ws.ledger.stream(task_stream("t1"))]
    assert types.count("VerificationRecorded") == 1  # b1's only; b2's was never saved
    assert types[-1] == "MeasurementRecorded"
    p = run_forge("task", "resume", "t1", home=ws.home)
    assert p.returncode == 0 and "delivered" in p.stdout, p.stderr
    assert _comparable(ws) == ref
    log = log_lines(ws.home)
    assert log.count("b2 first") == 2 and log.count("b2 wait") == 2  # ran again, once
    assert all(log.count(f"{b} first") == 1 for b in ("b1", "b3", "b4"))
    ws.close()


# --- the input checks and older ledgers ----------------------------------------------------


@pytest.mark.parametrize("entries, problem", [
    (["baseline", "check the dashboards", "gates"], "'check the dashboards' is not a loop "
                                                     "phase"),
    (["baseline", "measure"], "must name `gates`"),
    (["gates", "{name: a, sh: 'true'}", "{name: a, argv: [ls]}"], "duplicate"),
    (["gates", "{name: a}"], "give exactly one of argv, sh"),
    (["gates", "{name: a, sh: x, argv: [y]}"], "give exactly one of argv, sh"),
    (["gates", "{name: a, argv: []}"], "argv is empty"),
    (["gates", "{name: 'Bad name', sh: x}"], "not a valid id"),
    (["gates", "{name: decide, sh: x}"], "is a loop phase"),
    (["gates", "{name: a, sh: x, timeout_s: 0}"], "greater than 0"),
    (["gates", "{name: a, sh: x, retries: 2}"], "Extra inputs"),
])
def test_a_bad_path_is_one_line_and_nothing_is_recorded(tmp_path, forge_home, entries,
                                                         problem):
    path = with_path(make_task_dir(tmp_path / "s"), entries)
    with pytest.raises(SpecError, match="verification") as e:
        load_spec(path, "task")
    assert problem in str(e.value) and str(path) in str(e.value)
    assert run_forge("init").returncode == 0
    p = run_forge("task", "new", str(path))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert problem in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert run_forge("task", "list", "--json").stdout.strip() in ("[]", "")


def test_an_older_ledger_path_runs_what_it_can_and_fails_unknown_text(workspace, tmp_path):
    """A definition read from a ledger is not input-checked: text that is no step fails (a
    check that cannot be run is not passed) and a path without `gates` gets it at its end."""
    path = make_task_dir(tmp_path / "s", executor="{kind: manual}")
    measured_baseline(workspace, path)
    lt = load_task_from_ledger(workspace, "t1")
    mem = task_memory(workspace.ledger, "t1")
    blk = mem.current_block
    common = {"task_id": "t1", "block_id": blk.block_id, "actor": LOOP_ACTOR}
    text = "**look** at <b>the</b> [graphs](http://x.example)"
    for legacy, expect in [
        (["measure"], [("measure", "pass"), ("gates", "pass")]),
        (["baseline", text], [("baseline", "pass"), (text, "fail"), ("gates", "not-run")]),
    ]:
        old = TaskDefinition.model_validate(
            {**lt.task.model_dump(mode="json"), "verification": legacy},
            context=LEDGER_CONTEXT)
        ver = verify(workspace, dataclasses.replace(lt, task=old), blk, mem, common)
        assert outcomes(ver.event) == expect
        if len(expect) == 3:
            assert ver.verdict == "fail" and ver.event.gates == []
            assert f"{text} fail: forge cannot run this step" in ver.reason()
        else:  # the baseline: no relative gate
            assert ver.verdict == "pass" and len(ver.event.gates) == 3
    # Recorded, the wiki's task page lists the steps, the text as typed (no markup, no link).
    workspace.ledger.save(Append(task_stream("t1"), ver.events))
    build_wiki(workspace, embeddings=False)
    html = (workspace.home / "site" / "tasks" / "t1.html").read_text()
    assert "Verification steps" in html and "forge cannot run this step" in html
    assert "**look** at &lt;b&gt;the&lt;/b&gt; &#91;graphs&#93;(http://x.example)" in html
    assert "<b>" not in html and "http://x.example\"" not in html


def test_a_verification_stored_before_steps_reads_back_with_none():
    """v1 of VerificationRecorded had no steps: its upcaster gives `steps=[]`."""
    payload = {"event_id": "3f1c7c7e-0a0e-4b8e-9d55-2f5d0f4b1a11",
               "occurred_at": "2025-01-01T00:00:00+00:00",
               "actor": {"kind": "tool", "name": "forge-loop", "model": None},
               "task_id": "t1", "block_id": "b1", "command_id": "t1:b1:verify",
               "causation_id": None, "input_digests": {}, "contract_hash": "sha256:x",
               "point_hash": None, "candidate": {}, "passed": True, "verdict": "pass",
               "gates": [{"name": "ttft", "kind": "absolute", "verdict": "pass",
                          "reason": "ok", "n": 3}],
               "evidence": [], "_v": 1}
    ev = decode("task-t1", 3, "VerificationRecorded",
                json.dumps(payload).encode())
    assert isinstance(ev, E.VerificationRecorded) and ev.steps == []
    assert ev.gates[0].name == "ttft"
