"""Sizes of what comes from outside (issue 27 item 7): a tool call's output is streamed, kept
capped with the size and digest of the whole, and the call recorded; a refused agent call's
huge arguments are stored capped; oversized handoff findings are refused with one line."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import tracemalloc

import pytest
from infer_forge.harness.agents import tool_registry as T
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import handoff_block, start_block
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.harness.tool_calls import calls
from infer_forge.ledger import events as E
from infer_forge.ledger.sizes import capped, capped_json, tail
from infer_forge.ledger.streams import AGENTS_STREAM, task_stream
from infer_forge.projections.memory import task_memory

from tests.conftest import run_forge

from ..harness.loop.test_loop import make_task_dir

AGENT = E.Actor.agent("claude-code", "m1")
LINE = "step 1234: loss 0.1234 tokens per s 4567 ok\n"


def _printer(n: int) -> list[str]:
    """A command printing `n` bytes of LINE repeated, then a last line `done`."""
    return [sys.executable, "-c",
            "import sys\nw = sys.stdout.buffer.write\n"
            f"line = {LINE.encode()!r}\nn = {n}\n"
            "while n > 0:\n    w(line[:n]); n -= len(line)\nw(b'done\\n')\n"]


def _expected(n: int) -> bytes:
    return (LINE.encode() * (n // len(LINE) + 1))[:n] + b"done\n"


def test_capped_marks_the_cut_with_size_and_digest():
    text = "é" * 1000  # 2000 bytes
    out = capped(text, 101)
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert out == "é" * 50 + f"…[truncated: 2000 bytes, sha256:{digest}]"
    assert capped("short", 10) == "short"
    assert capped_json({"a": "x" * 100}, 50) == {"truncated": capped(
        json.dumps({"a": "x" * 100}), 50)}


def test_tail_keeps_the_last_bytes_on_a_character_boundary():
    assert tail("short", 10) == ("short", 0)
    text = "ab" + "é" * 10  # 22 bytes
    assert tail(text, 22) == (text, 0)
    assert tail(text, 6) == ("é" * 3, 16)
    assert tail(text, 5) == ("é" * 2, 18)  # half an "é" is not shown: counted as cut


def test_a_tool_call_printing_more_than_the_caps_is_recorded_truncated_and_digested(
        workspace, tmp_path, monkeypatch):
    monkeypatch.setattr(calls, "KEEP_BYTES", 1000)
    monkeypatch.setattr(calls, "TAIL_BYTES", 100)
    monkeypatch.setattr(calls, "STORE_BYTES", 5000)
    n = 200_000
    whole = _expected(n)
    mark = f"…[truncated: {len(whole)} bytes, sha256:{hashlib.sha256(whole).hexdigest()}]"
    run = calls.run_tool(workspace, _printer(n), cwd=tmp_path)
    assert run.returncode == 0 and run.event.exit_code == 0
    head, cut, tail = run.stdout.partition("\n" + mark + "\n")
    assert cut and head == whole[:1000].decode() and tail.endswith("done\n")
    assert len(tail) <= 100
    stored = workspace.artifacts.get(run.event.stdout_digest)
    assert stored == whole[:5000] + ("\n" + mark + "\n").encode()


def test_a_large_output_streams_without_being_held_in_memory(workspace, tmp_path):
    n = 48 << 20
    tracemalloc.start()
    try:
        run = calls.run_tool(workspace, _printer(n), cwd=tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert run.returncode == 0
    assert peak < 32 << 20, peak  # the old capture held it all (~7x the output at peak)
    whole = _expected(n)
    digest = hashlib.sha256(whole).hexdigest()
    assert f"…[truncated: {len(whole)} bytes, sha256:{digest}]" in run.stdout
    assert run.stdout.endswith("done\n")  # the last line (a policy's answer) is kept
    # The artifact holds all of it (under STORE_BYTES), byte for byte.
    assert run.event.stdout_digest == "sha256:" + digest


def test_an_argument_past_the_kernel_limit_is_recorded_capped(workspace, tmp_path):
    big = "x" * (calls.ARG_BYTES * 3)
    run = calls.run_tool(workspace, ["echo", big], cwd=tmp_path)
    assert run.event.exit_code != 0 or run.event.error  # the kernel refuses it (E2BIG)
    recorded = run.event.argv[1]
    assert len(recorded) < calls.ARG_BYTES + 200
    assert recorded.endswith(f"…[truncated: {len(big)} bytes, "
                             f"sha256:{hashlib.sha256(big.encode()).hexdigest()}]")


def test_a_refused_agent_call_stores_its_huge_arguments_capped(workspace):
    ctx = T.ToolContext(workspace, AGENT, tools=TOOLS)
    huge = "A" * (20 << 20)
    res = T.call(ctx, "no_such_tool", {"payload": huge})
    assert not res.ok
    res2 = T.call(ctx, "task_show", json.dumps({"task_id": 7, "junk": huge})[:-1])  # not JSON
    assert not res2.ok
    evs = [r.event for r in workspace.ledger.stream(AGENTS_STREAM)]
    assert len(evs) == 2 and all(isinstance(e, E.AgentStepFailed) for e in evs)
    for ev in evs:
        stored = json.dumps(ev.model_dump(mode="json"), ensure_ascii=False)
        assert len(stored) < 40_000, len(stored)
        assert "…[truncated: " in stored and "sha256:" in stored


def test_twenty_findings_of_a_megabyte_are_refused_with_one_line(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    start_block(workspace, "t1", "by hand")
    findings = ["f" * (1 << 20)] * 20
    before = workspace.ledger.max_position()
    with pytest.raises(HarnessError, match=r"finding 1 is 1048576 characters \(at most 4000"):
        handoff_block(workspace, "t1", state_reached="done", findings=findings)
    # The agent's tool refuses them before anything runs, and records the refusal capped.
    ctx = T.ToolContext(workspace, AGENT, task_id="t1", tools=TOOLS)
    res = T.call(ctx, "block_handoff", {"task_id": "t1", "state_reached": "done",
                                        "findings": findings})
    assert not res.ok and "\n" not in res.error and "4000" in res.error
    evs = [r.event for r in workspace.ledger.stream(task_stream("t1"))
           if r.position > before]
    assert [e.TYPE for e in evs] == ["AgentStepFailed"]
    assert len(json.dumps(evs[0].model_dump(mode="json"))) < 40_000
    assert task_memory(workspace.ledger, "t1").current_block.handoff is None


def test_forge_block_handoff_refuses_an_oversized_finding(forge_home):
    for args in (("init",), ("task", "new", "examples/tasks/tune-tiny-cpu.yaml"),
                 ("block", "start", "tune-tiny-cpu", "--sub-goal", "x")):
        assert run_forge(*args, home=forge_home).returncode == 0
    res = run_forge("block", "handoff", "tune-tiny-cpu", "--state-reached", "x",
                    "--finding", "ok", "--finding", "g" * 100_000, home=forge_home)
    assert res.returncode != 0
    err = res.stderr.strip()
    assert err == ("Error: task tune-tiny-cpu: handoff refused: finding 2 is 100000 "
                   "characters (at most 4000 each)"), res.stderr


# --- files read from where a call could write: a 6 GB sparse file -----------------------

SPARSE = 6 << 30  # os.truncate: no disk, no read


def _sparse(path):
    path.write_bytes(b"")
    os.truncate(path, SPARSE)
    return path


def test_a_sparse_file_over_the_limit_is_refused_before_it_is_read(workspace, tmp_path):
    from infer_forge.ledger.artifacts import ArtifactTooLargeError

    big = _sparse(tmp_path / "trace.bin")
    t0 = time.monotonic()
    with pytest.raises(ArtifactTooLargeError, match=f"{SPARSE} bytes, over the limit of"):
        workspace.artifacts.put_file(big, limit=1 << 30)
    assert time.monotonic() - t0 < 1.0  # refused from its size, not after reading 6 GB
    assert list(workspace.artifacts.digests()) == []


def test_a_measurement_artifact_of_six_sparse_gigabytes_is_refused(workspace, tmp_path):
    from infer_forge.harness.loop.manual import record_measurement
    from infer_forge.ledger.artifacts import ArtifactTooLargeError

    define_task(workspace, make_task_dir(tmp_path / "specs"))
    start_block(workspace, "t1", "by hand")
    before = workspace.ledger.max_position()
    big = _sparse(tmp_path / "records.jsonl")
    with pytest.raises(ArtifactTooLargeError, match=f"{SPARSE} bytes, over the limit of"):
        record_measurement(workspace, "t1", {"output_throughput": 1.0}, artifact=big)
    assert workspace.ledger.max_position() == before


def test_a_graph_node_deliverable_of_six_sparse_gigabytes_fails_its_check(workspace,
                                                                          tmp_path):
    from infer_forge.harness.graph.commands import define_graph
    from infer_forge.harness.graph.run import run_graph
    from infer_forge.projections.graph import load_graph

    (tmp_path / "make.py").write_text(
        "import os\nopen('big.bin', 'wb').close()\n"
        f"os.truncate('big.bin', {SPARSE})\nprint('{{\"value\": 1}}')\n")
    (tmp_path / "g.yaml").write_text(
        "name: sparse\nnodes:\n  - id: n\n    type: evaluation\n    work:\n"
        "      argv: ['{python}', '{graph_dir}/make.py']\n"
        "      verify:\n        - {name: value, metric: value, at_least: 1}\n"
        "      deliverables: [big.bin]\n")
    define_graph(workspace, tmp_path / "g.yaml")
    run_graph(workspace, "sparse")
    [node] = load_graph(workspace.ledger, "sparse").tasks()
    assert not node.verified
    checks = [g for r in workspace.ledger.stream("graph:sparse")
              for g in getattr(r.event, "checks", []) or []]
    [check] = [c for c in checks if c.name == "deliverables"]
    assert "big.bin: " in check.reason and f"{SPARSE} bytes, over the limit" in check.reason


def test_capped_arguments_is_the_one_rule_for_a_failed_steps_arguments():
    # record_failure and the agent executor's failed steps both record through it.
    huge = {"candidate": {"engine.x": "y" * (1 << 20)}}
    got = T.capped_arguments(huge)
    assert set(got) == {"truncated"} and len(got["truncated"]) < T.ARGS_BYTES + 200
    assert T.capped_arguments({"a": 1}) == {"a": 1}
    raw = T.capped_arguments("z" * 10_000)["raw"]
    assert raw.startswith("z" * T.RAW_BYTES + "…[truncated: 10000 bytes, sha256:")


def test_a_command_evaluator_printing_more_than_the_caps_is_measured(workspace, tmp_path,
                                                                      monkeypatch):
    """The evaluator's output is read as a tool call's: capped, the metrics line (its last)
    still parsed, the measurement recorded."""
    from infer_forge.harness.loop.run import run_task

    monkeypatch.setattr(calls, "KEEP_BYTES", 1000)
    monkeypatch.setattr(calls, "STORE_BYTES", 5000)
    path = make_task_dir(tmp_path / "specs", max_blocks=1)
    script = path.parent / "evalscript.py"
    script.write_text(script.read_text().replace(
        'print("warming up")',
        'for _ in range(3000): print("warming up, step after step, slowly")'))
    define_task(workspace, path)
    run_task(workspace, "t1")
    [blk] = task_memory(workspace.ledger, "t1").execution_record
    assert blk.measurements and all(m["success"] for m in blk.measurements), blk.measurements
    assert all(m["metrics"]["output_throughput"] > 0 for m in blk.measurements)
    events = [r.event for r in workspace.ledger.stream(task_stream("t1"))
              if isinstance(r.event, E.MeasurementRecorded)]
    stored = workspace.artifacts.get(events[0].meta["stdout_digest"])
    assert len(stored) < 5200 and b"\n\xe2\x80\xa6[truncated: " in stored
