"""The DuckDB index: exactly-once catch-up, resume after kill -9 and injected failures,
rebuild == incremental, events it does not project, the file lock, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from eventsourcing.persistence import StoredEvent
from infer_forge.ledger import events as E
from infer_forge.ledger.store import BOOKKEEPING_TYPES
from infer_forge.ledger.streams import task_stream
from infer_forge.projections import index as I

from tests.conftest import REPO, run_forge
from tests.helpers.index_ledger import build


class Boom(RuntimeError):
    pass


def ledger_domain_events(ws, stop: int) -> int:
    return sum(1 for n in ws.ledger.notifications(1, stop) if n.topic not in BOOKKEEPING_TYPES)


def assert_agrees(ws, con) -> int:
    """Rows and tracking agree: `events` holds exactly the ledger's events up to the
    tracked position, and every projected table stays within it."""
    pos = I.tracked_position(con)
    n, hi = con.execute("SELECT count(*), coalesce(max(position), 0) FROM events").fetchone()
    assert n == ledger_domain_events(ws, pos) if pos else n == 0
    assert hi <= pos
    for t in ("measurement_runs", "loop_blocks", "decisions", "verifications", "handoffs"):
        (mx,) = con.execute(f"SELECT coalesce(max(position), 0) FROM {t}").fetchone()
        assert mx <= pos, t
    dup = con.execute("SELECT count(*) - count(DISTINCT position) FROM events").fetchone()[0]
    assert dup == 0
    return pos


def rebuilt_fingerprint(ws) -> str:
    with I.open_index(ws, rebuild=True) as s:
        return I.fingerprint(s.con)


def test_catch_up_projects_every_table(workspace):
    build(workspace)
    report = I.update(workspace)
    assert report["behind"] == 0
    rows = report["rows"]
    assert rows["tasks"] == 4 and rows["loop_blocks"] == 7 and rows["decisions"] == 3
    assert rows["measurement_runs"] == 7 * 3  # blocks x repeats
    assert rows["points"] == 4 and rows["runtime_profiles"] == 4
    with I.open_index(workspace) as s:
        assert s.caught_up.events == 0  # nothing new: a second catch-up projects nothing
        assert_agrees(workspace, s.con)
        # Long format: one row per metric value, every dimension on it.
        assert s.con.execute("SELECT count(*), count(DISTINCT metric) FROM measurements "
                             "WHERE model IS NOT NULL").fetchone() == (63, 3)
        dims = s.con.execute(
            "SELECT DISTINCT model, accelerator, engine, runtime_profile, parallelism, "
            "architecture, concurrency, repo_snapshot FROM measurements "
            "WHERE task_id = 'deepgemm-moe-h20'").fetchall()
        assert dims == [("Qwen3-30B-A3B", "H20", "sglang", "qwen-h20@1", "tp8-pp1-dp1-ep8",
                         "pd", 32, "sha256:repo-snapshot-1")]
        # An inline point (no pin) still yields dimensions; the engine comes from the profile.
        assert s.con.execute("SELECT model, accelerator, engine FROM tasks "
                             "WHERE task_id = 'tune-tiny-cpu'").fetchone() == (
            "tiny-llama", "x86_64", "hf")
        dec = s.con.execute("SELECT decisions.kind, reason, evidence_type FROM decisions "
                            "JOIN decision_evidence USING (decision_id) "
                            "WHERE decisions.task_id = 'deepgemm-moe-h20'").fetchone()
        assert dec[0] == "rejected" and "token match 0.61" in dec[1]
        assert dec[2] == "VerificationRecorded"
        st = dict(s.con.execute("SELECT task_id, status FROM task_overview").fetchall())
        assert st["tune-qwen-h200"] == "exited"


def test_rebuild_equals_incremental(workspace):
    built = build(workspace)
    with I.open_index(workspace, batch=4) as s:  # many small transactions
        assert s.caught_up.batches > 10
    # More history after a first catch-up: a task defined earlier exits later, a
    # measurement is invalidated.
    ws = workspace
    tid = "late-task"
    ws.ledger.append(task_stream(tid), [E.TaskDefined(
        title=tid, task_type="evaluation", goal="late goal", definition={"point": "qwen-h200"},
        definition_hash="sha256:x", point_hash=built["points"]["qwen-h200"], task_id=tid)])
    with I.open_index(ws, batch=3) as s:
        mid = s.con.execute("SELECT event_id FROM measurements LIMIT 1").fetchone()[0]
    ws.ledger.append(task_stream(tid), [
        E.MeasurementInvalidated(measurement_event_id=mid, reason="noisy node", task_id=tid),
        E.TaskExited(state="aborted-by-human", reason="stop", task_id=tid)])
    with I.open_index(ws, batch=2) as s:
        incremental = I.fingerprint(s.con)
        assert s.con.execute("SELECT model, exit_state FROM tasks WHERE task_id = ?",
                             [tid]).fetchone() == ("Qwen3-30B-A3B", "aborted-by-human")
        n_all = s.con.execute("SELECT count(*) FROM measurements").fetchone()[0]
        n_valid = s.con.execute("SELECT count(*) FROM valid_measurements").fetchone()[0]
        assert n_all - n_valid == 3  # one invalidated event = its three metric rows
    assert rebuilt_fingerprint(ws) == incremental


def test_injected_failure_before_commit_rolls_back(workspace):
    build(workspace)
    calls = []

    def fail_third(position: int) -> None:
        calls.append(position)
        if len(calls) == 3:
            raise Boom(f"injected before commit at {position}")

    con = I.connect(I.index_path(workspace.home))
    try:
        with pytest.raises(Boom):
            I.catch_up(con, workspace.ledger, batch=10, before_commit=fail_third)
        pos = assert_agrees(workspace, con)
        assert pos == calls[1]  # the two committed batches, not the failed third
        I.catch_up(con, workspace.ledger, batch=10)  # resume
        assert assert_agrees(workspace, con) == workspace.ledger.max_position()
        resumed = I.fingerprint(con)
    finally:
        con.close()
    assert resumed == rebuilt_fingerprint(workspace)


KILL_SCRIPT = """
import sys
from infer_forge.ledger.workspace import open_workspace
from infer_forge.projections import index as I
ws = open_workspace(sys.argv[1])
n = 0
def hook(position):
    global n
    n += 1
    if n == 4:  # rows of the 4th batch are written, not committed: wait to be killed
        print("PRECOMMIT", position, flush=True)
        sys.stdin.readline()
con = I.connect(I.index_path(ws.home))
I.catch_up(con, ws.ledger, batch=7, before_commit=hook)
print("DONE", flush=True)
"""


def test_kill9_during_catch_up_then_resume(workspace):
    build(workspace)
    env = {**os.environ, "PYTHONPATH": str(REPO.parent)}
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(workspace.home)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                         cwd=str(REPO))
    try:
        line = p.stdout.readline()
        assert line.startswith("PRECOMMIT"), line
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    con = I.connect(I.index_path(workspace.home))
    try:
        pos = assert_agrees(workspace, con)
        assert 0 < pos < int(line.split()[1])  # three batches committed, the fourth lost
        I.catch_up(con, workspace.ledger, batch=7)
        assert assert_agrees(workspace, con) == workspace.ledger.max_position()
        resumed = I.fingerprint(con)
    finally:
        con.close()
    assert resumed == rebuilt_fingerprint(workspace)


class IndexTestOnlyNoted(E.Event):
    """An event type the index does not project (as other issues add theirs)."""

    note: str


def test_events_it_does_not_project_are_kept_and_passed(workspace):
    build(workspace)
    led = workspace.ledger
    led.append("graph:g1", [IndexTestOnlyNoted(note="hello")])
    # A type this code has never heard of (written by a newer infer-forge).
    led.recorder.insert_events([StoredEvent(originator_id="future", originator_version=1,
                                            topic="FromTheFuture",
                                            state=b'{"event_id":"f1","x":1,"_v":1}')])
    with I.open_index(workspace) as s:
        assert I.tracked_position(s.con) == led.max_position()
        types = dict(s.con.execute("SELECT type, count(*) FROM events GROUP BY type").fetchall())
        assert types["IndexTestOnlyNoted"] == 1 and types["FromTheFuture"] == 1
        assert s.con.execute("SELECT payload->>'note' FROM events WHERE type = "
                             "'IndexTestOnlyNoted'").fetchone() == ("hello",)


def test_concurrent_forge_commands_share_the_file(workspace):
    build(workspace)
    env = {**os.environ, "FORGE_HOME": str(workspace.home)}
    procs = [subprocess.Popen([sys.executable, "-m", "infer_forge.cli", "sql", "--json",
                               "SELECT count(*) AS n FROM events"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=str(REPO)) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert json.loads(out) == [{"n": 66}]


def test_index_cli(workspace):
    build(workspace)
    home = workspace.home
    r = run_forge("index", "status", "--json", home=home)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["position"] == 0 and st["behind"] == workspace.ledger.max_position()
    r = run_forge("index", "update", "--json", home=home)
    up = json.loads(r.stdout)
    assert up["behind"] == 0 and up["caught_up"]["projected"] == 66
    r = run_forge("index", "rebuild", home=home)
    assert r.returncode == 0 and "0 behind" in r.stdout
    assert "measurement_runs 21" in r.stdout


def test_long_catch_up_reports_progress_per_batch(workspace):
    build(workspace)
    head = workspace.ledger.max_position()
    seen: list[I.CatchUpProgress] = []
    con = I.connect(I.index_path(workspace.home))
    try:
        r = I.catch_up(con, workspace.ledger, batch=10, progress=seen.append)
        assert [p.position for p in seen] == [p.done for p in seen]  # from an empty index
        assert len(seen) == r.batches > 1
        assert all(a.done < b.done for a, b in zip(seen, seen[1:], strict=False))
        assert seen[-1].done == seen[-1].total == head == I.tracked_position(con)
        assert f"{head}/{head} notifications (100%" in seen[-1].line()
        # Caught up: nothing to read, no progress; one batch's worth: none either.
        I.catch_up(con, workspace.ledger, batch=10, progress=seen.append)
        assert len(seen) == r.batches
    finally:
        con.close()
    r = run_forge("index", "rebuild", "--json", "--batch", "7", home=workspace.home)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("index: ")]
    assert len(lines) == json.loads(r.stdout)["caught_up"]["batches"] > 1
    assert f"{head}/{head} notifications (100%" in lines[-1]
    r = run_forge("index", "update", "--batch", "0", home=workspace.home)
    assert r.returncode == 2 and "--batch" in r.stderr


def test_index_of_another_schema_version_is_rebuilt(workspace):
    build(workspace)
    I.update(workspace)
    con = I.connect(I.index_path(workspace.home))
    con.execute("UPDATE tracking SET position = 1 WHERE projection = ?", [I.SCHEMA_KEY])
    con.execute("DELETE FROM tasks")  # damage only an old-version index could have
    con.close()
    with I.open_index(workspace) as s:
        assert s.caught_up.projected == 66  # projected again from position 1
        assert s.con.execute("SELECT count(*) FROM tasks").fetchone() == (4,)
        assert s.con.execute("SELECT position FROM tracking WHERE projection = ?",
                             [I.SCHEMA_KEY]).fetchone() == (I.INDEX_SCHEMA_VERSION,)
