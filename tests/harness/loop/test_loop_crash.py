"""kill -9 of `forge task run` at many points, then `forge task resume`: the event history must
equal an uninterrupted run's (no step repeated, no measurement lost or duplicated)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace

from tests.conftest import FORGE, REPO, run_forge

from .test_loop import history, make_task_dir


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One task file (its path is part of the definition) and the uninterrupted reference."""
    root = tmp_path_factory.mktemp("crash")
    path = make_task_dir(root / "specs")
    ws, _ = init_workspace(root / "reference")
    with ws:
        define_task(ws, path)
        assert run_task(ws, "t1").exit_state == "delivered"
        ref = history(ws, "t1")
    return path, ref


def _start(home, env_extra=None) -> subprocess.Popen:
    env = {**os.environ, "FORGE_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.Popen([*FORGE, "task", "run", "t1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
                            start_new_session=True)  # own group: the kill reaches the evaluator


def _kill_after(proc: subprocess.Popen, predicate) -> list[str]:
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if predicate(seen):
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    return seen


def _fresh(tmp_path, path, name):
    ws, _ = init_workspace(tmp_path / name)
    define_task(ws, path)
    return ws


def _resume_and_compare(ws, home, ref):
    p = run_forge("task", "resume", "t1", home=home)
    assert p.returncode == 0, p.stderr
    assert "delivered" in p.stdout
    got = history(ws, "t1")
    assert [e["type"] for e in got] == [e["type"] for e in ref]
    assert got == ref


def test_kill_during_measurement_then_resume(tmp_path, shared):
    """Deterministic mid-step kill: the evaluator blocks on a FIFO inside b3's measurement."""
    path, ref = shared
    ws = _fresh(tmp_path, path, "home")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = _start(ws.home, {"EVAL_BLOCK_FIFO": str(fifo)})
    seen = _kill_after(proc, lambda s: s[-1].startswith("begin b3:measure"))
    assert proc.returncode == -signal.SIGKILL and seen[-1].startswith("begin b3:measure")
    mem_types = [r.type for r in ws.ledger.stream(task_stream("t1"))]
    # b1 and b2 complete, b3 started; b3's measurement never reached the ledger.
    assert mem_types.count("MeasurementRecorded") == 6
    assert mem_types[-1] == "LoopBlockStarted"
    _resume_and_compare(ws, ws.home, ref)


@pytest.mark.slow
def test_kill_9_at_many_points_then_resume(tmp_path, shared):
    path, ref = shared
    # Progress lines: 1 saved b1:start, 2 begin b1:measure, 3 saved b1:measure, 4 saved
    # b1:verify, 5 saved b1:handoff, 6 saved b2:start, … 19 saved b4:handoff, 20 saved exit.
    points = [1, 2, 4, 5, 8, 12, 17, 19]
    versions = set()
    for n in points:
        ws = _fresh(tmp_path, path, f"home{n}")
        proc = _start(ws.home)
        seen = _kill_after(proc, lambda s, n=n: len(s) >= n)
        assert len(seen) == n and proc.returncode == -signal.SIGKILL, (n, seen)
        versions.add(ws.ledger.version(task_stream("t1")))
        _resume_and_compare(ws, ws.home, ref)
        ws.close()
    # The kills landed at distinct points of the history.
    assert len(versions) >= 5, versions
