"""`forge build`: a member's build command run as a tool call, cached by the digest of its
inputs (tree + command + environment). Real git (a local bare remote), a real build command
(a python script in the member), real processes: the crash test kills `forge build` with
SIGKILL mid-build and checks that nothing half-written and no build process is left."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.tool_calls.build import build, build_command, cache_dir
from infer_forge.ledger.payloads import Digest
from infer_forge.ledger.streams import task_stream
from infer_forge.repos import commands as C
from infer_forge.repos.root import MonoRepo

from tests.conftest import FORGE, REPO, run_forge
from tests.helpers.gitrepos import make_remote, write_manifest
from tests.helpers.sandboxed import processes_naming, still_alive
from tests.helpers.tasks import open_task

from ..harness.loop.test_loop import make_task_dir

# The member's build: writes build/out.txt (git-ignored) and appends a line to a counter file
# outside the repo, so a test counts the builds that really ran. With the flag file present
# it first writes the marker, then waits for the release file (a build that is still running
# when the test acts; the test finds its processes on the host by the marker's path in their
# command lines: inside the sandbox, pids are its own namespace's).
BUILD_PY = """\
import os, pathlib, sys, time
counter, flag, marker, release = map(pathlib.Path, sys.argv[1:5])
if flag.exists():
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text("started")
    tmp.rename(marker)
    while not release.exists():
        time.sleep(0.02)
src = pathlib.Path("src.txt").read_text()
pathlib.Path("build").mkdir(exist_ok=True)
pathlib.Path("build/out.txt").write_text(src.upper())
with counter.open("a") as f:
    f.write(os.environ.get("BUILD_TAG", "-") + "\\n")
print("built:", src.strip())
if "FAIL" in src:
    print("error: the source says FAIL", file=sys.stderr)
    sys.exit(3)
"""


class Setup:
    def __init__(self, tmp: Path, ws) -> None:
        self.tmp, self.ws = tmp, ws
        self.counter, self.flag = tmp / "counter.txt", tmp / "block.flag"
        self.marker, self.release = tmp / "started.txt", tmp / "release.flag"
        # A compound command: bash stays the python script's parent, so the crash test sees
        # a grandchild of forge's build process that must not outlive forge either.
        self.command = (f"{shlex.quote(sys.executable)} build.py "
                        + " ".join(shlex.quote(str(p)) for p in
                                   (self.counter, self.flag, self.marker, self.release))
                        + " && echo done")
        remote = make_remote(tmp, "app", {"src.txt": "hello\n", ".gitignore": "build/\n",
                                          "build.py": BUILD_PY})
        plain = make_remote(tmp, "docs", {"README.md": "docs\n"})
        man = write_manifest(tmp / "manifest.yaml", [
            {"name": "app", "url": str(remote), "build": self.command},
            {"name": "docs", "url": str(plain)}])
        C.init(ws, man)
        self.mono = C.open_monorepo(ws)
        self.procs: list[subprocess.Popen] = []
        self.app = self.mono.member_dir("app")

    def runs(self) -> list[str]:
        return self.counter.read_text().splitlines() if self.counter.exists() else []

    def with_command(self, command: str) -> MonoRepo:
        members = [m.model_copy(update={"build": command}) if m.name == "app" else m
                   for m in self.mono.manifest.members]
        return MonoRepo(self.mono.root, self.mono.manifest.model_copy(
            update={"members": members}))


def let_builds_reach(ws, tmp: Path) -> None:
    """The build's counter, flag and marker files live outside the member: forge.toml lets
    every tool call write there and see BUILD_TAG (the sandbox passes an allowlist only)."""
    import re

    from infer_forge.ledger.config import load_config

    toml = ws.home / "forge.toml"
    text = re.sub(r"(?m)^sandbox_(env|writable) = .*\n", "", toml.read_text())
    toml.write_text(text.replace("[guard]\n", f"[guard]\nsandbox_env = [\"BUILD_TAG\"]\n"
                                 f"sandbox_writable = [{json.dumps(str(tmp))}]\n", 1))
    ws.config = load_config(ws.home)


@pytest.fixture
def setup(tmp_path, workspace):
    let_builds_reach(workspace, tmp_path)
    s = Setup(tmp_path, workspace)
    yield s
    # A failed test must not leave a build behind: the processes naming its marker (its
    # sandbox, bash, the script), and any forge.
    for p in s.procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for pid in still_alive(processes_naming(str(s.marker))):
        os.kill(pid, signal.SIGKILL)


def _cache_files(ws) -> list[str]:
    return sorted(p.name for p in cache_dir(ws).iterdir())


def _wait_for(what: str, cond: Callable[[], bool], proc: subprocess.Popen | None = None,
              deadline_s: float = 60) -> None:
    """Poll an observable condition (a file, a process group) until it holds, or fail."""
    end = time.monotonic() + deadline_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the forge process exited first ({proc.returncode})")
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {deadline_s} s")
        time.sleep(0.02)


def _forge(setup: Setup, *args: str, log: str) -> subprocess.Popen:
    env = {**os.environ, "FORGE_HOME": str(setup.ws.home)}
    with (setup.tmp / f"{log}.out").open("w") as out, \
            (setup.tmp / f"{log}.err").open("w") as err:
        p = subprocess.Popen([*FORGE, *args], stdout=out, stderr=err, env=env, cwd=str(REPO))
    setup.procs.append(p)
    return p


def test_miss_then_hit_runs_once_and_gives_the_same_logs(setup):
    ws = setup.ws
    first = build(ws, setup.mono, "app", setup.app)
    assert (first.success, first.cached, first.exit_code) == (True, False, 0)
    assert setup.runs() == ["-"]
    assert (setup.app / "build/out.txt").read_text() == "HELLO\n"
    assert ws.artifacts.get(first.stdout_digest).decode() == "built: hello\ndone\n"
    ev = first.tool_event
    assert ev.tool == "build" and ev.argv == ["bash", "-c", setup.command]
    assert ev.input_digests == {Digest.BUILD: first.key} and ev.exit_code == 0
    entry = json.loads((cache_dir(ws) / f"{first.key.split(':')[1]}.json").read_text())
    assert (entry["success"], entry["exit_code"], entry["stdout_digest"]) == \
        (True, 0, first.stdout_digest)

    # The build's own output (ignored) is not an input: the same key, a hit, nothing runs.
    second = build(ws, setup.mono, "app", setup.app)
    assert (second.cached, second.success, second.key) == (True, True, first.key)
    assert (second.stdout_digest, second.stderr_digest) == \
        (first.stdout_digest, first.stderr_digest)
    assert second.build_duration_s == pytest.approx(first.build_duration_s, abs=1e-6)
    assert second.tool_event.stdout_digest == first.stdout_digest
    assert setup.runs() == ["-"]
    hexkey = first.key.split(":")[1]
    assert _cache_files(ws) == [f"{hexkey}.json", f"{hexkey}.lock"]

    forced = build(ws, setup.mono, "app", setup.app, force=True)
    assert (forced.cached, forced.key) == (False, first.key)
    assert setup.runs() == ["-", "-"]


def test_tree_and_command_are_inputs(setup):
    ws = setup.ws
    base = build(ws, setup.mono, "app", setup.app)
    (setup.app / "src.txt").write_text("changed\n")  # a tracked file, uncommitted
    changed = build(ws, setup.mono, "app", setup.app)
    assert changed.key != base.key and not changed.cached
    assert (setup.app / "build/out.txt").read_text() == "CHANGED\n"
    (setup.app / "extra.txt").write_text("new\n")  # an untracked, not ignored, file
    untracked = build(ws, setup.mono, "app", setup.app)
    assert untracked.key not in (base.key, changed.key) and not untracked.cached
    (setup.app / "extra.txt").unlink()
    (setup.app / "src.txt").write_text("hello\n")  # back to the first tree: a hit again
    assert build(ws, setup.mono, "app", setup.app).cached
    assert len(setup.runs()) == 3

    other = build(ws, setup.with_command(setup.command + " && true"), "app", setup.app)
    assert other.key != base.key and not other.cached
    assert len(setup.runs()) == 4


def test_environment_is_an_input_but_secret_values_are_not(setup, monkeypatch):
    ws = setup.ws
    base = build(ws, setup.mono, "app", setup.app)
    monkeypatch.setenv("BUILD_TAG", "tagged")
    tagged = build(ws, setup.mono, "app", setup.app)
    assert tagged.key != base.key and not tagged.cached
    assert setup.runs() == ["-", "tagged"]
    # A secret-named variable counts as set, never by value (its hash could be guessed).
    monkeypatch.setenv("APP_API_KEY", "first-value")
    with_secret = build(ws, setup.mono, "app", setup.app)
    assert with_secret.key != tagged.key
    monkeypatch.setenv("APP_API_KEY", "another-value")
    assert build(ws, setup.mono, "app", setup.app).key == with_secret.key
    # Where forge was started from is not an input.
    monkeypatch.setenv("PWD", "/somewhere/else")
    monkeypatch.setenv("OLDPWD", "/and/before")
    assert build(ws, setup.mono, "app", setup.app).cached


def test_a_failed_build_is_reported_and_cached(setup):
    ws = setup.ws
    (setup.app / "src.txt").write_text("FAIL here\n")
    bad = build(ws, setup.mono, "app", setup.app)
    assert (bad.success, bad.cached, bad.exit_code) == (False, False, 3)
    assert bad.error == "build of app exited 3: error: the source says FAIL"
    assert ws.artifacts.get(bad.stderr_digest).decode() == "error: the source says FAIL\n"
    again = build(ws, setup.mono, "app", setup.app)  # the same inputs fail the same way
    assert (again.success, again.cached, again.exit_code, again.error) == \
        (False, True, 3, bad.error)
    assert again.stderr_digest == bad.stderr_digest
    assert len(setup.runs()) == 1

    r = run_forge("build", "app", home=ws.home)
    assert r.returncode == 1, r.stderr
    assert "build app: FAILED (cached" in r.stdout and "the source says FAIL" in r.stdout


def test_a_member_without_a_build_command_is_refused(setup):
    with pytest.raises(HarnessError, match="member docs has no build command in the manifest"):
        build_command(setup.ws, "docs")
    assert not cache_dir(setup.ws).exists()


def test_kill_9_mid_build_leaves_no_entry_and_no_process_then_resume_builds_once(setup):
    ws = setup.ws
    setup.flag.write_text("block")
    forge = _forge(setup, "build", "app", log="killed")
    _wait_for("the build started", setup.marker.exists, forge)
    running = processes_naming(str(setup.marker))  # its sandbox, bash, the script under it
    assert len(running) >= 2, running
    assert all(os.getpgid(p) != os.getpgrp() for p in running)  # its own group, running now
    os.kill(forge.pid, signal.SIGKILL)
    assert forge.wait(timeout=30) == -signal.SIGKILL

    # The build's processes (bash, and the script under it) die with forge.
    _wait_for("the build's processes are gone", lambda: not still_alive(running),
              deadline_s=15)
    files = _cache_files(ws)
    assert len(files) == 1 and files[0].endswith(".lock"), files  # no entry, no temp file
    assert setup.runs() == []

    setup.flag.unlink()
    r = run_forge("build", "app", "--json", home=ws.home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["success"], out["cached"]) == (True, False)
    assert files == [out["key"].split(":")[1] + ".lock"]  # the same inputs as the killed one
    assert setup.runs() == ["-"]  # ran exactly once
    r = run_forge("build", "app", "--json", home=ws.home)
    assert json.loads(r.stdout)["cached"] is True
    assert setup.runs() == ["-"]


def test_two_builds_of_one_key_run_it_once(setup):
    setup.flag.write_text("block")
    first = _forge(setup, "build", "app", log="first")
    _wait_for("the first build started", setup.marker.exists, first)
    second = _forge(setup, "build", "app", log="second")
    err = setup.tmp / "second.err"
    _wait_for("the second build waits on the lock",
              lambda: "waiting for another build of app" in err.read_text(), second)
    setup.release.write_text("go")
    assert first.wait(timeout=120) == 0
    assert second.wait(timeout=120) == 0
    assert "(ran," in (setup.tmp / "first.out").read_text()
    assert "(cached," in (setup.tmp / "second.out").read_text()
    assert setup.runs() == ["-"]


def test_a_task_build_runs_in_its_worktree_and_is_recorded_in_its_open_block(setup):
    ws = setup.ws
    block = open_task(ws, setup.tmp, "t1")
    out = build_command(ws, "app", "t1")
    wt = ws.home / "worktrees" / "t1" / "app"
    assert out.success and Path(out.workdir) == wt.resolve()
    assert (wt / "build/out.txt").read_text() == "HELLO\n"
    assert not (setup.app / "build").exists()  # the root's checkout is not touched
    tools = [r.event for r in ws.ledger.stream(task_stream("t1"))
             if r.type == "ToolInvoked" and r.event.tool == "build"]
    assert len(tools) == 1
    ev = tools[0]
    assert (ev.block_id, ev.task_id, ev.exit_code) == (block, "t1", 0)
    assert ev.input_digests[Digest.BUILD] == out.key
    assert ev.stdout_digest == out.stdout_digest

    # A task without an open block: refused before anything is built.
    define_task(ws, make_task_dir(setup.tmp / "specs-t2", "t2"))
    with pytest.raises(HarnessError, match=r"task t2: no open loop block.*forge block start"):
        build_command(ws, "app", "t2")
    assert not (ws.home / "worktrees" / "t2").exists()
    assert setup.runs() == ["-"]
