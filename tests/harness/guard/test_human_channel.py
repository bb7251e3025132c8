"""Issue 27, item 1: granting an approval needs a human channel an agent's process cannot
reach (harness/guard/human_channel.py), and `--by` is not a claim of identity.

All through the real CLI in real processes: without a terminal and without the approver key
nothing is granted; a wrong key grants nothing; the terminal shows the bound action and takes
the approval's last six characters (a real pseudo-terminal as the controlling one); a
sandboxed tool call running `forge approve` with the key's path reads an empty file and grants
nothing; the grant records the OS user and the channel, with `--by` as what they said.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import termios
import time
from pathlib import Path

import pytest
from infer_forge.harness.guard import approvals as A
from infer_forge.harness.guard.human_channel import KEY_ENV, approver_key, key_path, os_user
from infer_forge.harness.tool_calls.calls import run_tool
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import APPROVALS_STREAM

from tests.conftest import FORGE, REPO, run_forge

from .test_sandbox import has_bwrap

AGENT = E.Actor.agent("hostile/1", "m-1")
NO_KEY = {KEY_ENV: ""}  # the default the tests' run_forge sets, taken away


def ask(ws) -> str:
    return A.request(ws, "production-call", "http://prod.example:30000",
                     {"method": "POST", "path": "/flush_cache"}, "the cache\r is stale",
                     AGENT)


def state(ws, aid: str) -> str:
    return A.read_approvals(ws.ledger).find(aid).state(A.clock())


def granted(ws) -> list[E.ApprovalGranted]:
    return [r.event for r in ws.ledger.stream(APPROVALS_STREAM)
            if isinstance(r.event, E.ApprovalGranted)]


def test_without_a_terminal_or_the_key_nothing_is_granted(workspace):
    aid = ask(workspace)
    r = run_forge("approve", aid, "--reason", "ok", "--by", "alice", env=NO_KEY, process=True)
    assert r.returncode != 0 and "no terminal to confirm on" in r.stderr
    assert f"--key-file {key_path(workspace)}" in r.stderr and len(r.stderr.splitlines()) == 1
    assert state(workspace, aid) == "pending" and granted(workspace) == []
    assert oct(key_path(workspace).stat().st_mode & 0o777) == "0o600"


def test_a_wrong_key_grants_nothing_and_the_right_one_records_who(workspace, tmp_path):
    aid = ask(workspace)
    wrong = tmp_path / "guess.key"
    wrong.write_text("0" * 64 + "\n")
    r = run_forge("approve", aid, "--reason", "ok", "--key-file", str(wrong), env=NO_KEY)
    assert r.returncode != 0 and "does not hold this workspace's approver key" in r.stderr
    assert state(workspace, aid) == "pending"
    r = run_forge("approve", aid, "--reason", "ok", "--by", "alice", "--json",
                  "--key-file", str(key_path(workspace)), env=NO_KEY)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["decided_by"]["name"] == f"{os_user()} via key, says alice"
    assert [g.actor.name for g in granted(workspace)] == [f"{os_user()} via key, says alice"]


def _on_a_terminal(args: list[str], answer: str, env: dict[str, str]) -> tuple[int, str]:
    """Run forge with a fresh pseudo-terminal as its controlling terminal; type `answer`
    once it asks. (exit code, what the terminal showed)."""
    master, slave = os.openpty()

    def take_terminal() -> None:  # after start_new_session's setsid; fd 0 is the slave
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen([*FORGE, *args], stdin=slave, stdout=slave, stderr=slave,
                         env=env, cwd=str(REPO), start_new_session=True,
                         preexec_fn=take_terminal)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 60
    typed = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the terminal closed: forge exited
                    break
                if not chunk:
                    break
                shown += chunk
                if not typed and b"to grant it: " in shown:
                    os.write(master, answer.encode() + b"\n")
                    typed = True
            elif p.poll() is not None:
                break
        return p.wait(timeout=30), shown.decode(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)


def test_on_a_terminal_the_person_types_the_approvals_code(workspace):
    aid = ask(workspace)
    env = {**os.environ, "FORGE_HOME": str(workspace.home), KEY_ENV: ""}
    code, shown = _on_a_terminal(["approve", aid, "--reason", "checked"], "nope", env)
    assert code != 0 and "confirmation did not match" in shown
    # It showed the bound action, its stored text unable to move the cursor.
    assert "method=POST" in shown and "path=/flush_cache" in shown
    assert "the cache\\u000d is stale" in shown
    assert state(workspace, aid) == "pending"
    code, shown = _on_a_terminal(["approve", aid, "--reason", "checked"], aid[-6:], env)
    assert code == 0, shown
    assert [g.actor.name for g in granted(workspace)] == [f"{os_user()} via tty"]


def test_a_sandboxed_call_cannot_read_the_key_or_grant(workspace, tmp_path):
    has_bwrap()
    aid = ask(workspace)
    key = key_path(workspace)
    approver_key(workspace)  # it exists before the call: the sandbox hides existing files
    run = run_tool(workspace, [*FORGE, "approve", aid, "--reason", "mine", "--key-file",
                               str(key)], cwd=tmp_path, timeout=60)
    assert run.returncode != 0
    assert "does not hold this workspace's approver key" in run.stderr, run.stderr
    peek = run_tool(workspace, ["cat", str(key)], cwd=tmp_path, timeout=30)
    assert peek.returncode == 0 and peek.stdout == ""
    assert state(workspace, aid) == "pending" and granted(workspace) == []


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_deny_needs_no_channel_but_records_the_os_user(workspace, command):
    aid = ask(workspace)
    if command == "deny":
        r = run_forge("deny", aid, "--reason", "no", "--by", "bo", "--json", env=NO_KEY)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["decided_by"]["name"] == f"{os_user()} via cli, says bo"
    else:
        r = run_forge("approve", aid, "--reason", "", env=NO_KEY)
        assert r.returncode != 0 and "--reason must say why" in r.stderr
        assert Path(workspace.home).is_dir() and state(workspace, aid) == "pending"
