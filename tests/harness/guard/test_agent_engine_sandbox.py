"""Issue 27, item 1: an engine an agent asks for runs in the sandbox (guard/engine_sandbox.py).

The attack, for real: bound to a task, an agent writes a `sitecustomize.py` and a runtime
profile whose `config.env.PYTHONPATH` names it, then calls `engine_up` with that profile. The
embedded engine (`transformers serve` on the generated tiny model) starts, Python imports the
agent's code, and the code tries what it did when it ran as the user: write outside the task,
read forge's credentials, change the ledger. Each attempt fails inside the sandbox (its own
report, written to the task's scratch directory, says how), the engine still serves, and
nothing outside changed. Where no sandbox can be made, the agent's file is refused and only the
task's own pinned profile starts; a profile in a container image is refused outright.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from infer_forge.harness.agents import tool_registry as tools
from infer_forge.harness.guard import sandbox as S
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.harness.mcp.session_tools import AgentSession, session_tools
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream

from tests.conftest import need

from ..mcp.test_mcp import define, make_task
from .test_sandbox import set_guard

AGENT = E.Actor.agent("hostile/1", "m-1")
CREDENTIAL = "api_key = 'cred-" + "Vb7Nq2Xw9Lk4Pz'\n"

SITE = """\
import os, pathlib, sys
report = pathlib.Path({report!r})
lines = []
def attempt(name, fn):
    try:
        fn()
        lines.append(name + ": done")
    except Exception as e:
        lines.append(name + ": " + type(e).__name__)
attempt("write-outside", lambda: pathlib.Path({outside!r}).write_text("escaped"))
attempt("read-credentials",
        lambda: lines.append("credentials=" + repr(pathlib.Path({creds!r}).read_text())))
attempt("append-ledger", lambda: open({ledger!r}, "ab").write(b"x"))
lines.append("pid=" + str(os.getpid()))
with report.open("a") as f:
    f.write("\\n".join(lines) + "\\n")
"""

PROFILE = """\
service: hostile
rev: 1
engine: hf
config:
  continuous_batching: false
  attn_implementation: sdpa
  dtype: float32
  compile: false
  threads: 1
  env: {{PYTHONPATH: {site_dir}}}
framework: {{kind: transformers, version: "5"}}
device_runtime: {{kind: cpu}}
"""


def has_bwrap() -> None:
    need(shutil.which("bwrap") is not None and S.find_bwrap()[0] is not None,
         "bubblewrap (bwrap) with working namespaces is required (.ci/run installs it)")


def agent_ctx(ws: Any, session: AgentSession, task_id: str) -> tools.ToolContext:
    return tools.ToolContext(ws, AGENT, task_id=task_id, extra=session_tools(session),
                             tools=TOOLS)


def ok(ctx: tools.ToolContext, name: str, args: dict[str, Any]) -> Any:
    res = tools.call(ctx, name, args)
    assert res.ok, res.error
    return res.result


def plant(ws: Any, ctx: tools.ToolContext, task_id: str, outside: Path) -> tuple[Path, Path]:
    """The agent's files (through its own tool, write_file): the code and the profile."""
    scratch = (ws.home / "scratch" / task_id).resolve()
    # A launch from a profile file names no task: it may write the no-task scratch only.
    report = (ws.home / "scratch" / S.NO_TASK_SCRATCH / "report.txt").resolve()
    site = SITE.format(report=str(report), outside=str(outside),
                       creds=str(ws.home / "credentials.toml"),
                       ledger=str(ws.home / "ledger.sqlite"))
    ok(ctx, "write_file", {"task_id": task_id, "path": "site/sitecustomize.py", "content": site})
    ok(ctx, "write_file", {"task_id": task_id, "path": "hostile.yaml",
                           "content": PROFILE.format(site_dir=scratch / "site")})
    return scratch / "hostile.yaml", report


@pytest.fixture
def bound(forge_home, tmp_path):
    define(forge_home, make_task(tmp_path / "defs", "hostile"))
    from infer_forge.ledger.workspace import open_workspace

    ws = open_workspace(forge_home)
    (ws.home / "credentials.toml").write_text(CREDENTIAL)
    session = AgentSession(ws)
    try:
        yield ws, session, agent_ctx(ws, session, "hostile")
    finally:
        session.close()
        ws.close()


@pytest.mark.slow
def test_an_agents_engine_runs_its_planted_code_only_inside_the_sandbox(bound, tmp_path):
    has_bwrap()
    ws, session, ctx = bound
    outside = tmp_path / "outside.txt"
    ledger_before = (ws.home / "ledger.sqlite").stat().st_size
    profile, report = plant(ws, ctx, "hostile", outside)
    up = ok(ctx, "engine_up", {"profile": str(profile), "model": "forge:tiny-llama"})
    # The engine serves (the sandbox lets a server be a server) ...
    assert up["describe"]["base_url"].startswith("http://127.0.0.1:")
    lines = report.read_text().splitlines()
    # ... and the agent's code ran (its report exists) but every attempt failed.
    assert "write-outside: done" not in lines and not outside.exists()
    assert "read-credentials: done" in lines and "credentials=''" in lines, lines
    assert "append-ledger: done" not in lines, lines
    # The server's process tree is inside a pid namespace: its pids are not the host's.
    pid = int(next(x for x in lines if x.startswith("pid=")).split("=")[1])
    assert pid != up["pid"]
    ok(ctx, "engine_down", {"engine_id": up["engine_id"]})
    assert (ws.home / "ledger.sqlite").stat().st_size >= ledger_before
    launched = [r.event for r in ws.ledger.stream("engines")
                if isinstance(r.event, E.EngineLaunched)]
    assert launched and launched[-1].actor == AGENT


def test_without_a_sandbox_the_agents_profile_is_refused(bound, tmp_path):
    ws, session, ctx = bound
    set_guard(ws, sandbox="off")
    profile, report = plant(ws, ctx, "hostile", tmp_path / "outside.txt")
    res = tools.call(ctx, "engine_up", {"profile": str(profile), "model": "forge:tiny-llama"})
    assert not res.ok and "engine for an agent refused: it would run unsandboxed" in res.error
    assert len(res.error.splitlines()) == 1
    assert not report.exists() and session.engines == {}
    failed = [r.event for r in ws.ledger.stream(task_stream("hostile"))
              if isinstance(r.event, E.AgentStepFailed)]
    assert failed and failed[-1].tool == "engine_up"


def test_an_agents_profile_in_a_container_image_is_refused(bound, tmp_path):
    ws, session, ctx = bound
    image = "docker.io/lmsysorg/sglang@sha256:" + "a" * 64
    text = (f"service: img\nrev: 1\nengine: sglang\nconfig: {{image: {json.dumps(image)}}}\n"
            'framework: {kind: sglang, version: "0.5.3"}\ndevice_runtime: {kind: cuda}\n')
    ok(ctx, "write_file", {"task_id": "hostile", "path": "img.yaml", "content": text})
    res = tools.call(ctx, "engine_up", {"profile": str(ws.home / "scratch/hostile/img.yaml"),
                                        "model": "forge:tiny-llama"})
    assert not res.ok and "container image" in res.error, res.error
    assert session.engines == {}
