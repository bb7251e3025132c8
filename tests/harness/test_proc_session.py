"""Commands in their own session (`proc.session_launch`): the leader reports the command's
status as its own, and neither a timeout nor a kill -9 of forge leaves a grandchild behind.
Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infer_forge.harness.proc import alive, group_alive, run_in_session, session_launch
from infer_forge.harness.tool_calls.calls import run_tool

from tests.conftest import REPO


def _wait_gone(pid: int, what: str) -> None:
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, f"{what} (pid {pid}) outlived its session"
        time.sleep(0.02)


def _read_pid(path: Path) -> int:
    deadline = time.monotonic() + 30
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


def test_the_leader_reports_the_commands_exit_code_and_signal(tmp_path):
    env = dict(os.environ)
    out = run_in_session(["bash", "-c", "echo hi; echo err >&2; exit 3"], tmp_path, env, 30)
    assert (out.exit_code, out.stdout, out.stderr, out.error) == (3, "hi\n", "err\n", None)
    out = run_in_session(["bash", "-c", "kill -TERM $$"], tmp_path, env, 30)
    assert out.exit_code == -signal.SIGTERM
    out = run_in_session([sys.executable, "-c", "import os; os.abort()"], tmp_path, env, 30)
    assert out.exit_code == -signal.SIGABRT
    # SIGPIPE is the default again in the command (Python ignores it in the leader)
    out = run_in_session(["bash", "-c", "yes | head -c 1"], tmp_path, env, 30)
    assert (out.exit_code, out.stdout) == (0, "y")


def test_a_program_that_is_not_there_is_named(tmp_path):
    out = run_in_session(["/nonexistent/tool", "x"], tmp_path, dict(os.environ), 30)
    assert out.exit_code == 127
    assert "cannot start /nonexistent/tool: No such file or directory" in out.stderr


def test_input_reaches_the_command_through_the_leader(tmp_path):
    run = run_tool(None, ["bash", "-c", "tr a-z A-Z"], cwd=tmp_path, input="shout\n",
                   own_session=True, timeout=30)
    assert (run.returncode, run.stdout) == (0, "SHOUT\n")


def test_a_timeout_kills_the_commands_children_too(tmp_path):
    pidfile = tmp_path / "sleep.pid"
    out = run_in_session(["bash", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], tmp_path,
                         dict(os.environ), 1.0)
    assert out.error == "timed out after 1s"
    _wait_gone(_read_pid(pidfile), "the command's child")


PARENT = """
import os, subprocess, sys, time
from infer_forge.harness.proc import session_launch
launch, guard = session_launch(["bash", "-c", "sleep 300 & echo $! > %s; wait"])
p = subprocess.Popen(launch, **guard)
print(p.pid, flush=True)
time.sleep(300)
"""


def test_a_kill_9_of_forge_takes_the_whole_session(tmp_path):
    """The forge side (a real process calling `session_launch`) is killed with SIGKILL: the
    leader's parent-death signal fires and the command's own child dies with it."""
    pidfile = tmp_path / "sleep.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT % pidfile],
                              stdout=subprocess.PIPE, text=True, cwd=REPO,
                              start_new_session=True)
    try:
        assert parent.stdout is not None
        leader = int(parent.stdout.readline())
        grandchild = _read_pid(pidfile)
        assert os.getpgid(grandchild) == leader  # the leader's session holds the command
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        _wait_gone(grandchild, "the command's child")
        deadline = time.monotonic() + 30
        while group_alive(leader):
            assert time.monotonic() < deadline, "the session outlived forge"
            time.sleep(0.02)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_session_launch_starts_a_new_session():
    launch, guard = session_launch(["true"])
    assert guard["start_new_session"] is True and launch[-1] == "true"


def test_the_command_sees_exactly_the_environment_given(tmp_path):
    """Not one variable more: the leader's own Python start must not leak into it (PEP 538
    adds LC_CTYPE=C.UTF-8 to a Python started in the C locale)."""
    env = {"PATH": os.environ["PATH"], "FORGE_TASK_ID": "t1", "ODD": "a=b c\tü"}
    out = run_in_session(["env", "-0"], tmp_path, env, 30)
    assert out.exit_code == 0, out.stderr
    seen = dict(e.split("=", 1) for e in out.stdout.split("\0") if e)
    assert seen == env
