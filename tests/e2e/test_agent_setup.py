"""The agent setup lines of README.md and of `forge mcp --help`, run as written with the real
clients (Claude Code, Codex CLI, the MCP Inspector: tests/helpers/agent_clients.py), each in
a loopback-only network namespace with a temporary HOME.

The README marks each block with `<!-- agent-setup:NAME … -->` on the line before its fence.
The shell blocks run verbatim in the checkout with FORGE_HOME set (as the tour sets it);
only the marked placeholders are replaced: the Codex block's `/path/to/infer-forge/.forge`
(the home) and `/path/to/infer-forge` (the checkout), and the Inspector's `npx
@modelcontextprotocol/inspector` (the pinned, installed one: npx would fetch). Codex shows
no connection in `codex mcp list`, so its block also drives `codex exec` against the scripted
Responses API (harness/testing/scripted_responses.py, reached through loopback_bridge.py):
forge's tools are offered in the first turn and a write tool runs, recorded with Codex as
the actor; without the approval mode the README explains, Codex refuses that tool. (Without
`required`, forge's tools are missing only when Codex builds the turn before forge has
answered `initialize`: a race, so not asserted here.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.harness.testing import loopback_bridge
from infer_forge.harness.testing.scripted_responses import ScriptedResponses

from tests.conftest import REPO, need
from tests.helpers import agent_clients

README = REPO / "README.md"
FORGE_BIN = REPO / ".venv" / "bin" / "forge"  # what the README's lines name
TASK = "tune-tiny-cpu"
BRIDGE = str(Path(loopback_bridge.__file__))
INSPECTOR_NPX = "npx @modelcontextprotocol/inspector"
CODEX_HOME_PLACEHOLDER = "/path/to/infer-forge/.forge"
CODEX_CHECKOUT_PLACEHOLDER = "/path/to/infer-forge"


def readme_block(name: str) -> str:
    """The fenced block after `<!-- agent-setup:NAME` in README.md."""
    text = README.read_text()
    m = re.search(rf"^<!-- agent-setup:{re.escape(name)}\b.*?-->\n```[a-z]*\n(.*?)^```$",
                  text, re.S | re.M)
    assert m, f"README.md has no block marked <!-- agent-setup:{name} -->"
    return m.group(1)


def commands(block: str) -> list[str]:
    """A shell block's commands (continuation lines joined), comments kept for bash."""
    return [c for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def forge_env(home: Path) -> dict[str, str]:
    return {"FORGE_HOME": str(home)}


def new_forge_home(path: Path, *, define: bool) -> Path:
    """`forge init` (the tour's step) in a fresh FORGE_HOME, and the task when `define`."""
    env = {**os.environ, "FORGE_HOME": str(path)}
    steps = [["init"]] + ([["task", "new", "examples/tasks/tune-tiny-cpu.yaml"]] if define else [])
    for args in steps:
        done = subprocess.run([str(FORGE_BIN), *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"forge {' '.join(args)}: {done.stderr}"
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A FORGE_HOME with the tour's init and the README's task defined, shared by the tests
    that only connect to it."""
    need(FORGE_BIN.is_file(), f"{FORGE_BIN} (make venv) is what the README's lines run")
    return new_forge_home(tmp_path_factory.mktemp("agent-setup") / "forge-home", define=True)


def bash(line: str, home: Path, forge_home: Path, **env: str) -> subprocess.CompletedProcess:
    """One README line run by bash in the checkout, in the client's namespace."""
    done = agent_clients.run(["bash", "-c", f"set -eo pipefail\n{line}"], home, cwd=REPO,
                             env={**forge_env(forge_home), **env}, timeout=120)
    assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


CONNECTED = re.compile(rf"^forge: .*\bforge mcp --task {TASK} - ✔ Connected$", re.M)


def test_readme_claude_code_lines_connect(tmp_path):
    """The README's Claude Code block, from a fresh home (the tour's init only): the task is
    defined, `claude mcp add` registers forge with that home, `claude mcp list` connects."""
    need(FORGE_BIN.is_file(), f"{FORGE_BIN} (make venv) is what the README's lines run")
    agent_clients.need("claude")
    forge_home = new_forge_home(tmp_path / "forge-home", define=False)
    home = tmp_path / "home"
    out = "".join(bash(line, home, forge_home).stdout for line in commands(readme_block("claude")))
    assert CONNECTED.search(out), out
    server = json.loads((home / ".claude.json").read_text())["mcpServers"]["forge"]
    assert server["command"] == str(FORGE_BIN)
    assert server["args"] == ["mcp", "--task", TASK]
    assert server["env"]["FORGE_HOME"] == str(forge_home)


def test_readme_claude_code_http_lines_connect(workspace, tmp_path):
    """The README's HTTP block: `forge mcp --http` in the background (the test waits for its
    port before the next line, as a person would), `claude mcp add … --transport http`,
    `claude mcp list` connects over HTTP. The namespace is the test's own: port 8765 is free."""
    agent_clients.need("claude")
    serve, *rest = commands(readme_block("claude-http"))
    assert serve.rstrip().endswith("&"), serve
    port = re.search(r"--http 127\.0\.0\.1:(\d+)", serve)
    assert port, serve
    # One shell for the block, so the server lives in the namespace the client runs in; the
    # wait polls the port (bash's /dev/tcp) for at most 60 s.
    wait = (f"for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/{port.group(1)}) 2>/dev/null "
            "&& break; [ $i = 600 ] && exit 9; sleep 0.1; done")
    # The server is stopped with the shell: still up at the end, it is killed without error.
    script = [serve, "server=$!", wait, *rest, "kill $server"]
    out = bash("\n".join(script), tmp_path / "home", workspace).stdout
    assert re.search(rf"^forge: http://127\.0\.0\.1:{port.group(1)}/mcp \(HTTP\) - ✔ Connected$",
                     out, re.M), out


def test_forge_mcp_help_example_connects(workspace, tmp_path):
    """`forge mcp --help`'s Claude Code example, run as printed (`forge` on PATH)."""
    agent_clients.need("claude")
    help_text = subprocess.run([str(FORGE_BIN), "mcp", "--help"], capture_output=True,
                               text=True, timeout=60, check=True).stdout
    lines = [ln.strip() for ln in help_text.splitlines() if ln.strip().startswith("claude mcp add")]
    assert len(lines) == 1, help_text
    home = tmp_path / "home"
    path = f"{FORGE_BIN.parent}{os.pathsep}{agent_clients.node_env(home)['PATH']}"
    bash(lines[0], home, workspace, PATH=path)
    out = bash("claude mcp list", home, workspace, PATH=path).stdout
    assert CONNECTED.search(out), out


def test_readme_inspector_lines_list_and_call(workspace, tmp_path):
    """The README's Inspector lines: tools/list names every forge tool; tools/call of
    task_show answers the bound task's definition."""
    inspector = agent_clients.need("inspector")
    block = readme_block("inspector")
    assert block.count(INSPECTOR_NPX) == 2, block
    lines = commands(block.replace(INSPECTOR_NPX, str(inspector)))
    home = tmp_path / "home"
    listed = json.loads(bash(lines[0], home, workspace).stdout)
    names = {t["name"] for t in listed["tools"]}
    assert set(TOOLS) | {"engine_up", "evaluate", "bench", "journal_sql"} <= names, names
    called = json.loads(bash(lines[1], home, workspace).stdout)
    assert not called.get("isError"), called
    text = "".join(c.get("text", "") for c in called["content"])
    assert f'"id": "{TASK}"' in text or f'"task_id": "{TASK}"' in text, text
    assert "Raise output throughput at concurrency 8" in text, text


def codex_config(forge_home: Path, drop: str | None = None) -> str:
    """The README's Codex block, its placeholders replaced; `drop`: leave out that key."""
    block = readme_block("codex")
    assert CODEX_HOME_PLACEHOLDER in block, block
    text = block.replace(CODEX_HOME_PLACEHOLDER, str(forge_home))
    text = text.replace(CODEX_CHECKOUT_PLACEHOLDER, str(REPO))
    if drop is not None:
        kept = [ln for ln in text.splitlines() if not ln.startswith(f"{drop} =")]
        assert len(kept) == len(text.splitlines()) - 1, f"no {drop} in the README's block"
        text = "\n".join(kept) + "\n"
    return text


def codex_home(tmp_path: Path, config: str) -> Path:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(config)
    return home


# `codex exec` against the scripted Responses API: it asks for block_start (a write tool),
# then says it is done.
CODEX_SCRIPT = [
    {"tool_calls": [{"name": "block_start", "arguments": {
        "task_id": TASK, "sub_goal": "measure the baseline", "candidate": {}}}]},
    {"text": "done"},
]
API_PORT = 43118  # the scripted API's port inside the client's namespace (always free there)


def codex_exec(home: Path, tmp_path: Path) -> tuple[list[dict], str]:
    """`codex exec` with the config in `home`, its model the scripted API (reached through
    loopback_bridge.py): the turns Codex sent, and what block_start answered."""
    provider = (f'{{name = "scripted", base_url = "http://127.0.0.1:{API_PORT}/v1", '
                'wire_api = "responses"}')
    with ScriptedResponses(CODEX_SCRIPT, model="gpt-5-codex") as api:
        argv = [sys.executable, BRIDGE, str(API_PORT), api.socket_path, "--",
                "codex", "exec", "--skip-git-repo-check", "-c", 'model="gpt-5-codex"',
                "-c", 'model_provider="scripted"', "-c", f"model_providers.scripted={provider}",
                "Start the baseline block."]
        done = agent_clients.run(argv, home, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:], api.errors)
        assert not api.errors, api.errors
        assert len(api.turns) == 2, "codex never answered the tool call"
        return api.turns, "\n".join(api.result_of("block_start", api.turns[-1]))


def forge_tools_offered(request: dict) -> set[str]:
    return {t["name"] for ns in request["tools"] if ns.get("name") == "mcp__forge"
            for t in ns.get("tools", [])}


def ledger(forge_home: Path, *args: str) -> list[dict]:
    done = subprocess.run([str(FORGE_BIN), "log", "--json", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "FORGE_HOME": str(forge_home)})
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_readme_codex_config_listed(workspace, tmp_path):
    """`codex mcp list` reads the README's block; each of its keys is Codex's own (Codex
    accepts an unknown key silently, so each is given a value of the wrong type, which Codex
    refuses naming that key)."""
    agent_clients.need("codex")
    config = codex_config(workspace)
    home = codex_home(tmp_path, config)
    listed = agent_clients.run(["codex", "mcp", "list", "--json"], home, timeout=60)
    assert listed.returncode == 0, listed.stderr
    forge = {s["name"]: s for s in json.loads(listed.stdout)}["forge"]
    assert forge["enabled"] is True
    assert forge["transport"]["command"] == str(FORGE_BIN)
    assert forge["transport"]["args"] == ["mcp", "--task", TASK]
    assert forge["transport"]["env"]["FORGE_HOME"] == str(workspace)
    keys = re.findall(r"^(\w+) = ", config, re.M)
    assert {"command", "required", "default_tools_approval_mode"} <= set(keys), keys
    for key in keys:
        wrong = re.sub(rf"^{key} = .*$", f"{key} = {{ wrong = 1 }}", config, flags=re.M)
        (home / ".codex" / "config.toml").write_text(wrong)
        done = agent_clients.run(["codex", "mcp", "list"], home, timeout=60)
        assert done.returncode != 0 and f"mcp_servers.forge.{key}" in done.stderr, (key, done)


def test_readme_codex_config_offers_and_runs_forge_tools(tmp_path):
    """`codex exec` with the README's block: forge's tools are in the first request and
    block_start runs, recorded with Codex and its model as the actor."""
    agent_clients.need("codex")
    need(FORGE_BIN.is_file(), f"{FORGE_BIN} (make venv) is what the README's lines run")
    forge_home = new_forge_home(tmp_path / "forge-home", define=True)
    requests, answered = codex_exec(codex_home(tmp_path, codex_config(forge_home)), tmp_path)
    assert set(TOOLS) <= forge_tools_offered(requests[0]), requests[0]["tools"]
    assert '"block_id": "b1"' in answered, answered
    started = ledger(forge_home, "--type", "LoopBlockStarted")
    assert [e["actor"] for e in started] == [
        {"kind": "agent", "name": "codex-mcp-client/0.171.0", "model": "gpt-5-codex"}]


def test_codex_without_the_approval_mode(tmp_path):
    """Without `default_tools_approval_mode` (the README says why) forge's tools are offered
    but Codex refuses the write tool under `codex exec`: nothing reaches the ledger."""
    agent_clients.need("codex")
    need(FORGE_BIN.is_file(), f"{FORGE_BIN} (make venv) is what the README's lines run")
    forge_home = new_forge_home(tmp_path / "forge-home", define=True)
    config = codex_config(forge_home, drop="default_tools_approval_mode")
    requests, answered = codex_exec(codex_home(tmp_path, config), tmp_path)
    assert set(TOOLS) <= forge_tools_offered(requests[0])
    assert "approval" in answered, answered
    assert ledger(forge_home, "--type", "LoopBlockStarted") == []
