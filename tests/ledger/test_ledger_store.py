"""The store contract, on a real SQLite file and on a real PostgreSQL database alike (the
`home` fixture runs each test on both): atomic, idempotent saves; optimistic concurrency
across processes; lock timeouts; loud failures on unknown or corrupt events; upcasting; the
read API (stream, type, time range, global log with positions); replay and fingerprints."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.clock import utcnow
from infer_forge.ledger.errors import (
    ConflictError,
    CorruptEventError,
    LedgerBusyError,
    LedgerError,
    NotFoundError,
    UnknownEventError,
)
from infer_forge.ledger.replay import replay_task
from infer_forge.ledger.state import fingerprint
from infer_forge.ledger.store import Append, Ledger
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace

from tests.conftest import TESTS, insert_raw_event, run_forge

WRITER = TESTS / "helpers" / "ledger_writer.py"


def define(task: str = "t1") -> E.TaskDefined:
    return E.TaskDefined(task_id=task, title="tune", task_type="deployment-tuning", goal="faster",
                         definition={"goal": "faster"}, definition_hash="sha256:" + "0" * 64)


def measurement(i: int, task: str = "t1", block: str = "b0") -> E.MeasurementRecorded:
    return E.MeasurementRecorded(task_id=task, block_id=block, run_id=f"r{i}", source="test",
                                 metrics={"output_throughput": 100.0 + i})


@pytest.fixture
def home(backend_home):
    """The contract holds on both backends: every test taking `home` (or `ledger`) runs on
    SQLite and on PostgreSQL (tests/conftest.py `backend_home`)."""
    return backend_home


@pytest.fixture
def sqlite_home(forge_home):
    """For what only SQLite has: its file, its write lock, gap-free positions as a problem."""
    ws, _ = init_workspace(forge_home)
    ws.close()
    return forge_home


@pytest.fixture
def ledger(home):
    with Ledger.open(home) as lg:
        yield lg


def db_file(home: Path) -> Path:
    return home / "ledger.sqlite"


# --- saves -----------------------------------------------------------------------------------


def test_save_is_atomic_across_streams_and_returns_versions_and_positions(ledger):
    before = ledger.max_position()
    res = ledger.save(Append("task:a", [define("a"), measurement(1, "a")]),
                      Append("task:b", [define("b")]), command_id="c1")
    assert res.appended == {"task:a": [1, 2], "task:b": [1, 1]}
    assert res.positions == [before + 1, before + 2, before + 3]
    assert not res.duplicate
    # A save that fails part-way (the second stream conflicts) writes nothing at all.
    with pytest.raises(ConflictError):
        ledger.save(Append("task:a", [measurement(2, "a")]),
                    Append("task:b", [measurement(3, "b")], expected_version=0))
    assert ledger.version("task:a") == 2 and ledger.version("task:b") == 1
    assert ledger.max_position() == before + 4  # three events + the command marker


def test_retried_append_with_same_command_id_adds_nothing(ledger):
    first = ledger.append("task:t1", [define(), measurement(1)], command_id="same")
    top = ledger.max_position()
    again = ledger.append("task:t1", [define(), measurement(1)], command_id="same")
    also = ledger.append("task:t1", [define()], expected_version=0, command_id="same")
    assert again.duplicate and also.duplicate
    assert again.appended == first.appended == {"task:t1": [1, 2]}
    assert ledger.max_position() == top
    assert ledger.version("task:t1") == 2
    assert ledger.command_done("same") and not ledger.command_done("other")


def test_conflicting_writer_gets_conflict_error_naming_stream_and_versions(home):
    with Ledger.open(home) as a, Ledger.open(home) as b:
        a.append("task:t1", [define()])
        seen = b.version("task:t1")
        a.append("task:t1", [measurement(1)], expected_version=seen)
        with pytest.raises(ConflictError) as exc:
            b.append("task:t1", [measurement(2)], expected_version=seen)
    e = exc.value
    assert (e.stream, e.expected, e.actual) == ("task:t1", 1, 2)
    assert str(e) == "conflict on stream 'task:t1': expected version 1, but it is at version 2"


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WRITER), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_together(procs: list[subprocess.Popen]) -> list[dict]:
    for p in procs:  # every writer has opened the ledger before any starts appending
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


WRITERS, PER_WRITER = 4, 12


def positions_of(ledger: Ledger) -> list[int]:
    """Global positions, checked to strictly increase; on SQLite also gap-free (PostgreSQL's
    sequence skips the values a rolled-back insert drew: a conflict may leave a gap, never a
    duplicate)."""
    positions = [r[0] for r in ledger.rows()]
    assert positions == sorted(set(positions))
    if ledger.config.backend == "sqlite":
        assert positions == list(range(1, len(positions) + 1))
    return positions


def test_processes_on_one_stream_conflict_retry_and_lose_nothing(ledger, home):
    ledger.append("task:hot", [define("hot")])
    procs = [_spawn("contend", str(home), "task:hot", f"w{k}", str(PER_WRITER))
             for k in range(WRITERS)]
    results = _run_together(procs)
    assert [r["ok"] for r in results] == [PER_WRITER] * WRITERS
    for r in results:
        if r["conflicts"]:
            assert re.fullmatch(r"conflict on stream 'task:hot': expected version \d+, "
                                r"but it is at version \d+", r["message"])
    records = ledger.stream_log("task:hot")
    reasons = [r.event.reason for r in records[1:]]
    # No lost update, no duplicate: the stream holds exactly every successful append once.
    assert len(records) == 1 + sum(r["ok"] for r in results)
    assert sorted(reasons) == sorted(f"w{k}:{i}" for k in range(WRITERS) for i in range(PER_WRITER))
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    # Each writer's own appends keep their order.
    for k in range(WRITERS):
        mine = [int(x.split(":")[1]) for x in reasons if x.startswith(f"w{k}:")]
        assert mine == list(range(PER_WRITER))
    # Every save is marked once, under its own command id.
    assert sorted(r.event.command_id for r in records[1:]) == sorted(
        f"w{k}-{i}" for k in range(WRITERS) for i in range(PER_WRITER))
    assert all(ledger.command_done(f"w{k}-{i}") for k in range(WRITERS)
               for i in range(PER_WRITER))
    positions_of(ledger)


def test_processes_on_distinct_streams_all_succeed(ledger, home):
    procs = [_spawn("free", str(home), f"task:s{k}", f"w{k}", str(PER_WRITER))
             for k in range(WRITERS)]
    results = _run_together(procs)
    assert all(r == {"ok": PER_WRITER, "conflicts": 0, "message": None} for r in results)
    for k in range(WRITERS):
        assert ledger.version(f"task:s{k}") == PER_WRITER
    # No writer conflicted, so no insert rolled back: gap-free on both backends.
    positions = positions_of(ledger)
    assert positions == list(range(1, len(positions) + 1))


def test_processes_without_expected_version_on_one_stream_all_land(ledger, home):
    procs = [_spawn("free", str(home), "task:hot", f"w{k}", str(PER_WRITER)) for k in range(4)]
    _run_together(procs)
    assert ledger.version("task:hot") == 4 * PER_WRITER
    records = ledger.stream_log("task:hot")
    assert [r.version for r in records] == list(range(1, 4 * PER_WRITER + 1))
    assert len({r.event.reason for r in records}) == 4 * PER_WRITER
    positions_of(ledger)


def test_held_write_lock_gives_one_line_busy_error_while_reads_continue(sqlite_home):
    # PostgreSQL's lock timeout: tests/ledger/test_ledger_postgres.py.
    home = sqlite_home
    cfg = home / "forge.toml"
    cfg.write_text(cfg.read_text().replace("lock_timeout_s = 5", "lock_timeout_s = 1"))
    with Ledger.open(home) as ledger:
        ledger.append("task:t1", [define()])
        holder = _spawn("hold", str(db_file(home)))
        try:
            assert holder.stdout.readline().strip() == "HOLDING"
            with pytest.raises(LedgerBusyError) as exc:
                ledger.append("task:t1", [measurement(1)], command_id="while-locked")
            msg = str(exc.value)
            assert "\n" not in msg and "locked" in msg and "1s" in msg
            # Reads are not blocked by a writer (WAL).
            assert ledger.version("task:t1") == 1
            assert replay_task(ledger, "t1").status == "defined"
            assert len(list(ledger.log())) == 2
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
        # Once the lock is gone the same command goes through, exactly once.
        ledger.append("task:t1", [measurement(1)], command_id="while-locked")
        ledger.append("task:t1", [measurement(1)], command_id="while-locked")
        assert ledger.version("task:t1") == 2


# --- unknown and corrupt events ------------------------------------------------------------------




def _valid_state(event: E.Event) -> bytes:
    return orjson.dumps({**event.model_dump(mode="json"), "_v": 1})


@pytest.mark.parametrize(
    ("topic", "state", "error", "says"),
    [
        ("EngineExploded", None, UnknownEventError, "unknown event type 'EngineExploded'"),
        ("MeasurementRecorded", b'{"event_id": "x", "run_', CorruptEventError, "corrupt payload"),
        ("MeasurementRecorded", b"[1, 2]", CorruptEventError, "not an object"),
        ("MeasurementRecorded", "bad-metric", CorruptEventError, "metrics.output_throughput"),
        ("MeasurementRecorded", "extra-field", CorruptEventError, "sneaky"),
        ("MeasurementRecorded", "no-suffix", CorruptEventError, "corrupt payload"),
        ("MeasurementRecorded", "bad-actor", CorruptEventError, "actor"),
    ],
)
def test_unknown_or_corrupt_event_fails_loudly_and_check_reports_it(home, topic, state, error,
                                                                       says):
    with Ledger.open(home) as ledger:
        ledger.append("task:t1", [define(), measurement(1)])
    good = orjson.loads(_valid_state(measurement(2)))
    if state is None:
        state = _valid_state(measurement(2))
    elif state == "bad-metric":
        state = orjson.dumps({**good, "metrics": {"output_throughput": "fast"}, "_v": 1})
    elif state == "extra-field":
        state = orjson.dumps({**good, "sneaky": 1, "_v": 1})
    elif state == "no-suffix":
        state = orjson.dumps({**good, "_v": 1})[:-5] + b"\x00garbage"
    elif state == "bad-actor":
        state = orjson.dumps({**good, "actor": {"kind": "system", "name": "forge", "x": 1},
                              "_v": 1})
    pos = insert_raw_event(home, "task:t1", 3, topic, state)

    with Ledger.open(home) as ledger:
        with pytest.raises(error) as exc:
            ledger.stream_log("task:t1")
        msg = str(exc.value)
        assert "stream 'task:t1' version 3" in msg and says in msg and "\n" not in msg
        with pytest.raises(error):
            list(ledger.log())
        with pytest.raises(error):
            replay_task(ledger, "t1")
        # Up to the event before it, the stream still replays.
        assert replay_task(ledger, "t1", until=pos - 1).measurements == 1

    check = run_forge("check", home=home)
    assert check.returncode == 1
    assert f"problem: position {pos}: " in check.stdout and "version 3" in check.stdout
    # Issue 9: a reader is not locked out by one bad event: `forge log` lists the others and
    # names the bad one (position, stream, version) in one line on stderr.
    log = run_forge("log", home=home)
    assert log.returncode == 0, log.stderr
    assert log.stderr.strip().count("\n") == 0 and "version 3" in log.stderr
    assert f"position {pos}" in log.stderr and "Traceback" not in log.stderr
    assert log.stdout.count("MeasurementRecorded") == 1 and "TaskDefined" in log.stdout


def test_check_reports_partial_saves_and_unmarked_events(sqlite_home):
    # On SQLite a position gap is damage; PostgreSQL's sequences leave gaps by design.
    home = sqlite_home
    with Ledger.open(home) as ledger:
        ledger.append("task:t1", [define(), measurement(1), measurement(2)], command_id="c1")
        ledger.append("task:t2", [define("t2"), measurement(1, "t2")], command_id="c2")
    assert run_forge("check", home=home).returncode == 0
    conn = sqlite3.connect(db_file(home))
    conn.execute("DELETE FROM stored_events WHERE originator_id='task:t1' "
                 "AND originator_version=3")
    conn.commit()
    conn.close()
    insert_raw_event(home, "task:t2", 3, "MeasurementRecorded", _valid_state(measurement(9, "t2")))
    check = run_forge("check", "--json", home=home)
    assert check.returncode == 1
    problems = json.loads(check.stdout)["problems"]
    assert problems == [
        "positions: gap before 6 (expected 5)",
        "stream 'task:t1': save 'c1' wrote versions 1..3 but the stream ends at 2 "
        "(partial save)",
        "stream 'task:t2': versions 3..3 belong to no save (no CommandHandled marker)",
    ]


def test_event_newer_than_the_code_is_an_error(home):
    state = orjson.dumps({**orjson.loads(_valid_state(measurement(1))), "_v": 9})
    insert_raw_event(home, "task:t1", 1, "MeasurementRecorded", state)
    with Ledger.open(home) as ledger, pytest.raises(UnknownEventError, match="newer"):
        ledger.stream_log("task:t1")


# --- upcasting ---------------------------------------------------------------------------------


class WidgetTimed(E.Event):
    """Test-only event at schema v2: v1 stored `millis` (int); v2 has `seconds` and `unit`."""

    TYPE = "TestOnlyWidgetTimed"
    SCHEMA_VERSION = 2
    seconds: float
    unit: str


@E.upcaster("TestOnlyWidgetTimed", 1)
def _widget_v1_to_v2(payload: dict) -> dict:
    payload = dict(payload)
    payload["seconds"] = payload.pop("millis") / 1000
    payload["unit"] = "s"
    return payload


def test_old_event_version_upcasts_on_replay(home):
    v1 = WidgetTimed(seconds=0, unit="s").model_dump(mode="json")
    del v1["seconds"], v1["unit"]
    v1 = {**v1, "millis": 1500, "_v": 1}
    insert_raw_event(home, "widget", 1, "TestOnlyWidgetTimed", orjson.dumps(v1))
    with Ledger.open(home) as ledger:
        ledger.append("widget", [WidgetTimed(seconds=2.0, unit="s")])
        events = [r.event for r in ledger.stream_log("widget")]
        assert [(e.seconds, e.unit) for e in events] == [(1.5, "s"), (2.0, "s")]
        assert events[0].event_id == WidgetTimed.model_validate(
            {**{k: v for k, v in v1.items() if k not in ("millis", "_v")},
             "seconds": 1.5, "unit": "s"}).event_id
        # The current version is stored as v2 and read back without upcasting.
        raw = ledger.stream_rows("widget")[1][3]
        assert raw.endswith(b',"_v":2}')
    # An upcaster that cannot lift a payload is a corrupt event, not a crash.
    insert_raw_event(home, "widget", 3, "TestOnlyWidgetTimed",
                orjson.dumps({**{k: v for k, v in v1.items() if k != "millis"}}))
    with Ledger.open(home) as ledger, pytest.raises(CorruptEventError, match="version 3"):
        ledger.stream_log("widget")


# --- read API ----------------------------------------------------------------------------------


def build_task(ledger: Ledger, task: str = "t1") -> None:
    s = task_stream(task)
    ledger.append(s, [define(task)])
    ledger.append(s, [E.LoopBlockStarted(task_id=task, block_id="b1", index=1, sub_goal="cb on",
                                         candidate={"engine.continuous_batching": True})])
    ledger.append(s, [measurement(i, task, "b1") for i in range(3)])
    ledger.append(s, [E.VerificationRecorded(task_id=task, block_id="b1", contract_hash="c",
                                             passed=False, verdict="fail"),
                      E.DirectionRejected(task_id=task, block_id="b1", reason="TTFT over SLO"),
                      E.LoopBlockHandedOff(task_id=task, block_id="b1", outcome="no-progress",
                                           findings=["cb raised TTFT"])])
    ledger.append(s, [E.TaskExited(task_id=task, state="failed-no-progress", reason="budget")])


def test_read_api_by_stream_type_time_and_global_log(ledger):
    t0 = utcnow()
    build_task(ledger, "t1")
    build_task(ledger, "t2")
    log = list(ledger.log())
    assert [r.position for r in log] == sorted(r.position for r in log)
    assert all(r.type != "CommandHandled" for r in log)
    assert len(list(ledger.log(include_bookkeeping=True))) > len(log)
    t1 = list(ledger.events(task="t1"))
    assert {r.stream for r in t1} == {"task:t1"} and len(t1) == 9
    ms = list(ledger.events(types=["MeasurementRecorded"]))
    assert len(ms) == 6 and {r.type for r in ms} == {"MeasurementRecorded"}
    assert list(ledger.events(since=utcnow() + timedelta(hours=1))) == []
    assert len(list(ledger.events(since=t0, task="t2"))) == 9
    assert list(ledger.events(until=t0 - timedelta(seconds=1), task="t1")) == []
    # A window of the global log by position.
    middle = list(ledger.log(log[3].position, log[6].position))
    assert [r.position for r in middle] == [r.position for r in log[3:7]]
    # One stream with its global positions.
    sl = ledger.stream_log("task:t2")
    assert [r.version for r in sl] == list(range(1, 10))
    assert [r.position for r in sl] == [r.position for r in log if r.stream == "task:t2"]
    assert [r.version for r in ledger.stream("task:t2", until_version=4)] == [1, 2, 3, 4]
    with pytest.raises(NotFoundError, match="unknown event type 'Nope'"):
        list(ledger.log(types=["Nope"]))


def test_replay_up_to_any_position_and_fingerprint_is_stable(home):
    with Ledger.open(home) as ledger:
        build_task(ledger, "t1")
        build_task(ledger, "t2")
        full = replay_task(ledger, "t1")
        again = replay_task(ledger, "t1")
        positions = [r.position for r in ledger.stream_log("task:t1")]
        states = [replay_task(ledger, "t1", until=p) for p in positions]
    with Ledger.open(home) as other:  # a fresh process-level reader gives the same answer
        third = replay_task(other, "t1")
    assert full.status == "exited" and full.exit_state == "failed-no-progress"
    assert full.blocks[0].verifications == ["fail"] and full.measurements == 3
    assert fingerprint(full) == fingerprint(again) == fingerprint(third)
    assert full.model_dump() == third.model_dump()
    assert [s.version for s in states] == list(range(1, 10))
    assert [s.last_position for s in states] == positions
    assert len({fingerprint(s) for s in states}) == len(states)
    assert fingerprint(states[-1]) == fingerprint(full)
    # Positions between two of t1's events give the state after the earlier one.
    assert fingerprint(replay_task(ledger_reopen(home), "t1", until=positions[-1] - 1)) in {
        fingerprint(s) for s in states}


def ledger_reopen(home: Path) -> Ledger:
    return Ledger.open(home)


def test_replay_rejects_unknown_task_and_bad_positions(ledger):
    build_task(ledger, "t1")
    with pytest.raises(NotFoundError, match="unknown task 'nope'"):
        replay_task(ledger, "nope")
    with pytest.raises(NotFoundError, match="before the first event"):
        replay_task(ledger, "t1", until=0)
    with pytest.raises(NotFoundError, match="past the end"):
        replay_task(ledger, "t1", until=10_000)
    first = ledger.stream_log("task:t1")[0].position
    # Before its first event a known task replays to the empty state (it did not exist yet).
    before = replay_task(ledger, "t1", until=first - 1)
    assert (before.status, before.version, before.last_position) == ("undefined", 0, 0)


def test_reserved_stream_names_are_refused(ledger):
    with pytest.raises(LedgerError, match="reserved"):
        ledger.append("command:x", [define()])


def test_two_appends_to_one_stream_in_one_save_are_refused_at_once(workspace):
    from infer_forge.ledger.errors import LedgerError
    ev = E.ClaimReleased(claim_id="c1")
    before = workspace.ledger.max_position()  # init's events
    with pytest.raises(LedgerError, match="appends to claims more than once"):
        workspace.ledger.save(Append("claims", [ev]), Append("claims", [ev]))
    assert workspace.ledger.max_position() == before


def test_a_second_open_in_one_process_keeps_the_first_connections_writes_visible(sqlite_home):
    """A long-lived process (the MCP server, a graph run's workers, the tests' in-process CLI)
    opens the ledger again while a connection of its own is open. Reading the file's header
    used to close a descriptor of the file, which drops every POSIX lock the process holds on
    it: another process closing the ledger then took itself for the last user and deleted
    the write-ahead log under the open connection, whose next saves no other process saw."""
    reader = [sys.executable, "-c", "import sys\nfrom infer_forge.ledger.store import Ledger\n"
              "lg = Ledger.open(sys.argv[1])\n"
              "print(len(lg.stream('task:t1')), len(lg.stream('task:other')))", str(sqlite_home)]
    with Ledger.open(sqlite_home) as first:
        first.append("task:t1", [define()])
        Ledger.open(sqlite_home).close()  # the second open and close, in this process
        [other] = _run_together([_spawn("free", str(sqlite_home), "task:other", "w", "1")])
        assert other["ok"] == 1
        first.append("task:t1", [measurement(1)])  # after the other process closed
        seen = subprocess.run(reader, capture_output=True, text=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == ["2", "1"]  # was ['1', '1']: the save went unseen
