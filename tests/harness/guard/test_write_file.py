"""The agent's `write_file` tool (harness/guard/task_dirs.py `write_in_task`) against a process
that changes the task's directories under it: a real racing process swapping a directory for
a link to outside the task while the tool writes hundreds of times, a link and a hard link at
the file's own name, and `..`. Nothing is ever written outside the task's directories."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from infer_forge.harness.agents import tool_registry as T
from infer_forge.harness.guard.task_dirs import scratch_dir
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.ledger import events as E

from tests.helpers.tasks import open_task

AGENT = E.Actor.agent("redteam", "m1")

# Swaps `d` (a directory) and `d.swap` (a link to the outside directory) atomically
# (renameat2 RENAME_EXCHANGE), as fast as it can, until the stop file appears; so at any
# instant `d` is one or the other, and never missing. Prints how many swaps it made.
RACER = """\
import ctypes, os, sys
base, outside, stop = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(base)
os.mkdir("d")
os.symlink(outside, "d.swap")
print("ready", flush=True)
swaps = 0
while not os.path.exists(stop):
    for _ in range(50):
        if libc.renameat2(-100, b"d", -100, b"d.swap", 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
        swaps += 1
print(swaps, flush=True)
"""


def _ctx(ws) -> T.ToolContext:
    return T.ToolContext(ws, AGENT, task_id="t1", tools=TOOLS)


def test_a_directory_swapped_for_a_link_mid_write_never_gets_a_file_outside(workspace,
                                                                            tmp_path):
    open_task(workspace, tmp_path)
    scratch = scratch_dir(workspace, "t1").resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    stop = tmp_path / "stop"
    racer = subprocess.Popen([sys.executable, "-c", RACER, str(scratch), str(outside),
                              str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
        ctx = _ctx(workspace)
        wrote, refusals = 0, []
        deadline = time.monotonic() + 20
        for i in range(300):
            r = T.call(ctx, "write_file", {"task_id": "t1", "path": f"d/f{i}.txt",
                                           "content": "agent output\n"})
            if r.ok:
                wrote += 1
            else:
                refusals.append(r.error or "")
            assert list(outside.iterdir()) == [], \
                f"write {i} landed outside the task ({wrote} inside, {len(refusals)} refused)"
            if time.monotonic() > deadline:
                break
    finally:
        stop.touch()
        out, _ = racer.communicate(timeout=30)
    swaps = int(out.strip())
    assert racer.returncode == 0 and swaps > 0
    assert wrote + len(refusals) >= 100 and wrote > 0  # it wrote inside, between the swaps
    assert all("'d' is a symbolic link or not a directory" in e for e in refusals), refusals
    assert list(outside.iterdir()) == []
    real = scratch / ("d" if (scratch / "d").is_dir() and not (scratch / "d").is_symlink()
                      else "d.swap")
    assert len(list(real.iterdir())) == wrote  # every write it reported is in the task
    assert not any(p.name.endswith(".forge-tmp") for p in real.iterdir())


def test_a_link_or_hard_link_at_the_name_is_replaced_not_written_through(workspace, tmp_path):
    open_task(workspace, tmp_path)
    scratch = scratch_dir(workspace, "t1").resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "bashrc"
    target.write_text("user's own\n")
    (scratch / "soft.txt").symlink_to(target)
    os.link(target, scratch / "hard.txt")  # same filesystem: a hard link an agent could make
    ctx = _ctx(workspace)
    for name in ("soft.txt", "hard.txt"):
        r = T.call(ctx, "write_file", {"task_id": "t1", "path": name, "content": "agent\n"})
        assert r.ok, r.error
        assert (scratch / name).read_text() == "agent\n" and not (scratch / name).is_symlink()
    assert target.read_text() == "user's own\n" and target.stat().st_nlink == 1

    # An existing file keeps its mode; the result names where it went.
    script = scratch / "run.sh"
    script.write_text("old\n")
    script.chmod(0o750)
    r = T.call(ctx, "write_file", {"task_id": "t1", "path": str(script), "content": "new\n"})
    assert r.ok and r.result == {"path": str(script), "bytes": 4}
    assert script.read_text() == "new\n" and script.stat().st_mode & 0o777 == 0o750


def test_dotdot_links_and_paths_outside_are_refused_in_one_line(workspace, tmp_path):
    open_task(workspace, tmp_path)
    scratch = scratch_dir(workspace, "t1").resolve()
    (scratch / "sub").mkdir(parents=True)
    (scratch / "away").symlink_to(tmp_path)
    ctx = _ctx(workspace)
    cases = {"sub/../../escape.txt": "has a '..' component",
             "away/escape.txt": "'away' is a symbolic link or not",
             str(tmp_path / "escape.txt"): "is outside the task's directories",
             "sub": "is a directory, not a file",
             ".": "is a directory of the task, not a file",
             "a\0b": "holds a NUL byte"}
    for path, why in cases.items():
        r = T.call(ctx, "write_file", {"task_id": "t1", "path": path, "content": "x"})
        assert not r.ok and why in (r.error or "") and "\n" not in (r.error or ""), (path, r)
    assert not (tmp_path / "escape.txt").exists()
    # The command tool's directory: made inside, refused through a link.
    r = T.call(ctx, "run_command", {"task_id": "t1", "argv": ["true"], "cwd": "away/made"})
    assert not r.ok and "'away' is a symbolic link or not" in (r.error or "")
    assert not (tmp_path / "made").exists()
    r = T.call(ctx, "run_command", {"task_id": "t1", "argv": ["true"], "cwd": "new/dir"})
    assert r.ok and r.result["exit_code"] == 0 and (scratch / "new" / "dir").is_dir()
