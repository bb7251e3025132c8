"""Environment isolation of recorded tool calls (harness/guard/sandbox.py), for real: bubblewrap
(`bwrap`, installed by .ci/run: skipped locally without it, a failure in CI), real processes,
the real ledger and CLI. Each attempt that must be refused is refused and recorded: a write
outside the call's directories, a secret it was not given (a variable, a credentials file),
the network with the network off; the profile is in the ToolInvoked event; unsandboxed runs
say so in the event and on stderr; `required` without bwrap refuses in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.guard import sandbox as S
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import run_command, start_block
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.tool_calls.calls import run_tool
from infer_forge.ledger import events as E
from infer_forge.ledger.codec import decode
from infer_forge.ledger.config import load_config
from infer_forge.ledger.specs import canonical, load_task
from infer_forge.ledger.streams import task_stream

from tests.conftest import need, run_forge

from ..loop.test_loop import make_task_dir

PY = sys.executable
SECRET = "tok-" + "Zq9x7Lm2Wp4Rt6Yu8Io0Kj3Hg5"  # the value of MY_SERVICE_TOKEN in forge's env


def has_bwrap() -> None:
    need(shutil.which("bwrap") is not None and S.find_bwrap()[0] is not None,
         "bubblewrap (bwrap) with working namespaces is required (.ci/run installs it)")


def set_guard(ws, **values: object) -> None:
    """Set keys of forge.toml's [guard] table (the sandbox's) and reload the config."""
    toml = ws.home / "forge.toml"
    text = toml.read_text()
    for key in values:
        text = re.sub(rf"(?m)^{key} = .*\n", "", text)
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    toml.write_text(text.replace("[guard]\n", "[guard]\n" + lines, 1))
    ws.config = load_config(ws.home)


def task(ws, root: Path, task_id: str, sandbox: str | None = None) -> Path:
    """A manual task (the tiny example's) with this `sandbox:` mapping, its block open."""
    path = make_task_dir(root, task_id, executor="{kind: manual}")
    text = re.sub(r"(?m)^sandbox: .*\n", "", path.read_text())
    path.write_text(text + (f"sandbox: {sandbox}\n" if sandbox else ""))
    define_task(ws, path)
    start_block(ws, task_id, "sandbox")
    return path


def tool_events(ws, task_id: str) -> list[E.ToolInvoked]:
    return [r.event for r in ws.ledger.stream(task_stream(task_id))
            if isinstance(r.event, E.ToolInvoked)]


def py(code: str) -> list[str]:
    return [PY, "-c", code]


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRET)


# --- writes -------------------------------------------------------------------------------


def test_a_write_outside_the_task_directories_fails_and_leaves_no_file(workspace, tmp_path):
    has_bwrap()
    task(workspace, tmp_path / "s", "w1")
    scratch = workspace.home / "scratch" / "w1"
    outside = tmp_path / "outside.txt"
    next_to_task = tmp_path / "s" / "tasks" / "planted.txt"
    info = run_command(workspace, "w1", py(
        "import sys\n"
        "open('inside.txt', 'w').write('ok')\n"
        "bad = 0\n"
        f"for p in ({str(outside)!r}, {str(next_to_task)!r}, {str(workspace.home)!r} + "
        "'/ledger.sqlite'):\n"
        "    try:\n"
        "        open(p, 'a').write('x')\n"
        "    except OSError as e:\n"
        "        print('refused', p, e.strerror)\n"
        "    else:\n"
        "        bad += 1\n"
        "sys.exit(bad)"), cwd=str(scratch), tee=False)
    assert info["exit_code"] == 0  # all three writes refused
    assert (scratch / "inside.txt").read_text() == "ok"  # its own directory is writable
    assert not outside.exists() and not next_to_task.exists()
    out = workspace.artifacts.text(info["stdout_digest"])
    assert out.count("Read-only file system") == 3
    ev = tool_events(workspace, "w1")[-1]
    assert ev.sandbox["kind"] == "bwrap" and ev.sandbox["read_only_root"] is True
    assert str(scratch.resolve()) in ev.sandbox["writable"]
    assert str(tmp_path.resolve()) not in ev.sandbox["writable"]

    # The task's cwd outside its directories (where `forge run` was started) is read-only.
    info = run_command(workspace, "w1", ["touch", "here.txt"], cwd=str(tmp_path), tee=False)
    assert info["exit_code"] != 0 and not (tmp_path / "here.txt").exists()


def test_a_build_is_sandboxed_too(workspace, tmp_path):
    """The build tool runs its command in the sandbox (under its supervisor): the member's
    build writes outside the member and fails until forge.toml lets it."""
    has_bwrap()
    from infer_forge.harness.tool_calls.build import build

    from ...repos.test_build import Setup, let_builds_reach

    s = Setup(tmp_path, workspace)
    out = build(workspace, s.mono, "app", s.app)
    assert not out.success and "Read-only file system" in out.error
    assert out.tool_event.sandbox["kind"] == "bwrap" and s.runs() == []
    let_builds_reach(workspace, tmp_path)
    again = build(workspace, s.mono, "app", s.app)
    assert again.success and s.runs() == ["-"]
    assert str(tmp_path.resolve()) in again.tool_event.sandbox["writable"]


# --- secrets ------------------------------------------------------------------------------


READ_TOKEN = py("import os; v = os.environ.get('MY_SERVICE_TOKEN'); "
                "print('absent' if v is None else 'MY_SERVICE_TOKEN=' + v)")


def test_a_secret_not_given_is_absent_and_a_named_one_is_never_recorded(workspace, tmp_path,
                                                                      secret_env):
    has_bwrap()
    task(workspace, tmp_path / "a", "plain")
    info = run_command(workspace, "plain", READ_TOKEN, tee=False)
    assert workspace.artifacts.text(info["stdout_digest"]).strip() == "absent"
    ev = tool_events(workspace, "plain")[-1]
    assert "MY_SERVICE_TOKEN" not in ev.sandbox["env_names"] and ev.sandbox["secret_names"] == []

    task(workspace, tmp_path / "b", "named", "{secret_env: [MY_SERVICE_TOKEN]}")
    info = run_command(workspace, "named", READ_TOKEN, tee=False)
    shown = workspace.artifacts.text(info["stdout_digest"])
    assert shown.startswith("MY_SERVICE_TOKEN=[REDACTED")  # it was there, and redacted
    ev = tool_events(workspace, "named")[-1]
    assert ev.sandbox["secret_names"] == ["MY_SERVICE_TOKEN"]
    # The value is in no stored byte: ledger, artifacts, scratch.
    for p in workspace.home.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_credential_files_read_as_empty(workspace, tmp_path):
    has_bwrap()
    secret_file = tmp_path / "service.key"
    secret_file.write_text(SECRET)
    toml = workspace.home / "forge.toml"
    toml.write_text(toml.read_text().replace("files = []",
                                             f"files = [{json.dumps(str(secret_file))}]", 1))
    workspace.config = load_config(workspace.home)
    task(workspace, tmp_path / "s", "f1")
    info = run_command(workspace, "f1", py(f"print(repr(open({str(secret_file)!r}).read()))"),
                       tee=False)
    assert info["exit_code"] == 0
    assert workspace.artifacts.text(info["stdout_digest"]).strip() == "''"
    assert str(secret_file) in tool_events(workspace, "f1")[-1].sandbox["hidden"]


def test_the_approver_key_file_forge_was_given_is_hidden_and_its_name_not_passed(
        workspace, tmp_path, monkeypatch):
    """A person's approver key kept outside FORGE_HOME and named by FORGE_APPROVER_KEY_FILE
    (guard/human_channel.py): a call neither gets the variable (a `FORGE_*` name) nor reads
    the file it names, even when its task asks for the variable by name."""
    has_bwrap()
    key = tmp_path / "keys" / "approver.key"
    key.parent.mkdir()
    key.write_text("ab" * 32)
    monkeypatch.setenv("FORGE_APPROVER_KEY_FILE", str(key))
    task(workspace, tmp_path / "s", "k1", "{env: [FORGE_APPROVER_KEY_FILE]}")
    info = run_command(workspace, "k1", py(
        "import os\n"
        "print(os.environ.get('FORGE_APPROVER_KEY_FILE', 'absent'))\n"
        f"print(repr(open({str(key)!r}).read()))"), tee=False)
    assert info["exit_code"] == 0
    assert workspace.artifacts.text(info["stdout_digest"]).split() == ["absent", "''"]
    ev = tool_events(workspace, "k1")[-1]
    assert str(key) in ev.sandbox["hidden"]
    assert "FORGE_APPROVER_KEY_FILE" not in ev.sandbox["env_names"]


# --- network ------------------------------------------------------------------------------


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"hello\n")
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=10)


def connect(port: int) -> list[str]:
    return py("import socket, sys\n"
              "try:\n"
              f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
              "    print(s.recv(16).decode().strip())\n"
              "except OSError as e:\n"
              "    print('no network:', e)\n"
              "    sys.exit(3)")


def test_the_network_is_off_unless_the_task_allows_it(workspace, tmp_path):
    has_bwrap()
    srv = Listener()
    try:
        task(workspace, tmp_path / "a", "offline")
        info = run_command(workspace, "offline", connect(srv.port), tee=False)
        assert info["exit_code"] == 3 and srv.accepted == 0
        assert tool_events(workspace, "offline")[-1].sandbox["network"] is False

        task(workspace, tmp_path / "b", "online", "{network: true}")
        info = run_command(workspace, "online", connect(srv.port), tee=False)
        assert info["exit_code"] == 0 and srv.accepted == 1
        assert workspace.artifacts.text(info["stdout_digest"]).strip() == "hello"
        assert tool_events(workspace, "online")[-1].sandbox["network"] is True
    finally:
        srv.close()


# --- the profile in every recorded call ---------------------------------------------------


def test_gpus_env_and_the_evaluators_call_carry_the_profile(workspace, tmp_path, monkeypatch):
    has_bwrap()
    monkeypatch.setenv("EVAL_MODE", "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # forge's own: not the call's
    task(workspace, tmp_path / "g", "gpu", "{gpus: ['1'], env: [EVAL_MODE]}")
    info = run_command(workspace, "gpu", py(
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], 'HOME=' + os.environ['HOME'], "
        "'EVAL_MODE' in os.environ)"), tee=False)
    cuda, home, passed = workspace.artifacts.text(info["stdout_digest"]).split()
    assert cuda == "1" and passed == "True"
    assert home == "HOME=" + str((workspace.home / "scratch" / "gpu" / ".home").resolve())
    prof = tool_events(workspace, "gpu")[-1].sandbox
    assert prof["gpus"] == ["1"] and "EVAL_MODE" in prof["env_names"]
    # Device nodes: none without claimed GPUs; with them, the host's (none on a host without).
    unclaimed = S.bwrap_argv("bwrap", ["true"], cwd=tmp_path, writable=[], network=False,
                             gpus=[])
    claimed = S.bwrap_argv("bwrap", ["true"], cwd=tmp_path, writable=[], network=False,
                           gpus=["1"])
    assert not any(a.startswith("/dev/nvidia") for a in unclaimed)
    assert any(a.startswith("/dev/nvidia") for a in claimed) == \
        any(Path("/dev").glob("nvidia[0-9]*"))

    # The loop's command evaluator runs in the same sandbox; its ToolInvoked says so.
    path = make_task_dir(tmp_path / "loop", "ev", max_blocks=1)
    define_task(workspace, path)
    run_task(workspace, "ev")
    evals = [e for e in tool_events(workspace, "ev") if e.tool == "evaluator"]
    assert len(evals) == 3 and all(e.sandbox["kind"] == "bwrap" for e in evals)
    assert all(e.sandbox["network"] is False and e.sandbox["gpus"] == [] for e in evals)


def test_old_events_and_tasks_without_a_sandbox_are_unchanged(tmp_path):
    raw = json.dumps({"tool": "t", "argv": ["x"], "event_id": "8a5b4c1e-7d7f-4b8e-9c59-"
                      "0f5c3c7d2a11", "occurred_at": "2026-01-01T00:00:00+00:00"}).encode()
    old = decode("task:x", 1, "ToolInvoked", raw)
    assert isinstance(old, E.ToolInvoked) and old.sandbox == {}
    path = make_task_dir(tmp_path / "s", "h1")
    path.write_text(re.sub(r"(?m)^sandbox: .*\n", "", path.read_text()))
    assert "sandbox" not in canonical(load_task(path))  # its definition hash is as before


# --- unsandboxed, and required ------------------------------------------------------------


def test_off_runs_the_old_way_and_says_so(workspace, tmp_path, secret_env):
    task(workspace, tmp_path / "s", "off1")
    set_guard(workspace, sandbox="off")
    path = tmp_path / "written-by-off.txt"
    p = run_forge("run", "--task", "off1", "--json", "--", PY, "-c",
                  f"open({str(path)!r}, 'w').write('x')", home=workspace.home)
    assert p.returncode == 0, p.stderr
    assert "forge: warning: tool call runs unsandboxed: sandbox off" in p.stderr
    assert path.exists()  # the old way: nothing confines it
    ev = tool_events(workspace, "off1")[-1]
    assert ev.sandbox["kind"] == "none" and ev.sandbox["env"] == "inherited"
    assert "MY_SERVICE_TOKEN" in ev.sandbox["secret_names"]  # what it could see, by name
    assert 'sandbox = "off"' in ev.sandbox["reason"]


def test_without_bwrap_auto_runs_unsandboxed_saying_so_and_required_refuses(
        workspace, tmp_path, monkeypatch, capsys, secret_env):
    task(workspace, tmp_path / "s", "nb")
    bare = tmp_path / "bin"  # a PATH without bwrap
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    info = run_command(workspace, "nb", READ_TOKEN, tee=False)
    err = capsys.readouterr().err
    assert "forge: warning: tool call runs unsandboxed: bubblewrap (bwrap) is not installed" \
        in err
    ev = tool_events(workspace, "nb")[-1]
    assert ev.sandbox["kind"] == "none" and "not installed" in ev.sandbox["reason"]
    # Still the allowlisted environment: the secret it was not given is absent.
    assert workspace.artifacts.text(info["stdout_digest"]).strip() == "absent"
    assert ev.sandbox["env"] == "allowlist"

    set_guard(workspace, sandbox="required")
    before = len(tool_events(workspace, "nb"))
    with pytest.raises(HarnessError) as e:
        run_command(workspace, "nb", ["true"], tee=False)
    assert str(e.value).count("\n") == 0
    assert 'sandbox = "required"' in str(e.value) and "not installed" in str(e.value)
    assert len(tool_events(workspace, "nb")) == before  # nothing ran, nothing recorded
    with pytest.raises(HarnessError, match="required"):
        run_tool(workspace, ["true"], cwd=tmp_path)
    # The CLI says it in one line.
    env = {"PATH": str(bare)}
    p = run_forge("run", "--task", "nb", "--", "true", home=workspace.home, env=env)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1
    assert 'sandbox = "required"' in p.stderr


def test_required_with_bwrap_runs_sandboxed(workspace, tmp_path):
    has_bwrap()
    task(workspace, tmp_path / "s", "req")
    set_guard(workspace, sandbox="required")
    info = run_command(workspace, "req", ["true"], tee=False)
    assert info["exit_code"] == 0
    prof = tool_events(workspace, "req")[-1].sandbox
    assert (prof["kind"], prof["mode"]) == ("bwrap", "required")


def test_a_missing_program_is_a_recorded_failure_not_a_sandbox_error(workspace, tmp_path):
    has_bwrap()
    run = run_tool(workspace, ["/nonexistent/tool"], cwd=tmp_path)
    assert run.returncode is None and run.event.error.startswith("cannot start /nonexistent")
    assert os.path.isdir(tmp_path)


def test_a_call_never_reads_forges_own_stdin(workspace, tmp_path):
    """Under `forge mcp` forge's stdin carries the client's requests; under `forge run`, what
    the person types: a call gets /dev/null (issue 27)."""
    task(workspace, tmp_path, "stdin-t")
    r = run_forge("run", "--task", "stdin-t", "--", "sh", "-c", "echo read:; cat",
                  input="client-request-42\n", home=workspace.home)
    assert r.returncode == 0, r.stderr
    assert "read:" in r.stdout and "client-request-42" not in r.stdout
    [ev] = tool_events(workspace, "stdin-t")
    assert ev.exit_code == 0 and ev.argv[0] == "sh"


def test_a_killed_processs_scratch_is_swept_by_the_next_one(tmp_path):
    """A call without a workspace gets a scratch directory of its process's, removed at exit;
    a process killed first (kill -9: no exit handlers) left it behind for good. The next
    process removes those of processes that no longer run, and keeps a running one's."""
    import signal
    import subprocess

    code = ("import sys\nfrom infer_forge.harness.guard.sandbox import _scratch_without_workspace"
            "\nprint(_scratch_without_workspace(), flush=True)\nsys.stdin.readline()\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def start():
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        return p, Path(p.stdout.readline().strip())

    killed, killed_dir = start()
    alive, alive_dir = start()
    assert killed_dir.parent == alive_dir.parent == tmp_path / f"forge-scratch-{os.getuid()}"
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert killed_dir.is_dir()  # what a kill -9 leaves
    third, third_dir = start()
    assert not killed_dir.exists() and alive_dir.is_dir() and third_dir.is_dir()
    for p in (alive, third):
        p.communicate("\n", timeout=30)
    assert not alive_dir.exists() and not third_dir.exists()  # removed at their exit


def test_a_scratch_parent_that_is_a_link_or_too_open_is_not_used(tmp_path):
    """`$TMPDIR/forge-scratch-<uid>` planted by someone else (a link to their directory, or a
    directory others may write in) is neither swept nor written in: the process takes a
    plain temporary directory of its own instead."""
    import subprocess

    code = ("from infer_forge.harness.guard.sandbox import _scratch_without_workspace\n"
            "print(_scratch_without_workspace())\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    planted = tmp_path / f"forge-scratch-{os.getuid()}"
    theirs = tmp_path / "theirs"
    (theirs / "1-keep").mkdir(parents=True)  # looks like a dead process's scratch
    for kind in ("link", "open"):
        if kind == "link":
            planted.symlink_to(theirs)
        else:
            planted.mkdir()
            planted.chmod(0o777)
            (planted / "1-keep").mkdir()
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        used = Path(out.stdout.strip())
        assert used.parent == tmp_path and used.name.startswith("forge-scratch-"), kind
        assert (planted / "1-keep").is_dir(), kind  # nothing swept there
        if kind == "link":
            planted.unlink()
