"""`forge mcp`: a real MCP client (the SDK's stdio and streamable-HTTP clients) drives the
harness as a separate process. The heavy test runs a whole task on the embedded CPU engine
(`transformers serve` on the generated tiny Llama) through MCP tools: a baseline block
measured by `evaluate`, a candidate block measured by `engine_up` + `bench`, verified and
handed off; the contract's refusals; the resources; and the engine the agent left up is
stopped (and recorded) when the client closes. Every event the session wrote names the agent
(the client's name and version, and its model) as its actor.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from infer_forge.harness.proc import alive
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import AGENTS_STREAM, task_stream

from tests.conftest import FORGE, REPO, run_forge

CLIENT = "forge-test-agent"
CLIENT_VERSION = "1.2"
ENV_MODEL = "env-model-7"  # FORGE_AGENT_MODEL in the server's environment
META_MODEL = "meta-model-9"  # what one call says in its _meta

POINT = """\
name: mcp-tiny
model: {name: tiny-llama, source: "forge:tiny-llama", revision: "1", modalities: [text]}
scenario:
  modality: text
  traffic: {input_len: 16, output_len: 8, range_ratio: 1.0, concurrency: 2, num_prompts: 4}
  slo: {ttft_ms: {p50: 5000}, tpot_ms: {p50: 500}}
topology:
  architecture: colocated
  parallelism: {tp: 1, pp: 1, dp: 1, ep: 1}
runtime_profile: {service: mcp-tiny, rev: 1, file: ../profiles/mcp-tiny.yaml}
accelerator: {vendor: cpu, model: x86_64, count: 1}
"""

PROFILE = """\
service: mcp-tiny
rev: 1
engine: hf
config: {continuous_batching: false, attn_implementation: sdpa, dtype: float32,
         compile: false, threads: 1}
framework: {kind: transformers, version: "5"}
device_runtime: {kind: cpu}
"""

TASK = """\
id: {task_id}
type: deployment-tuning
goal: Raise output throughput at concurrency 2 on the embedded engine
point: ../points/mcp-tiny.yaml
scope:
  engine.continuous_batching: [false, true]
  engine.dtype: [float32, bfloat16]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 0.01}}
    - {{name: stability, repeats: 2, max_cv: 5.0, max_failed_requests: 0}}
verification: [baseline, measure, gates, decide]
exit: {{when: all_gates_pass, max_blocks: 6, max_wall_s: 3600, no_progress_blocks: 5}}
executor: {{kind: manual}}
"""


def make_task(root: Path, task_id: str) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "points/mcp-tiny.yaml").write_text(POINT)
    (root / "profiles/mcp-tiny.yaml").write_text(PROFILE)
    path = root / "tasks" / f"{task_id}.yaml"
    path.write_text(TASK.format(task_id=task_id))
    return path


def define(home: Path, path: Path) -> None:
    for args in (("init",), ("task", "new", str(path))):
        p = run_forge(*args, home=home)
        assert p.returncode == 0, p.stderr


def server_env(home: Path) -> dict[str, str]:
    return {**os.environ, "FORGE_HOME": str(home), "FORGE_AGENT_MODEL": ENV_MODEL}


@asynccontextmanager
async def stdio_client(home: Path, *args: str):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation

    params = StdioServerParameters(command=FORGE[0], args=[*FORGE[1:], "mcp", *args],
                                   env=server_env(home), cwd=str(REPO))
    async with Client(params, client_info=Implementation(name=CLIENT, version=CLIENT_VERSION),
                      cache=None) as c:
        yield c


async def call(c: Any, name: str, args: dict[str, Any], *, ok: bool = True,
               meta: dict[str, Any] | None = None) -> Any:
    """One tool call; its JSON result (ok) or its one-line error text (not ok)."""
    r = await c.call_tool(name, args, meta=meta)
    text = r.content[0].text
    assert r.is_error is (not ok), f"{name}: {text[:2000]}"
    return json.loads(text) if ok else text


def events(home: Path, stream: str) -> list[E.Event]:
    from infer_forge.ledger.workspace import open_workspace

    ws = open_workspace(home)
    try:
        return [r.event for r in ws.ledger.stream(stream)]
    finally:
        ws.close()


def registry_schemas(home: Path) -> dict[str, dict]:
    """What the server must list: every registry tool, the session's tools (with the
    journal's retrieval, which the CLI passes), each with its parameters' JSON schema."""
    from infer_forge.harness.mcp.loop_tools import TOOLS
    from infer_forge.harness.mcp.session_tools import AgentSession, session_tools

    extra = session_tools(AgentSession(None), retrieve=lambda q, k: None,  # type: ignore[arg-type]
                          ask=lambda q: None)
    return {t.name: t.params.model_json_schema()
            for t in {**TOOLS, **extra}.values()}


# --- the whole task on the embedded engine ------------------------------------------------


@pytest.mark.slow
def test_an_mcp_client_drives_a_task_on_the_embedded_engine(forge_home, tmp_path):
    task_file = make_task(tmp_path / "specs", "mcpt")
    define(forge_home, task_file)
    yaml_before = task_file.read_text()
    expected = registry_schemas(forge_home)
    state: dict[str, Any] = {}

    async def session() -> None:
        async with stdio_client(forge_home, "--task", "mcpt") as c:
            listed = {t.name: t for t in (await c.list_tools()).tools}
            assert set(listed) == set(expected)
            for name, schema in expected.items():
                if "task_id" in schema.get("required", []):  # bound: the task by default
                    schema["required"].remove("task_id")
                    schema["properties"]["task_id"]["description"] = (
                        "the task (default: mcpt, the task this server is bound to)")
                    if not schema["required"]:
                        del schema["required"]
                assert listed[name].input_schema == schema, name
            assert {"engine_up", "evaluate", "bench", "journal_retrieve",
                    "skills_get"} <= set(listed)

            # Block 1: the baseline, measured by the task's evaluator (the loop's step).
            b1 = await call(c, "block_start", {"task_id": "mcpt", "sub_goal": "baseline",
                                               "candidate": {}}, meta={"model": META_MODEL})
            assert b1["block_id"] == "b1"
            ev = await call(c, "evaluate", {})
            assert [r["success"] for r in ev["runs"]] == [True, True], ev
            assert all(r["metrics"]["output_throughput"] > 0 for r in ev["runs"])
            await call(c, "evaluate", {}, ok=False)  # measured once
            v1 = await call(c, "block_verify", {"task_id": "mcpt"})
            assert v1["block_id"] == "b1" and v1["verdict"] in ("pass", "fail", "inconclusive")
            await call(c, "block_handoff", {"task_id": "mcpt", "state_reached": "baseline",
                                            "next_sub_goal": "continuous batching"})

            # Refusals: each a tool error with one line, recorded.
            why = await call(c, "block_start", {"task_id": "mcpt", "sub_goal": "fp16",
                                                "candidate": {"engine.dtype": "float16"}},
                             ok=False)
            assert "out of scope" in why and "\n" not in why
            why = await call(c, "write_file", {"task_id": "mcpt", "path": str(task_file),
                                               "content": "contract: {gates: []}\n"}, ok=False)
            assert "outside the task's directories" in why
            why = await call(c, "task_memory", {"task_id": "other"}, ok=False)
            assert "works on task mcpt" in why
            why = await call(c, "no_such_tool", {"task_id": "mcpt"}, ok=False)
            assert "unknown tool 'no_such_tool'" in why

            # Block 2: a candidate in scope, measured by an engine the agent keeps up.
            b2 = await call(c, "block_start", {"task_id": "mcpt", "sub_goal": "cb",
                                               "candidate": {"engine.continuous_batching":
                                                             True}})
            assert b2["block_id"] == "b2"
            why = await call(c, "run_command", {"task_id": "mcpt", "argv": ["true"],
                                                "cwd": str(tmp_path)}, ok=False)
            assert "outside the task's directories" in why
            ran = await call(c, "run_command", {"task_id": "mcpt", "argv": [
                sys.executable, "-c", "print('hi')"]})
            assert ran["exit_code"] == 0
            wrote = await call(c, "write_file", {"task_id": "mcpt", "path": "notes.md",
                                                 "content": "cb next\n"})
            assert Path(wrote["path"]).read_text() == "cb next\n"
            up = await call(c, "engine_up", {})
            assert up["engine_id"] == "e1" and up["candidate"] == {
                "engine.continuous_batching": True}
            assert "--continuous-batching" in " ".join(up["describe"]["launch_command"])
            state["pid"] = up["pid"]
            for _ in range(2):
                b = await call(c, "bench", {"engine_id": "e1"})
                assert b["metrics"]["completed"] == 4 and b["metrics"]["failed"] == 0
                assert b["measurement"]["stream"] == "task:mcpt"
            v2 = await call(c, "block_verify", {"task_id": "mcpt"})
            assert v2["block_id"] == "b2"
            gates = {g["name"]: g for g in v2["gates"]}
            assert gates["throughput"]["verdict"] == "pass", gates
            await call(c, "block_handoff", {"task_id": "mcpt", "state_reached": "cb measured",
                                            "findings": ["cb runs"], "outcome": "progress"})

            # The journal, read-only.
            rows = await call(c, "journal_sql", {"query": "SELECT task_id, block_id FROM "
                                                 "loop_blocks ORDER BY block_id"})
            assert [r[1] for r in rows["rows"]] == ["b1", "b2"]
            cmp_ = await call(c, "journal_compare", {"a": "mcpt/b1", "b": "mcpt/b2"})
            assert any(m["metric"] == "output_throughput" for m in cmp_["metrics"])
            why = await call(c, "journal_sql", {"query": "DELETE FROM tasks"}, ok=False)
            assert "\n" not in why

            # Resources, read through the client.
            d = json.loads((await c.read_resource("forge://tasks/mcpt/definition"))
                           .contents[0].text)
            assert [g["name"] for g in d["contract"]["gates"]] == ["throughput", "stability"]
            m = json.loads((await c.read_resource("forge://tasks/mcpt/memory")).contents[0].text)
            # The brief (the whole is task_memory's detail): two blocks, the second the last.
            assert (m["task_id"], m["blocks"]) == ("mcpt", 2)
            assert m["baseline"]["block_id"] == "b1"
            skills = json.loads((await c.read_resource("forge://skills")).contents[0].text)
            assert skills and {"name", "category", "summary"} <= set(skills[0])
            one = json.loads((await c.read_resource(f"forge://skills/{skills[0]['name']}"))
                             .contents[0].text)
            assert one["name"] == skills[0]["name"] and one["body"]
            with pytest.raises(Exception, match="works on task mcpt"):
                await c.read_resource("forge://tasks/other/memory")
            with pytest.raises(Exception, match="no skill 'nope'"):
                await c.read_resource("forge://skills/nope")
            # e1 is left up: closing the client ends the server, which stops it.

    asyncio.run(session())

    assert task_file.read_text() == yaml_before  # the gates were not edited
    deadline = time.monotonic() + 30
    while alive(state["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)  # the server's exit stops the engine; give its group time to go
    assert not alive(state["pid"]), "the engine outlived the MCP server"

    evs = events(forge_home, task_stream("mcpt"))
    assert isinstance(evs[0], E.TaskDefined)
    session_evs = evs[1:]
    assert len(session_evs) > 15
    for ev in session_evs:
        assert (ev.actor.kind, ev.actor.name) == ("agent", f"{CLIENT}/{CLIENT_VERSION}"), ev
        assert ev.actor.model in (ENV_MODEL, META_MODEL), ev
    assert session_evs[0].TYPE == "LoopBlockStarted" and session_evs[0].actor.model == META_MODEL
    assert {e.actor.model for e in session_evs[1:]} == {ENV_MODEL}
    types = [e.TYPE for e in session_evs]
    assert types.count("MeasurementRecorded") == 4 and types.count("VerificationRecorded") == 2
    failed = [e for e in session_evs if isinstance(e, E.AgentStepFailed)]
    assert [f.tool for f in failed] == ["evaluate", "block_start", "write_file", "task_memory",
                                        "no_such_tool", "run_command", "journal_sql"]
    assert failed[1].arguments["candidate"] == {"engine.dtype": "float16"}
    launched = [e for e in session_evs if isinstance(e, E.EngineLaunched)]
    stopped = [e for e in session_evs if isinstance(e, E.EngineStopped)]
    assert [e.block_id for e in launched] == ["b2"]
    # Stopped at the server's exit, after b2 was handed off: task-level.
    assert [(e.block_id, e.reason) for e in stopped] == [(None, "session ended")]


# --- HTTP ---------------------------------------------------------------------------------


def _stderr_line(proc: subprocess.Popen, pattern: str, timeout: float = 60) -> str:
    """The server's stderr line matching `pattern` (its announcement)."""
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            if re.search(pattern, line):
                return line
    raise AssertionError(f"no {pattern!r} on the server's stderr: {''.join(seen)[-2000:]}")


def test_streamable_http_round_trip_and_sigterm_stops_the_engines(forge_home, tmp_path):
    from mcp import Client
    from mcp_types import Implementation

    define(forge_home, make_task(tmp_path / "specs", "httpt"))
    state: dict[str, Any] = {}
    proc = subprocess.Popen([*FORGE, "mcp", "--http", "127.0.0.1:0"], cwd=str(REPO),
                            env=server_env(forge_home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = _stderr_line(proc, r"listening on http://127\.0\.0\.1:\d+/mcp")
        url = line.split()[-1]
        assert not url.endswith(":0/mcp")

        async def session() -> None:
            async with Client(url, client_info=Implementation(name="http-agent", version="3"),
                              cache=None) as c:
                show = await call(c, "task_show", {"task_id": "httpt"})
                assert show["task_id"] == "httpt" and show["status"] == "defined"
                await call(c, "block_verify", {"task_id": "httpt"}, ok=False)
                up = await call(c, "engine_up", {"task_id": "httpt"})
                down = await call(c, "engine_down", {"engine_id": up["engine_id"]})
                assert [e["engine_id"] for e in down["stopped"]] == ["e1"]
                assert not alive(up["pid"])
                up = await call(c, "engine_up", {"task_id": "httpt"})  # left up
                state["pid"] = up["pid"]
                assert up["engine_id"] == "e2" and alive(up["pid"])

        asyncio.run(session())
    finally:
        proc.send_signal(signal.SIGTERM)  # what Ctrl-C or a supervisor does
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert not alive(state["pid"]), "the engine outlived the MCP server"
    evs = events(forge_home, task_stream("httpt"))[1:]
    assert {(e.actor.kind, e.actor.name, e.actor.model) for e in evs} == {
        ("agent", "http-agent/3", ENV_MODEL)}
    assert [e.TYPE for e in evs] == ["AgentStepFailed", "EngineLaunched", "EngineStopped",
                                     "EngineLaunched", "EngineStopped"]
    assert all(e.block_id is None for e in evs)  # no block open: task-level
    assert evs[0].tool == "block_verify"
    assert [e.reason for e in evs if isinstance(e, E.EngineStopped)] == ["engine_down",
                                                                         "session ended"]


def test_http_refuses_a_host_that_is_not_loopback(forge_home):
    assert run_forge("init", home=forge_home).returncode == 0
    p = run_forge("mcp", "--http", "0.0.0.0:0", home=forge_home, timeout=60)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "not a loopback address" in err[0] and "--allow-remote" in err[0]
    p = run_forge("mcp", "--http", "nonsense", home=forge_home, timeout=60)
    assert p.returncode != 0 and "HOST:PORT" in p.stderr


def test_a_fault_of_forge_is_a_recorded_tool_error(workspace):
    from infer_forge.harness.agents import tool_registry as tools
    from infer_forge.harness.mcp.server import _call

    def boom(_ctx: Any, _a: Any) -> Any:
        raise RuntimeError("a bug")

    ctx = tools.ToolContext(workspace, E.Actor(kind="agent", name="x/1"), extra={
        "boom": tools.AgentTool("boom", "raises", tools.Args, boom)})
    res = _call(ctx, "boom", {})
    assert not res.ok and res.error == "boom: internal error: RuntimeError: a bug"
    failed = [r.event for r in workspace.ledger.stream(AGENTS_STREAM)]
    assert [(f.tool, f.reason) for f in failed] == [("boom", res.error)]


def test_unbound_session_records_failures_on_the_agents_stream(forge_home):
    assert run_forge("init", home=forge_home).returncode == 0

    async def session() -> None:
        async with stdio_client(forge_home) as c:
            why = await call(c, "task_memory", {"task_id": "ghost"}, ok=False)
            assert "unknown task" in why
            await call(c, "engine_down", {"engine_id": "e9"}, ok=False)

    asyncio.run(session())
    failed = [e for e in events(forge_home, AGENTS_STREAM) if isinstance(e, E.AgentStepFailed)]
    who = f"{CLIENT}/{CLIENT_VERSION}"
    assert [(f.tool, f.actor.name) for f in failed] == [("task_memory", who),
                                                          ("engine_down", who)]
