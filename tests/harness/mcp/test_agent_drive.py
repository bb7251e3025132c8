"""A real coding-agent client drives a task end to end: Claude Code (`claude -p`) and Codex
(`codex exec`), each pointed at a scripted model API on loopback (harness/testing:
scripted_messages.py, scripted_responses.py), with `forge mcp --task` as its MCP server, all
inside a network namespace that has only loopback (the API is reached through
loopback_bridge.py).

The scripted model reads the task, starts a block, runs a command that prints metrics, reads
the command's result as the client relayed it, records those metrics as a measurement and
hands off. Each of its turns after the first checks the result forge answered for the call
before it (a wrong or missing result is an API error the test names). Then the ledger must
hold every step, in order, with the client (its `initialize` clientInfo) and the model as the
actor. The real client accepting the stand-in's streamed turns (text, tool calls with partial
JSON arguments, stop reasons, usage) is the check of the stand-in against the real artifact.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from infer_forge.harness.testing import loopback_bridge
from infer_forge.harness.testing.scripted_api import ApiError, ScriptedApi, Turn
from infer_forge.harness.testing.scripted_messages import ScriptedMessages
from infer_forge.harness.testing.scripted_responses import ScriptedResponses
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream

from tests.conftest import run_forge
from tests.harness.loop.test_loop import make_task_dir
from tests.helpers import agent_clients

pytestmark = pytest.mark.slow

TASK = "drive"
MODEL = "scripted-model-1"  # the model the client is configured with (and says it runs)
PORT = 43117  # the scripted API's port inside the namespace (a fresh one: always free)
BRIDGE = str(Path(loopback_bridge.__file__))

# The command the agent runs: a cheap measurement whose metrics come out on stdout.
METRICS = {"output_throughput": 123.5, "median_ttft_ms": 88.0, "token_match": 1.0,
           "completed": 8.0, "failed": 0.0}
STDOUT = f"measuring\n{json.dumps(METRICS)}\n"
COMMAND = [sys.executable, "-c", f"print({STDOUT.rstrip(chr(10))!r})"]


def metrics_in(text: str) -> dict[str, float]:
    """The metrics line of the command's output (its last line)."""
    return json.loads(text.strip().splitlines()[-1])


def read_output(result: dict[str, Any]) -> dict[str, float]:
    """The metrics the command printed, from run_command's result as relayed: its output's
    text where the result carries it (`stdout`), else the agent checks the output's digest is
    the one it expects."""
    if isinstance(result.get("stdout"), str) and result["stdout"].strip():
        return metrics_in(result["stdout"])
    want = "sha256:" + hashlib.sha256(STDOUT.encode()).hexdigest()
    if result.get("stdout_digest") != want or result.get("exit_code") != 0:
        raise ApiError(f"run_command's result is not the command's: {result}")
    return dict(METRICS)


def after(tool: str, check: Callable[[Any], Any], then: Callable[[Any], Turn]) -> Turn:
    """A turn that reads forge's result of the previous call of `tool` (as the client sent
    it back), checks it, and answers `then(value)`; `check` returns the value or raises."""

    def turn(_req: dict[str, Any], api: ScriptedApi) -> dict[str, Any]:
        result = api.result_json(tool)
        try:
            value = check(result)
        except (KeyError, TypeError, AssertionError) as e:
            raise ApiError(f"{tool}'s result: {type(e).__name__} {e}: {result!r:.400}") from e
        out = then(value)
        assert isinstance(out, dict)
        return out

    return turn


def refused(tool: str, why: str, then: Turn) -> Turn:
    """A turn that reads forge's refusal of the previous call of `tool` (a tool error, its
    one-line reason as text) and goes on with `then`."""

    def turn(req: dict[str, Any], api: ScriptedApi) -> dict[str, Any]:
        text = " ".join(api.result_of(tool))
        if why not in text:
            raise ApiError(f"{tool} was not refused with {why!r}: {text:.400}")
        return then(req, api) if callable(then) else then

    return turn


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def measure(metrics: dict[str, float]) -> dict[str, Any]:
    return call("measure", task_id=TASK, metrics=metrics, source="scripted-agent")


def read_back(req: dict[str, Any], api: ScriptedApi) -> dict[str, Any]:
    """After run_command: read the command's output, then measure what it printed. Where
    forge offers `artifact_read`, the agent reads the whole stdout by its digest (one turn
    more); else from run_command's result."""
    ran = api.result_json("run_command")
    if ran.get("exit_code") != 0:
        raise ApiError(f"run_command failed: {ran}")
    if api.offers(req, "artifact_read"):
        api.then(after("artifact_read", lambda r: metrics_in(r["text"]), measure))
        return call("artifact_read", task_id=TASK, digest=ran["stdout_digest"])
    return measure(read_output(ran))


def script() -> list[Turn]:
    """The agent's turns: forge's tool names, as forge names them (the stand-in finds the
    client's name for each: `mcp__forge__block_start`, or `block_start` in the `mcp__forge`
    namespace)."""

    def shown(r: Any) -> Any:
        expect(r["task_id"] == TASK and r["status"] == "defined", "task_show")

    def started(r: Any) -> Any:
        expect(r["block_id"] == "b1", "block_start")

    def measured(r: Any) -> Any:
        expect(r["block_id"] == "b1" and r["run_id"] == "b1-m1", "measure")
        return r

    return [
        call("task_show", task_id=TASK),
        # A candidate outside the task's scope first: refused, recorded, relayed as an error.
        after("task_show", shown, lambda _: call(
            "block_start", task_id=TASK, sub_goal="half precision",
            candidate={"engine.dtype": "float16"})),
        refused("block_start", "out of scope", call(
            "block_start", task_id=TASK, sub_goal="measure the baseline", candidate={})),
        after("block_start", started, lambda _: call("run_command", task_id=TASK,
                                                     argv=COMMAND)),
        read_back,
        after("measure", measured, lambda r: call(
            "block_handoff", task_id=TASK, state_reached="baseline measured",
            findings=[f"output_throughput {METRICS['output_throughput']} ({r['run_id']})"],
            next_sub_goal="continuous batching", outcome="progress")),
        after("block_handoff", lambda r: expect(r["block_id"] == "b1", "handoff"),
              lambda _: {"text": "Handed off b1: baseline measured."}),
    ]


def define(home: Path, tmp: Path) -> None:
    path = make_task_dir(tmp / "specs", TASK, executor="{kind: manual}")
    for args in (("init",), ("task", "new", str(path))):
        p = run_forge(*args, home=home)
        assert p.returncode == 0, p.stderr


def forge_server(home: Path) -> tuple[str, list[str], dict[str, str]]:
    """How the client starts forge: command, args, env (the model named for the ledger)."""
    return sys.executable, ["-m", "infer_forge.cli", "mcp", "--task", TASK], {
        "FORGE_HOME": str(home), "FORGE_AGENT_MODEL": MODEL}


def bridged(api: ScriptedApi, argv: list[str]) -> list[str]:
    return [sys.executable, BRIDGE, str(PORT), api.socket_path, "--", *argv]


def task_events(home: Path) -> list[E.Event]:
    from infer_forge.ledger.workspace import open_workspace

    ws = open_workspace(home)
    try:
        return [r.event for r in ws.ledger.stream(task_stream(TASK))]
    finally:
        ws.close()


def client_version(exe: Path, home: Path) -> str:
    p = agent_clients.run([str(exe), "--version"], home, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()[-1] if "codex" in p.stdout else p.stdout.split()[0]


def check_drive(api: ScriptedApi, home: Path, client_name: str) -> None:
    """What both clients must leave: the script played to its end with every result relayed,
    and the ledger holding each step with the client and the model as its actor."""
    assert api.errors == [], api.errors
    assert not api.script, f"{len(api.script)} turns left: the client stopped early"
    assert len(api.turns) == len(api.calls) + 1  # a call a turn, then the answer
    read = ["artifact_read"] if api.offers(api.turns[0], "artifact_read") else []
    assert [c.name.split("__")[-1] for c in api.calls] == [
        "task_show", "block_start", "block_start", "run_command", *read, "measure",
        "block_handoff"]
    assert {t.get("model") for t in api.turns} == {MODEL}
    # Every call the script made came back with forge's result in the next turn.
    for i, c in enumerate(api.calls):
        assert c.call_id in api.tool_results(api.turns[i + 1]), c

    evs = task_events(home)
    assert isinstance(evs[0], E.TaskDefined)
    steps = evs[1:]
    assert [e.TYPE for e in steps] == ["AgentStepFailed", "LoopBlockStarted", "ToolInvoked",
                                       "MeasurementRecorded", "LoopBlockHandedOff"]
    actors = {(e.actor.kind, e.actor.name, e.actor.model) for e in steps}
    assert actors == {("agent", client_name, MODEL)}, actors
    failed, started, ran, measured, handed = steps
    assert failed.tool == "block_start" and "out of scope" in failed.reason
    assert failed.arguments["candidate"] == {"engine.dtype": "float16"}
    assert started.sub_goal == "measure the baseline" and started.block_id == "b1"
    assert ran.argv == COMMAND and ran.exit_code == 0 and ran.block_id == "b1"
    relayed = api.result_json("run_command", api.turns[4])
    assert "stdout" not in relayed or relayed["stdout"] == STDOUT
    assert relayed["stdout_digest"] == ran.stdout_digest
    assert measured.metrics == METRICS and measured.source == "scripted-agent"
    assert handed.findings == [f"output_throughput {METRICS['output_throughput']} (b1-m1)"]
    assert (handed.outcome, handed.next_sub_goal) == ("progress", "continuous batching")


# --- Claude Code ---------------------------------------------------------------------------


def test_claude_code_drives_a_task_over_mcp(forge_home, tmp_path):
    claude = agent_clients.need("claude")
    define(forge_home, tmp_path)
    home = tmp_path / "claude-home"
    version = client_version(claude, home)
    command, args, env = forge_server(forge_home)
    config = {"mcpServers": {"forge": {"type": "stdio", "command": command, "args": args,
                                       "env": env}}}
    with ScriptedMessages(script(), model=MODEL) as api:
        argv = [str(claude), "-p", f"Drive forge task {TASK} one block.",
                "--mcp-config", json.dumps(config), "--strict-mcp-config",
                "--allowedTools", "mcp__forge", "--output-format", "json", "--model", MODEL]
        p = agent_clients.run(bridged(api, argv), home, cwd=home, timeout=150, env={
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{PORT}",
            "ANTHROPIC_API_KEY": "sk-ant-scripted",
            "ENABLE_TOOL_SEARCH": "false"})  # forge's tools offered, not deferred
        assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:], api.errors)
        out = json.loads(p.stdout)
        assert out["is_error"] is False and out["result"] == "Handed off b1: baseline measured."
        assert out["num_turns"] == len(api.turns)
        check_drive(api, forge_home, f"claude-code/{version}")
        # What Claude Code calls (non-essential traffic off): streamed Messages requests only,
        # with the key and the API version in headers.
        assert {(r.method, r.path) for r in api.received} == {("POST", "/v1/messages?beta=true")}
        assert all(t.get("stream") is True for t in api.turns)
        assert {(r.headers.get("x-api-key"), bool(r.headers.get("anthropic-version")))
                for r in api.received} == {("sk-ant-scripted", True)}
        # forge's refusal reached the model as a tool error (Codex relays only its text).
        blocks = {b["tool_use_id"]: b for m in api.turns[2]["messages"]
                  if m["role"] == "user" and isinstance(m["content"], list)
                  for b in m["content"] if b.get("type") == "tool_result"}
        assert blocks[api.calls[1].call_id].get("is_error") is True  # block_start refused
        assert not blocks[api.calls[0].call_id].get("is_error")  # task_show answered


# --- Codex ---------------------------------------------------------------------------------


def codex_config(api_url: str, home: Path) -> str:
    """~/.codex/config.toml: the scripted API as the model provider, forge as an MCP server."""
    command, args, env = forge_server(home)
    return f"""\
model = "{MODEL}"
model_provider = "scripted"
# codex exec sends its first turn once the MCP servers are up or this much time has passed;
# forge's tools are not offered in a turn sent before forge answered initialize.
mcp_optional_startup_grace_ms = 30000

[model_providers.scripted]
name = "scripted"
base_url = "{api_url}"
wire_api = "responses"

[mcp_servers.forge]
command = {json.dumps(command)}
args = {json.dumps(args)}
env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())} }}
# codex exec runs with approval policy "never": without this, forge's write tools are
# refused ("MCP tool call requires approval, but approval policy is never").
default_tools_approval_mode = "approve"
"""


def test_codex_drives_a_task_over_mcp(forge_home, tmp_path):
    codex = agent_clients.need("codex")
    define(forge_home, tmp_path)
    home = tmp_path / "codex-home"
    version = client_version(codex, home)
    (home / ".codex").mkdir(parents=True)
    with ScriptedResponses(script(), model=MODEL) as api:
        (home / ".codex/config.toml").write_text(
            codex_config(f"http://127.0.0.1:{PORT}/v1", forge_home))
        argv = [str(codex), "exec", "--skip-git-repo-check",
                f"Drive forge task {TASK} one block."]
        p = agent_clients.run(bridged(api, argv), home, cwd=home, timeout=150)
        assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:], api.errors)
        assert p.stdout.strip().splitlines()[-1] == "Handed off b1: baseline measured."
        check_drive(api, forge_home, f"codex-mcp-client/{version}")
        # What Codex calls: streamed Responses requests only; forge's tools in one namespace.
        assert {(r.method, r.path) for r in api.received} == {("POST", "/v1/responses")}
        assert all(t.get("stream") is True for t in api.turns)
        assert all({"type": "namespace", "name": "mcp__forge"}.items()
                   <= next(x for x in t["tools"] if x.get("name") == "mcp__forge").items()
                   for t in api.turns)


def test_the_stand_ins_answer_what_the_script_cannot_as_errors_by_name():
    """A tool the request does not offer, an exhausted script: a 400 naming why, kept."""
    import urllib.error
    import urllib.request

    def post(api: ScriptedApi, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        req = urllib.request.Request(api.origin + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    with ScriptedMessages([call("block_start", task_id="x")]) as api:
        tools = [{"name": "mcp__forge__task_show", "input_schema": {}}]
        code, body = post(api, "/v1/messages", {"model": "m", "tools": tools, "messages": []})
        assert code == 400 and "'block_start' is not offered" in body["error"]["message"]
        code, body = post(api, "/v1/messages", {"model": "m", "tools": tools, "messages": []})
        assert code == 400 and "script exhausted" in body["error"]["message"]
        assert len(api.errors) == 2
        # A side request (no tools: a title, a quota probe) takes no turn.
        code, body = post(api, "/v1/messages", {"model": "m", "messages": []})
        assert code == 200 and body["content"] == [{"type": "text", "text": "ok"}]
        assert len(api.side) == 1 and len(api.turns) == 2
        code, body = post(api, "/v1/messages/count_tokens", {"messages": [
            {"role": "user", "content": "two words"}]})
        assert code == 200 and body["input_tokens"] > 0
        with urllib.request.urlopen(api.origin + "/v1/models", timeout=10) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["scripted-model"]
    with ScriptedMessages([call("task_show", task_id="x"), {"text": "done"}]) as api:
        code, body = post(api, "/v1/messages", {"model": "m", "tools": tools, "messages": []})
        assert (code, body["stop_reason"]) == (200, "tool_use")
        assert body["content"] == [{"type": "tool_use", "id": "toolu_1_0",
                                    "name": "mcp__forge__task_show", "input": {"task_id": "x"}}]
        code, body = post(api, "/v1/messages", {"model": "m", "tools": tools, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1_0",
                                          "content": [{"type": "text", "text": "{\"a\": 1}"}]}]}]})
        assert (body["stop_reason"], body["content"]) == ("end_turn", [{"type": "text",
                                                                        "text": "done"}])
        assert api.result_json("task_show") == {"a": 1}
    with ScriptedResponses([call("task_show", task_id="x")]) as api:
        tools = [{"type": "namespace", "name": "mcp__forge",
                  "tools": [{"type": "function", "name": "task_show"}]}]
        code, body = post(api, "/v1/responses", {"model": "m", "tools": tools, "input": []})
        assert code == 200
        fc = body["output"][0]
        assert (fc["type"], fc["namespace"], fc["name"]) == ("function_call", "mcp__forge",
                                                             "task_show")
        assert json.loads(fc["arguments"]) == {"task_id": "x"}
        req = {"tools": tools}
        assert api.offers(req, "task_show") and not api.offers(req, "artifact_read")
