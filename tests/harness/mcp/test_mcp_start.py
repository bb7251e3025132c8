"""`forge mcp`'s start (issue 32): the real `forge` console script, driven by the real MCP
SDK's stdio client (the initialize handshake, as Claude Code and Codex speak it).

- The front (harness/mcp/front.py, wire.py) answers `initialize` before the SDK, pydantic or the
  ledger load, and answers as the SDK server does: the server's own answer to it is
  compared on the way and never reaches the client twice.
- A start-up problem (no workspace, forge.toml that is not TOML, an unknown bound task, a
  forge.toml only the real open refuses) does not close the connection: the instructions
  say it first, every tool call answers it (`isError`, the same line), stderr says it; the
  real MCP Inspector CLI shows that line (skipped without it here, failed under CI=true).
- SIGTERM ends a stdio server.
- Bound to a task, `resources/list` lists its definition and memory and `task_id` is
  optional everywhere; unbound, leaving it out is refused with one line.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from infer_forge.harness.mcp import front, wire
from infer_forge.ledger import events as E
from infer_forge.ledger.home import unknown_task
from infer_forge.ledger.streams import AGENTS_STREAM, task_stream

from tests.conftest import REPO
from tests.harness.mcp.test_mcp import ENV_MODEL, define, events, make_task, registry_schemas

FORGE_SCRIPT = Path(sys.executable).parent / "forge"  # the console script clients run
CLIENT = "start-test-agent"
HEAVY = ("pydantic", "pydantic_core", "mcp", "mcp_types", "anyio", "eventsourcing",
         "torch", "transformers", "duckdb", "click", "yaml", "infer_forge.cli",
         "infer_forge.ledger.events", "infer_forge.ledger.store",
         "infer_forge.projections.memory")


def env_of(home: Path) -> dict[str, str]:
    import os

    return {**os.environ, "FORGE_HOME": str(home), "FORGE_AGENT_MODEL": ENV_MODEL}


@asynccontextmanager
async def client(home: Path, errlog: Path, *args: str):
    """The SDK's stdio client on `forge mcp ARGS` (the legacy handshake: `initialize`)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp_types import Implementation

    params = StdioServerParameters(command=str(FORGE_SCRIPT), args=["mcp", *args],
                                   env=env_of(home), cwd=str(REPO))
    with errlog.open("w") as err:
        async with Client(stdio_client(params, errlog=err), mode="legacy", cache=None,
                          client_info=Implementation(name=CLIENT, version="1")) as c:
            yield c


def raw_session(home: Path, messages: list[dict[str, Any]], answers: int, *args: str
                ) -> tuple[list[dict[str, Any]], str, int]:
    """`forge mcp ARGS` fed `messages` as JSON lines; once it wrote `answers` messages (and
    only then: the server ends at EOF, its requests in flight with it), EOF: what it wrote,
    its stderr, its exit status."""
    p = subprocess.Popen([str(FORGE_SCRIPT), "mcp", *args], env=env_of(home), cwd=str(REPO),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    watchdog = threading.Timer(120, p.kill)  # a server that never answers fails the test
    watchdog.start()
    try:
        assert p.stdin is not None and p.stdout is not None and p.stderr is not None
        p.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        p.stdin.flush()
        out = [json.loads(p.stdout.readline() or "null") for _ in range(answers)]
        p.stdin.close()
        out += [json.loads(line) for line in p.stdout.read().splitlines()]
        err = p.stderr.read()
        return out, err, p.wait()
    finally:
        watchdog.cancel()
        p.kill()
        p.wait()


def initialize(version: str, mid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": mid, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": CLIENT, "version": "1"}}}


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture
def bound_home(forge_home, tmp_path) -> Path:
    define(forge_home, make_task(tmp_path / "specs", "startt"))
    return forge_home


# --- the front's answer -------------------------------------------------------------------


def test_the_front_speaks_the_sdks_versions_and_names():
    from infer_forge.harness.mcp.server import problem_server
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

    assert wire.HANDSHAKE_VERSIONS == HANDSHAKE_PROTOCOL_VERSIONS
    assert wire.HANDSHAKE_VERSIONS[-1] == LATEST_HANDSHAKE_VERSION
    low = problem_server("x")._lowlevel_server.create_initialization_options()
    # The capabilities as the wire carries them: compared per protocol version below.
    assert set(wire.CAPABILITIES) <= set(low.capabilities.model_dump(exclude_none=True))
    assert (low.server_name, low.server_version) == (wire.SERVER_NAME, wire.server_version())
    assert low.instructions == wire.instructions(None, "x")


@pytest.mark.parametrize("version", [*wire.HANDSHAKE_VERSIONS, "1999-01-01"])
def test_initialize_is_answered_once_as_the_sdk_answers_it(bound_home, version):
    # The server (the SDK) gets the same `initialize` after the front answered it: its own
    # answer is compared with the front's (a difference is said on stderr) and dropped.
    out, err, rc = raw_session(bound_home, [
        initialize(version), INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}],
        2, "--task", "startt")
    assert rc == 0, err
    assert [m.get("id") for m in out] == [1, 2], out
    first = out[0]["result"]
    want = version if version in wire.HANDSHAKE_VERSIONS else wire.HANDSHAKE_VERSIONS[-1]
    assert first["protocolVersion"] == want
    assert first["serverInfo"] == {"name": "forge", "version": wire.server_version()}
    assert first["instructions"].startswith("infer-forge:")
    assert "bound to task startt" in first["instructions"]
    assert "first answer" not in err, err  # the SDK's answer was the same
    assert {t["name"] for t in out[1]["result"]["tools"]} == set(registry_schemas(bound_home))


def test_the_front_answers_before_the_sdk_pydantic_or_the_ledger_load(bound_home, tmp_path):
    # A fresh interpreter runs the console script's path with the server module replaced by
    # one that writes which modules were loaded when the front handed over (after its
    # answer) and ends the process.
    seen = tmp_path / "loaded.json"
    code = (
        "import json, sys, types\n"
        "fake = types.ModuleType('infer_forge.harness.mcp.server')\n"
        "def start(*a, **k):\n"
        f"    open({str(seen)!r}, 'w').write(json.dumps(sorted(sys.modules)))\n"
        "    raise SystemExit(7)\n"
        "fake.start = start\n"
        "fake.run_on = None\n"
        "sys.modules['infer_forge.harness.mcp.server'] = fake\n"
        "sys.argv = ['forge', 'mcp', '--task', 'startt']\n"
        "from infer_forge.entry import main\n"
        "main()\n")
    p = subprocess.run([sys.executable, "-c", code], env=env_of(bound_home), cwd=str(REPO),
                       input=json.dumps(initialize("2025-06-18")) + "\n", capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 7, p.stderr
    assert json.loads(p.stdout)["result"]["protocolVersion"] == "2025-06-18"
    loaded = set(json.loads(seen.read_text()))
    assert "infer_forge.harness.mcp.front" in loaded  # the walk saw the front
    assert sorted(m for m in HEAVY if m in loaded) == []


def test_only_a_plain_stdio_command_line_takes_the_front():
    assert front.stdio_args(["mcp"]) == (None, None)
    assert front.stdio_args(["--home", "/h", "mcp", "--task", "t"]) == ("/h", "t")
    assert front.stdio_args(["--home=/h", "mcp", "--task=t"]) == ("/h", "t")
    for argv in (["mcp", "--http", "127.0.0.1:0"], ["mcp", "--help"], ["mcp", "--task"],
                 ["mcp", "--task", ""], ["task", "list"], [], ["--home", "/h"],
                 ["mcp", "extra"], ["--version"]):
        assert front.stdio_args(argv) is None, argv


# --- start-up problems through the protocol -----------------------------------------------


def problem_session(home: Path, errlog: Path, *args: str) -> dict[str, Any]:
    """What a client sees of a server with a problem: its instructions, its tools, a few
    calls' answers, a resource read."""
    got: dict[str, Any] = {}

    async def session() -> None:
        async with client(home, errlog, *args) as c:
            got["instructions"] = c.instructions
            got["tools"] = [t.name for t in (await c.list_tools()).tools]
            got["calls"] = []
            for name, arguments in (("task_show", {"task_id": "x"}), ("block_start", {}),
                                    ("no_such_tool", {})):
                r = await c.call_tool(name, arguments)
                got["calls"].append((r.is_error, r.content[0].text))
            with pytest.raises(Exception) as e:
                await c.read_resource("forge://skills")
            got["resource"] = str(e.value)

    asyncio.run(session())
    return got


def assert_problem_said(got: dict[str, Any], errlog: Path, *words: str) -> str:
    line = got["instructions"].splitlines()[0]
    assert line.startswith("forge mcp cannot serve: ")
    problem = line.removeprefix("forge mcp cannot serve: ")
    for w in words:
        assert w in problem, problem
    assert "infer-forge: every call here" in got["instructions"]
    assert got["calls"] == [(True, problem)] * 3
    assert problem in got["resource"]
    assert set(got["tools"]) == set(registry_schemas(Path("."))), got["tools"]
    assert f"forge mcp: {problem}" in errlog.read_text().splitlines()
    return problem


def test_an_uninitialised_home_is_said_through_the_protocol(forge_home, tmp_path):
    got = problem_session(forge_home, tmp_path / "err")
    assert_problem_said(got, tmp_path / "err", f"no workspace at {forge_home}", "forge init")
    assert not forge_home.exists()  # nothing was created


def test_an_unknown_bound_task_is_said_through_the_protocol(bound_home, tmp_path):
    got = problem_session(bound_home, tmp_path / "err", "--task", "nope")
    assert_problem_said(got, tmp_path / "err", "unknown task 'nope'", "forge task list")
    assert not [e for e in events(bound_home, AGENTS_STREAM)
                if isinstance(e, E.AgentStepFailed)]  # a session that never started


def test_a_forge_toml_that_is_not_toml_is_said_through_the_protocol(bound_home, tmp_path):
    (bound_home / "forge.toml").write_text("[ledger\nurl = 1\n")
    got = problem_session(bound_home, tmp_path / "err", "--task", "startt")
    assert_problem_said(got, tmp_path / "err", str(bound_home / "forge.toml"))


def test_a_problem_only_the_real_open_finds_is_answered_by_every_call(bound_home, tmp_path):
    # forge.toml is TOML but its schema refuses it: the front's glance cannot tell, so the
    # instructions do not say it; the server's start does, and every call answers it.
    toml = bound_home / "forge.toml"
    toml.write_text(toml.read_text() + "\n[no_such_table]\nx = 1\n")
    got = problem_session(bound_home, tmp_path / "err")
    assert not got["instructions"].startswith("forge mcp cannot serve")
    problem = got["calls"][0][1]
    assert "no_such_table" in problem and str(toml) in problem
    assert got["calls"] == [(True, problem)] * 3
    assert f"forge mcp: {problem}" in (tmp_path / "err").read_text().splitlines()


def test_the_exit_status_says_a_session_had_a_problem(forge_home):
    out, err, rc = raw_session(forge_home, [initialize("2025-06-18")], 1)
    assert rc == 1 and "no workspace at" in err
    assert out[0]["result"]["instructions"].startswith("forge mcp cannot serve: no workspace")


# --- the bound task: resources and task_id ------------------------------------------------


def test_a_bound_server_lists_its_task_and_defaults_task_id(bound_home, tmp_path):
    async def session() -> None:
        async with client(bound_home, tmp_path / "err", "--task", "startt") as c:
            listed = {str(r.uri): r for r in (await c.list_resources()).resources}
            assert {"forge://tasks/startt/definition", "forge://tasks/startt/memory",
                    "forge://skills"} <= set(listed)
            d = json.loads((await c.read_resource("forge://tasks/startt/definition"))
                           .contents[0].text)
            assert d["task_id"] == "startt" and d["contract"]["gates"]
            m = json.loads((await c.read_resource("forge://tasks/startt/memory"))
                           .contents[0].text)
            assert m["status"] == "defined"
            told = await c.call_tool("task_memory", {})
            assert json.loads(told.content[0].text) == m  # the brief, as the tool's default
            tools = {t.name: t for t in (await c.list_tools()).tools}
            with_task = [n for n, t in tools.items() if "task_id" in
                         t.input_schema.get("properties", {})]
            assert {"task_show", "task_memory", "block_start", "run_command"} <= set(with_task)
            for n in with_task:
                assert "task_id" not in tools[n].input_schema.get("required", []), n
            assert "startt" in tools["task_show"].input_schema["properties"]["task_id"][
                "description"]
            r = await c.call_tool("task_show", {})
            assert not r.is_error, r.content[0].text
            assert json.loads(r.content[0].text)["task_id"] == "startt"
            r = await c.call_tool("block_start", {"sub_goal": "baseline", "candidate": {}})
            assert not r.is_error and json.loads(r.content[0].text)["block_id"] == "b1"

    asyncio.run(session())
    started = [e for e in events(bound_home, task_stream("startt"))
               if isinstance(e, E.LoopBlockStarted)]
    assert [(e.block_id, e.actor.name) for e in started] == [("b1", f"{CLIENT}/1")]


def test_an_unbound_server_asks_for_task_id(bound_home, tmp_path):
    async def session() -> None:
        async with client(bound_home, tmp_path / "err") as c:
            listed = [str(r.uri) for r in (await c.list_resources()).resources]
            assert listed == ["forge://skills"]
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert "task_id" in tools["task_show"].input_schema["required"]
            r = await c.call_tool("task_show", {})
            assert r.is_error
            assert r.content[0].text == ("task_show: task_id: give the task's id (this "
                                         "session is not bound to a task; `forge task list` "
                                         "shows them)")
            r = await c.call_tool("task_show", {"task_id": "startt"})
            assert not r.is_error

    asyncio.run(session())
    failed = [e for e in events(bound_home, AGENTS_STREAM) if isinstance(e, E.AgentStepFailed)]
    assert [(f.tool, f.task_id) for f in failed] == [("task_show", None)]


def test_sigterm_ends_a_stdio_server(bound_home):
    # A worker thread still waiting for the client's next line held the process after
    # SIGTERM (before the front, too): the wire ends its input when the server ends.
    import signal

    p = subprocess.Popen([str(FORGE_SCRIPT), "mcp", "--task", "startt"], env=env_of(bound_home),
                         cwd=str(REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdin is not None and p.stdout is not None and p.stderr is not None
        p.stdin.write("".join(json.dumps(m) + "\n" for m in (
            initialize("2025-06-18"), INITIALIZED,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})))
        p.stdin.flush()
        assert [json.loads(p.stdout.readline())["id"] for _ in range(2)] == [1, 2]
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 128 + signal.SIGTERM
        assert "Traceback" not in p.stderr.read()
    finally:
        p.kill()
        p.wait()


def test_a_real_client_shows_forges_reason(bound_home, tmp_path):
    # The MCP Inspector's CLI (the real client, from npm: tests/helpers/agent_clients.py)
    # on a server bound to a task that does not exist: the call answers the problem line.
    from tests.helpers import agent_clients

    inspector = agent_clients.need("inspector")
    home = tmp_path / "client-home"
    home.mkdir()
    p = agent_clients.run([str(inspector), "--cli", "-e", f"FORGE_HOME={bound_home}",
                           str(FORGE_SCRIPT), "mcp", "--task", "nope", "--method",
                           "tools/call", "--tool-name", "task_show"], home, cwd=REPO)
    called = json.loads(p.stdout)
    assert called.get("isError") is True, called
    text = "".join(c.get("text", "") for c in called["content"])
    assert text == unknown_task("nope", bound_home.resolve()), text
