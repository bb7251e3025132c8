"""What an agent reads back (issue 32): `run_command`'s output (redacted, the last 8 KB of each
stream, how much was cut), `artifact_read` (only artifacts the task's own events reference,
paged on character boundaries, text only, redacted again, every refusal recorded) and
`task_memory` in brief by default (<= 4 KB after 20 blocks; `detail` and `block_id` give the
whole). A real workspace in a temp dir, real commands, the real tools through the registry
(harness/mcp/loop_tools.py `TOOLS`, as the MCP server holds them), the real loop; the agent
executor against `ScriptedChat` (the LLM boundary); the MCP server over the SDK's stdio client.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from infer_forge.harness.agents import tool_registry as T
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.evaluator_protocol import RunResult
from infer_forge.harness.loop.manual import handoff_block, start_block
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import open_workspace

from tests.conftest import FORGE, REPO
from tests.harness.loop.test_agent_executor import (
    CB_EAGER,
    KEY,
    KEY_ENV,
    call,
    propose,
    setup,
)
from tests.helpers.tasks import open_task

AGENT = E.Actor.agent("reader", "m1")
PY = sys.executable
SECRET = "sk-ant-api03-" + "Q7v2Lk9Xw3Rt8Yp1Zs6Bn4Mc0Jd5Hf2Gq7Wa"  # the provider pattern's shape
LINE = "line {:05d} " + "x" * 20 + "\n"  # 32 bytes
N_LINES = 3000


def ctx_for(ws: Any, task_id: str = "t1") -> T.ToolContext:
    return T.ToolContext(ws, AGENT, task_id=task_id, tools=TOOLS)


def ok(ctx: T.ToolContext, name: str, args: dict[str, Any]) -> Any:
    r = T.call(ctx, name, args)
    assert r.ok, r.error
    # What the agent receives is the JSON text: it must stay whole.
    assert json.loads(r.text()) == json.loads(json.dumps(r.result, default=str))
    return r.result


def refused(ctx: T.ToolContext, name: str, args: dict[str, Any]) -> str:
    r = T.call(ctx, name, args)
    assert not r.ok and r.error and "\n" not in r.error, r
    return r.error


def failures(ws: Any, task_id: str) -> list[E.AgentStepFailed]:
    return [r.event for r in ws.ledger.stream(task_stream(task_id))
            if isinstance(r.event, E.AgentStepFailed)]


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def read_all(ctx: T.ToolContext, digest: str, limit: int) -> tuple[str, list[dict]]:
    """Every page of an artifact, from offset 0 to the end, as the agent would page."""
    pages, offset = [], 0
    while offset is not None:
        page = ok(ctx, "artifact_read", {"task_id": "t1", "digest": digest, "offset": offset,
                                         "limit": limit})
        assert page["offset"] >= offset and page["bytes"] <= limit
        pages.append(page)
        offset = page["next_offset"]
    return "".join(p["text"] for p in pages), pages


# --- run_command's answer -----------------------------------------------------------------


def test_run_command_answers_the_redacted_tail_and_artifact_read_pages_the_whole(workspace,
                                                                                tmp_path):
    open_task(workspace, tmp_path)
    ctx = ctx_for(workspace)
    printed = "".join(LINE.format(i) for i in range(N_LINES)) + f"token {SECRET}\nTHE END\n"
    r = ok(ctx, "run_command", {"task_id": "t1", "argv": py(
        f"import sys\nfor i in range({N_LINES}): sys.stdout.write({LINE!r}.format(i))\n"
        f"print('token {SECRET}'); print('THE END')\nprint('warned', file=sys.stderr)")})
    assert r["exit_code"] == 0 and r["block_id"] == "b1"
    whole = workspace.artifacts.text(r["stdout_digest"])  # as stored: redacted
    assert SECRET not in whole and "[REDACTED" in whole and whole.endswith("THE END\n")
    # The tail: the end of the output, at most 8 KB, redacted; the count of what was cut.
    out = r["stdout"]
    assert out.endswith("THE END\n") and whole.endswith(out)
    assert len(out.encode()) <= 8192 and len(out.encode()) > 8100
    assert SECRET not in out and "[REDACTED" in out
    assert r["stdout_bytes"] == len(printed.encode())
    assert r["stdout_cut"] == len(whole.encode()) - len(out.encode()) > 80_000
    assert (r["stderr"], r["stderr_bytes"], r["stderr_cut"]) == ("warned\n", 7, 0)
    assert workspace.artifacts.text(r["stderr_digest"]) == "warned\n"

    # The whole, page by page: exactly what the artifact holds, the secret still redacted.
    text, pages = read_all(ctx, r["stdout_digest"], 20_000)
    assert text == whole and len(pages) == 5 and SECRET not in text
    assert pages[0]["size"] == len(whole.encode()) and pages[-1]["next_offset"] is None
    assert pages[0]["referenced_by"] == [{"event": "ToolInvoked", "field": "stdout_digest",
                                          "event_id": pages[0]["referenced_by"][0]["event_id"],
                                          "block_id": "b1"}]


def test_past_the_kept_head_the_cut_counts_what_the_command_printed(workspace, tmp_path,
                                                                     monkeypatch):
    from infer_forge.harness.tool_calls import calls

    # The capture keeps 1000 bytes of head and 20 KB of tail of this 96 KB output.
    monkeypatch.setattr(calls, "KEEP_BYTES", 1000)
    monkeypatch.setattr(calls, "TAIL_BYTES", 20_000)
    open_task(workspace, tmp_path)
    r = ok(ctx_for(workspace), "run_command", {"task_id": "t1", "argv": py(
        f"import sys\nfor i in range({N_LINES}): sys.stdout.write({LINE!r}.format(i))")})
    printed = "".join(LINE.format(i) for i in range(N_LINES))
    assert r["stdout"] == printed[-8192:] and r["stdout_bytes"] == len(printed)
    assert r["stdout_cut"] == len(printed) - 8192


def test_control_bytes_on_both_streams_still_answer_whole_json(workspace, tmp_path):
    open_task(workspace, tmp_path)
    r = ok(ctx_for(workspace), "run_command", {"task_id": "t1", "argv": py(
        "import sys\nsys.stdout.write('\\x01' * 10000)\nsys.stderr.write('\\x02' * 10000)")})
    for name, ch in (("stdout", "\x01"), ("stderr", "\x02")):
        shown = r[name]
        assert shown == ch * len(shown) and 2000 < len(shown) <= 16_000 // 6
        assert r[f"{name}_bytes"] == 10_000 and r[f"{name}_cut"] == 10_000 - len(shown)


def test_pages_start_and_end_on_character_boundaries(workspace, tmp_path):
    open_task(workspace, tmp_path)
    ctx = ctx_for(workspace)
    # 1-, 2-, 3- and 4-byte characters: a page of 1000 bytes cuts some of them in two.
    r = ok(ctx, "run_command", {"task_id": "t1", "argv": py(
        "for i in range(400): print(f'{i} aé€😀 ' * 3)")})
    whole = workspace.artifacts.text(r["stdout_digest"])
    assert "😀" in whole and len(whole.encode()) > 15_000
    text, pages = read_all(ctx, r["stdout_digest"], 1000)
    assert text == whole
    ends = [p["offset"] + p["bytes"] for p in pages]
    assert any(p["bytes"] < 1000 for p in pages[:-1])  # a character was left for the next page
    assert [p["offset"] for p in pages[1:]] == ends[:-1]  # nothing skipped, nothing twice
    # A page of emoji, JSON-escaped to 12 characters each, is shortened to fit one result.
    wide = ok(ctx, "run_command", {"task_id": "t1", "argv": py("print('😀' * 12000)")})
    big = ok(ctx, "artifact_read", {"task_id": "t1", "digest": wide["stdout_digest"],
                                    "limit": 32768})
    assert big["text"] == "😀" * (big["bytes"] // 4) and 16_000 < big["bytes"] < 20_000
    assert big["next_offset"] == big["bytes"]
    # A page asked to start inside a character starts at the next one.
    inside = len(b"0 a") + 1  # the second byte of "é"
    page = ok(ctx, "artifact_read", {"task_id": "t1", "digest": r["stdout_digest"],
                                     "offset": inside, "limit": 64})
    assert page["offset"] == inside + 1 and page["text"].startswith("€😀")


# --- artifact_read's scope and refusals -----------------------------------------------------


def test_an_artifact_outside_the_task_is_refused_and_recorded(workspace, tmp_path):
    open_task(workspace, tmp_path, "t1")
    open_task(workspace, tmp_path, "t2")
    other = ok(ctx_for(workspace, "t2"), "run_command", {"task_id": "t2", "argv": py(
        "print('t2 only')")})["stdout_digest"]
    mine = ok(ctx_for(workspace), "run_command", {"task_id": "t1", "argv": py(
        "print('t1 output')")})["stdout_digest"]
    assert workspace.artifacts.exists(other)
    ctx = ctx_for(workspace)
    why = refused(ctx, "artifact_read", {"task_id": "t1", "digest": other})
    assert why == (f"artifact_read: artifact {other} is not referenced by task t1's events "
                   "(its tool calls' output, its measurements' records, its engines' logs, "
                   "its model calls): out of the task's scope")
    # Naming it in text the agent writes (a handoff) does not bring it in scope, nor does
    # the recorded refusal that quotes it.
    handoff_block(workspace, "t1", state_reached=f"saw {other}", findings=[other],
                  next_sub_goal=f"read {other}", actor=AGENT)
    assert "out of the task's scope" in refused(ctx, "artifact_read",
                                                 {"task_id": "t1", "digest": other})
    # Another task's id, a digest that is not one, an offset past the end: refused too.
    assert "works on task t1" in refused(ctx, "artifact_read", {"task_id": "t2",
                                                                 "digest": other})
    assert "digest" in refused(ctx, "artifact_read", {"task_id": "t1", "digest": "../etc"})
    assert "past the end" in refused(ctx, "artifact_read", {"task_id": "t1", "digest": mine,
                                                            "offset": 10_000})
    # Its own output stays readable after the block was handed off.
    assert ok(ctx, "artifact_read", {"task_id": "t1", "digest": mine})["text"] == "t1 output\n"
    failed = failures(workspace, "t1")
    assert [f.tool for f in failed] == ["artifact_read"] * 5
    assert failed[0].arguments["digest"] == other and failed[0].block_id == "b1"
    assert failed[1].block_id is None  # b1 was handed off: task-level
    assert failures(workspace, "t2") == []


def test_only_text_is_read(workspace, tmp_path):
    open_task(workspace, tmp_path)
    ctx = ctx_for(workspace)
    cases = {
        "a NUL byte": "sys.stdout.buffer.write(b'abc\\x00def\\n')",
        "not UTF-8 at byte 3": "sys.stdout.buffer.write(b'abc\\xff\\xfe\\n')",
        "is a gzip archive": "import gzip; sys.stdout.buffer.write(gzip.compress(b'hi\\n'))",
    }
    for expected, code in cases.items():
        d = ok(ctx, "run_command", {"task_id": "t1", "argv": py(f"import sys; {code}")})
        why = refused(ctx, "artifact_read", {"task_id": "t1", "digest": d["stdout_digest"]})
        assert expected in why and "reads text only" in why, why
    assert [f.tool for f in failures(workspace, "t1")] == ["artifact_read"] * 3


def test_a_secret_configured_since_the_artifact_was_stored_is_redacted(forge_home, workspace,
                                                                      tmp_path, monkeypatch):
    open_task(workspace, tmp_path)
    value = "Zq8Lw2Vn5Tx7Rb1Mc4Kd9Hf3"  # no provider's shape: stored as printed
    d = ok(ctx_for(workspace), "run_command", {"task_id": "t1", "argv": py(
        f"print('config value {value} end')")})["stdout_digest"]
    assert value in workspace.artifacts.text(d)
    workspace.close()
    monkeypatch.setenv("FORGE_TEST_DB_PASSWORD", value)  # a secret-named variable now
    ws = open_workspace(forge_home)
    try:
        text = ok(ctx_for(ws), "artifact_read", {"task_id": "t1", "digest": d})["text"]
        assert value not in text and text.startswith("config value [REDACTED")
    finally:
        ws.close()


def test_a_measurement_s_captures_are_in_scope(workspace, tmp_path):
    from tests.harness.loop.test_loop import make_task_dir

    define_task(workspace, make_task_dir(tmp_path / "specs", max_blocks=1))
    run_task(workspace, "t1")
    ms = [r.event for r in workspace.ledger.stream(task_stream("t1"))
          if isinstance(r.event, E.MeasurementRecorded)]
    assert ms and all(m.artifact_digest for m in ms)
    page = ok(ctx_for(workspace), "artifact_read", {"task_id": "t1",
                                                    "digest": ms[0].artifact_digest})
    assert page["text"].startswith("warming up\n")
    assert {("MeasurementRecorded", "artifact_digest"),
            ("MeasurementRecorded", "meta.stdout_digest")} <= {
        (x["event"], x["field"]) for x in page["referenced_by"]}


# --- task_memory in brief ----------------------------------------------------------------


class Instant:
    """An in-process evaluator: the value of the scope key sets throughput and TTFT, so some
    candidates fail the throughput gate and some the TTFT gate too."""

    def evaluate(self, candidate: dict[str, Any], *, repeats: int, ctx: Any) -> list[RunResult]:
        v = candidate.get("engine.cb_num_blocks", 0)
        return [RunResult({"output_throughput": 100.0 + (v % 40) * 0.1 + r * 0.01,
                           "median_ttft_ms": 40 + v * 0.5, "token_match": 1.0, "failed": 0.0})
                for r in range(repeats)]


def long_task(root: Path, blocks: int) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for rel in ("points/tiny-cpu.yaml", "profiles/tiny-cpu.yaml"):
        (root / rel).write_text((REPO / "examples" / rel).read_text())
    values = ", ".join(str(8 * (i + 1)) for i in range(blocks))
    path = root / "tasks/long.yaml"
    path.write_text(f"""\
id: long
type: deployment-tuning
goal: Raise output throughput at concurrency 8 without breaking the TTFT SLO
point: ../points/tiny-cpu.yaml
scope:
  engine.cb_num_blocks: [{values}]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
    - {{name: ttft-slo, metric: median_ttft_ms, at_most: 100}}
    - {{name: stability, repeats: 3, max_cv: 0.10}}
exit: {{max_blocks: {blocks}, no_progress_blocks: {blocks + 5}, max_wall_s: 3600}}
""")
    return path


def test_task_memory_is_brief_after_20_blocks_and_whole_on_request(workspace, tmp_path):
    define_task(workspace, long_task(tmp_path / "specs", 20))
    r = run_task(workspace, "long", evaluator=Instant())
    assert (r.blocks, r.exit_state) == (20, "failed-budget")
    ctx = ctx_for(workspace, "long")
    res = T.call(ctx, "task_memory", {"task_id": "long"})
    text = res.text()
    assert res.ok and len(text.encode()) <= 4096, len(text)
    m = json.loads(text)
    mem = r.memory
    assert (m["task_id"], m["status"], m["blocks"]) == ("long", "exited", 20)
    assert m["exit"] == {"state": "failed-budget", "reason": "block budget spent: 20 of 20 blocks"}
    assert m["primary"] == {"metric": "output_throughput", "better": "higher"}
    assert m["current_block"] is None and m["accepted"] == []
    assert m["baseline"] == {"block_id": "b1", "median": mem.baseline["median"],
                             "verdict": mem.baseline["verdict"]}
    best = mem.best_so_far
    assert m["best_so_far"]["block_id"] == best["block_id"] != "b1"
    assert m["best_so_far"]["vs_baseline"] == round(best["median"] / mem.baseline["median"], 4)
    assert m["rejected"]["count"] == len(mem.rejected) == 19
    last = m["rejected"]["last"]
    assert [x["block_id"] for x in last] == [f"b{i}" for i in range(13, 21)]
    for x, full in zip(last, mem.rejected[-8:], strict=True):
        assert x["candidate"] == full["candidate"] and len(x["reason"]) <= 160
        assert "\n" not in x["reason"] and "CI " not in x["reason"]  # details left out
        assert x["reason"].startswith("fail: throughput fail: output_throughput ratio")
    assert any("ttft-slo fail" in x["reason"] for x in last)  # both gates, on one line
    assert m["next"]["tried_configs"] == len(mem.tried) == 20
    assert m["next"]["last_handoff"]["block_id"] == "b20"
    assert m["budget"]["blocks_left"] == 0 and m["budget"]["max_blocks"] == 20
    assert 3000 < m["budget"]["wall_s_left"] <= 3600
    # No raw runs, no paths, no launch commands.
    for word in ("execution_record", "measurements", "argv", "launch", str(workspace.home),
                 "/tmp"):
        assert word not in text, word

    # The whole memory is over what one tool result holds: refused, not sent cut.
    why = refused(ctx, "task_memory", {"task_id": "long", "detail": True})
    assert why.startswith("task_memory: task long's whole memory is ")
    assert why.endswith("characters, over the 60000 a tool result holds: ask for one block's "
                        "record (block_id: b1..b20)")
    b2 = ok(ctx, "task_memory", {"task_id": "long", "block_id": "b2"})
    assert b2["block_id"] == "b2" and len(b2["measurements"]) == 3
    assert b2["measurements"][0]["metrics"]["output_throughput"] == pytest.approx(100.8)
    assert refused(ctx, "task_memory", {"task_id": "long", "block_id": "b21"}) == \
        "task_memory: task long has no block 'b21' (blocks: b1..b20)"


def test_the_brief_shows_the_open_block_and_the_proposed_next(workspace, tmp_path):
    open_task(workspace, tmp_path)
    ctx = ctx_for(workspace)
    ok(ctx, "run_command", {"task_id": "t1", "argv": ["true"]})
    m = ok(ctx, "task_memory", {"task_id": "t1"})
    assert m["status"] == "running" and m["next"]["index"] is None
    assert m["current_block"] == {"block_id": "b1", "sub_goal": "record measurements",
                                  "candidate": {}, "tool_calls": 1, "measurements": 0,
                                  "verdict": None}
    handoff_block(workspace, "t1", state_reached="nothing measured\nyet",
                  findings=["one", "two\nlines", "x" * 500, "four"],
                  next_sub_goal="try continuous batching", outcome="no-progress", actor=AGENT)
    m = ok(ctx, "task_memory", {"task_id": "t1"})
    assert m["current_block"] is None
    assert m["next"] == {"index": 2, "sub_goal": "try continuous batching", "tried_configs": 1,
                         "last_handoff": {"block_id": "b1", "outcome": "no-progress",
                                          "state_reached": "nothing measured yet",
                                          "findings": ["one", "two lines",
                                                       "x" * 159 + "…"]}}
    assert m["budget"]["blocks_left"] == 7 and m["budget"]["no_progress_left"] == 2
    whole = ok(ctx, "task_memory", {"task_id": "t1", "detail": True})
    assert whole["execution_record"][0]["handoff"]["next_sub_goal"] == "try continuous batching"
    start_block(workspace, "t1", "cb", {"engine.continuous_batching": True})
    assert ok(ctx, "task_memory", {"task_id": "t1"})["current_block"]["candidate"] == {
        "engine.continuous_batching": True}


# --- the agent executor and the MCP server ---------------------------------------------------


def test_the_agent_executor_reads_its_command_output(forge_home, tmp_path, monkeypatch):
    """The executor's run_command answers the MCP's shape, and artifact_read reads its output
    before the decision saves the call (its events are pending until the block starts)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    digest: dict[str, str] = {}

    def read_it(req: dict[str, Any]) -> dict[str, Any]:
        ran = json.loads(req["messages"][-1]["content"])
        digest["d"] = ran["stdout_digest"]
        return call("artifact_read", {"digest": ran["stdout_digest"], "offset": 0,
                                      "limit": 4096})

    script = [call("run_command", {"argv": py("for i in range(2000): print(f'row {i}')")}),
              read_it, propose(CB_EAGER, "batching with eager")]
    with ScriptedChat(script) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url})
        r = run_task(ws, "t1")
    assert r.exit_state == "delivered"
    ran = json.loads(chat.requests[1]["messages"][-1]["content"])
    assert ran["exit_code"] == 0 and ran["stdout"].endswith("row 1999\n")
    assert ran["stdout_cut"] > 0 and len(ran["stdout"].encode()) <= 8192
    page = json.loads(chat.requests[2]["messages"][-1]["content"])
    assert page["text"].startswith("row 0\nrow 1\n") and page["next_offset"] == page["bytes"]
    evs = [x.event for x in ws.ledger.stream(task_stream("t1"))]
    tools = [(e.tool, e.block_id) for e in evs if isinstance(e, E.ToolInvoked)]
    assert ("agent", "b2") in tools and ("agent:artifact_read", "b2") in tools
    assert [e for e in evs if isinstance(e, E.AgentStepFailed)] == []
    run = next(e for e in evs if isinstance(e, E.ToolInvoked) and e.tool == "agent")
    assert run.stdout_digest == digest["d"]
    ws.close()


def test_over_mcp_an_agent_reads_its_output_and_the_brief(forge_home, tmp_path):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation

    from tests.harness.mcp.test_mcp import define, events, make_task, server_env

    define(forge_home, make_task(tmp_path / "specs", "rd"))

    async def session() -> dict[str, Any]:
        params = StdioServerParameters(command=FORGE[0], args=[*FORGE[1:], "mcp"],
                                       env=server_env(forge_home), cwd=str(REPO))
        async with Client(params, client_info=Implementation(name="reader", version="1"),
                          cache=None) as c:
            async def tool(name: str, args: dict[str, Any], is_error: bool = False) -> Any:
                res = await c.call_tool(name, {"task_id": "rd", **args})
                assert res.is_error is is_error, res.content[0].text
                return res.content[0].text if is_error else json.loads(res.content[0].text)

            await tool("block_start", {"sub_goal": "look", "candidate": {}})
            ran = await tool("run_command", {"argv": py(
                "import sys; print('x' * 10000); print('tail end', file=sys.stderr)")})
            page = await tool("artifact_read", {"digest": ran["stdout_digest"],
                                                "offset": 9000})
            why = await tool("artifact_read", {"digest": "sha256:" + "0" * 64}, True)
            return {"ran": ran, "page": page, "why": why,
                    "brief": await tool("task_memory", {}),
                    "whole": await tool("task_memory", {"detail": True})}

    got = asyncio.run(session())
    ran, page = got["ran"], got["page"]
    assert ran["stdout"] == "x" * 8191 + "\n" and ran["stdout_cut"] == 1809
    assert ran["stderr"] == "tail end\n" and ran["stdout_bytes"] == 10001
    assert page == {"digest": ran["stdout_digest"], "size": 10001, "offset": 9000,
                    "bytes": 1001, "next_offset": None, "text": "x" * 1000 + "\n",
                    "referenced_by": page["referenced_by"]}
    assert "out of the task's scope" in got["why"]
    assert got["brief"]["current_block"]["tool_calls"] == 1
    assert "execution_record" not in got["brief"]
    assert got["whole"]["execution_record"][0]["tool_calls"][0]["exit_code"] == 0
    failed = [e for e in events(forge_home, task_stream("rd"))
              if isinstance(e, E.AgentStepFailed)]
    assert [(f.tool, f.actor.name) for f in failed] == [("artifact_read", "reader/1")]
