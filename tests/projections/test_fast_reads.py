"""The read commands without the models (projections/fast_reads.py, issue 36): `forge task
list`, `forge task memory` and `forge log` print, byte for byte, what the models' path
prints; a kept row is used only for the stream rows, code and forge.toml it was computed
from; anything the stored JSON cannot answer exactly goes to the models, which decode and
report as before. (What these commands import: tests/cli/test_startup.py.)"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.stored_forms import json_form
from infer_forge.ledger.streams import task_stream
from infer_forge.projections import fast_reads as F

from tests.conftest import insert_raw_event, run_forge
from tests.helpers.index_ledger import build

TASK = "tune-tiny-cpu"
READS = [("task", "list"), ("task", "list", "--json"), ("task", "memory", TASK),
         ("task", "memory", TASK, "--json"), ("task", "memory", "tune-qwen-h200"),
         ("log",), ("log", "--json"), ("log", "--task", TASK), ("log", "--task", TASK, "--json"),
         ("log", "--task", TASK, "--type", "MeasurementRecorded", "--limit", "2", "--json"),
         ("log", "--type", "VerificationRecorded", "--type", "TaskExited")]


def _outputs(home: Path) -> dict[tuple[str, ...], tuple[int, str, str]]:
    out = {}
    for args in READS:
        r = run_forge(*args, home=home)
        out[args] = (r.returncode, r.stdout, r.stderr)
    return out


def _fast(home: Path) -> dict[str, bool]:
    """Which read each fast function can answer now."""
    return {"list": F.fast_task_list(home) is not None,
            "memory": F.fast_task_memory(home, TASK) is not None,
            "log": F.fast_log(home, None, ()) is not None,
            "log-task": F.fast_log(home, TASK, ()) is not None}


@pytest.fixture
def ledger(workspace):
    build(workspace)  # four tasks: blocks, measurements, verifications, decisions, exits
    return workspace


def test_each_read_prints_what_the_models_print(ledger):
    home = ledger.home
    assert not (home / F.READS_NAME).exists()
    assert not any(_fast(home).values())  # nothing kept, no forge.toml validated yet
    by_models = _outputs(home)
    assert all(rc == 0 and err == "" for rc, _out, err in by_models.values()), by_models
    assert _fast(home) == {"list": True, "memory": True, "log": True, "log-task": True}
    assert _outputs(home) == by_models  # byte for byte, text and JSON
    # The log's JSON is each event's own dump (cli.py event_row) with its place.
    events = [r for r in ledger.ledger.log()]
    lines = by_models[("log", "--json")][1].splitlines()
    assert [json.loads(x) for x in lines] == [
        {"position": r.position, "stream": r.stream, "version": r.version, "type": r.type,
         **r.event.model_dump(mode="json")} for r in events]
    fast = F.fast_log(home, None, ())
    assert fast is not None and [r.fields() for r in fast] == [json.loads(x) for x in lines]


def test_an_append_is_read_by_the_models_then_kept(ledger):
    home = ledger.home
    _outputs(home)
    ledger.ledger.append(task_stream(TASK), [E.TaskReopened(task_id=TASK, reason="again")])
    # The kept rows were computed from fewer rows: not used; the log reads the new event.
    assert _fast(home) == {"list": False, "memory": False, "log": True, "log-task": True}
    mem = json.loads(run_forge("task", "memory", TASK, "--json", home=home).stdout)
    assert mem["status"] == "running"
    assert F.fast_task_memory(home, TASK) == mem
    rows = {r["task_id"]: r for r in json.loads(run_forge("task", "list", "--json",
                                                          home=home).stdout)}
    assert rows[TASK]["status"] == "running" and F.fast_task_list(home) == list(rows.values())
    log = run_forge("log", "--task", TASK, home=home).stdout.splitlines()
    assert "TaskReopened" in log[-1]


def test_a_changed_stored_event_is_never_read_from_a_kept_row(ledger):
    home = ledger.home
    _outputs(home)
    db = sqlite3.connect(home / "ledger.sqlite")
    pos, state = db.execute("SELECT rowid, state FROM stored_events WHERE originator_id=? "
                            "AND topic='LoopBlockHandedOff' ORDER BY rowid LIMIT 1",
                            (task_stream(TASK),)).fetchone()
    changed = state.replace(b'"median throughput', b'"MEDIAN throughput')
    assert changed != state
    db.execute("UPDATE stored_events SET state=? WHERE rowid=?", (changed, pos))
    db.commit()
    db.close()
    # The stream's rows are not those the rows were kept for, and the save's seal no
    # longer holds: every read goes to the models (which decode the changed event).
    assert _fast(home) == {"list": False, "memory": False, "log": False, "log-task": False}
    mem = json.loads(run_forge("task", "memory", TASK, "--json", home=home).stdout)
    assert mem["last_handoff"]["state_reached"].startswith("MEDIAN") or any(
        (b["handoff"] or {}).get("state_reached", "").startswith("MEDIAN")
        for b in mem["execution_record"])
    assert "MEDIAN throughput" in run_forge("log", "--task", TASK, "--json", home=home).stdout


def test_a_task_with_an_undecodable_event_is_always_read_by_the_models(ledger):
    home = ledger.home
    _outputs(home)
    stream = task_stream(TASK)
    pos = insert_raw_event(home, stream, ledger.ledger.version(stream) + 1,
                           "MeasurementRecorded", b'{"event_id": "x", "run_')
    for _ in range(2):  # never kept: each read warns of it
        for args in (("task", "memory", TASK), ("task", "list"), ("log", "--task", TASK)):
            r = run_forge(*args, home=home)
            assert r.returncode == 0 and f"position {pos}:" in r.stderr, (args, r.stderr)
        assert _fast(home) == {"list": False, "memory": False, "log": False,
                               "log-task": False}
    # Another task's reads and log stay fast: the planted row is not theirs.
    assert F.fast_task_memory(home, "tune-qwen-h200") is not None
    assert F.fast_log(home, "tune-qwen-h200", ()) is not None


def test_an_unsealed_or_old_event_of_another_stream_sends_only_what_shows_it(ledger):
    home = ledger.home
    _outputs(home)
    # A valid current event written around the store (no save, no seal) on another task.
    ev = E.TaskReopened(task_id="tune-qwen-h200", reason="planted")
    stored = codec.encode(task_stream("tune-qwen-h200"), 0, ev, None)
    stream = task_stream("tune-qwen-h200")
    insert_raw_event(home, stream, ledger.ledger.version(stream) + 1, stored.topic,
                     stored.state)
    assert F.fast_log(home, TASK, ()) is not None  # not the task's: left out either way
    assert F.fast_log(home, None, ()) is None  # the whole log prints it: the models do
    assert F.fast_log(home, "tune-qwen-h200", ()) is None
    whole = run_forge("log", home=home)
    assert whole.returncode == 0 and whole.stdout.count("TaskReopened") == 1


def test_forge_toml_is_validated_by_the_models_before_any_fast_read(ledger):
    home = ledger.home
    by_models = _outputs(home)
    toml = home / "forge.toml"
    text = toml.read_text()
    toml.write_text(text + "\n# an edit\n")
    assert not any(_fast(home).values())
    assert _outputs(home) == by_models and all(_fast(home).values())
    toml.write_text(text + "\n[ledger_typo]\nx = 1\n")  # refused by the schema
    for args in (("task", "list"), ("task", "memory", TASK), ("log", "--task", TASK)):
        r = run_forge(*args, home=home)
        assert r.returncode == 1 and "ledger_typo" in r.stderr, (args, r.stderr)


def test_rows_of_another_version_or_code_are_not_used(ledger, monkeypatch):
    home = ledger.home
    _outputs(home)
    assert all(_fast(home).values())
    monkeypatch.setattr(F, "ROW_VERSION", F.ROW_VERSION + 1)
    assert not any(_fast(home).values())
    monkeypatch.undo()
    assert all(_fast(home).values())
    monkeypatch.setattr(F, "_CODE", [b"another build"])
    assert not any(_fast(home).values())


def test_a_reads_file_that_cannot_be_written_costs_speed_not_answers_and_is_made_again(
        ledger):
    home = ledger.home
    (home / F.READS_NAME).mkdir()  # not a file: cannot be opened or written
    by_models = _outputs(home)
    assert all(rc == 0 for rc, *_ in by_models.values())
    assert _outputs(home) == by_models and not any(_fast(home).values())
    (home / F.READS_NAME).rmdir()
    (home / F.READS_NAME).write_bytes(b"not a database" * 100)  # damaged: made again
    assert not any(_fast(home).values())
    assert _outputs(home) == by_models and all(_fast(home).values())


def test_the_stored_forms_are_the_models_dumps(ledger):
    """Each stored row of the test ledger, through the table, is its event's JSON dump."""
    seen = set()
    for pos, _s, _v, topic, state in ledger.ledger.rows():
        if topic == "CommandHandled":
            continue
        seen.add(topic)
        ev = codec.decode(_s, _v, topic, state)
        assert json_form(topic, orjson.loads(state)) == ev.model_dump(mode="json"), pos
    assert {"VerificationRecorded", "MeasurementRecorded", "TaskDefined"} <= seen
    # Not the current form: an older version, a field missing or unknown, another type.
    payload = orjson.loads(codec.encode("t", 1, E.TaskReopened(task_id="t", reason="r"),
                                        None).state)
    assert json_form("TaskReopened", payload) is not None
    assert json_form("TaskReopened", {**payload, "_v": 0}) is None
    assert json_form("TaskReopened", {k: v for k, v in payload.items() if k != "reason"}) \
        is None
    assert json_form("TaskReopened", {**payload, "extra": 1}) is None
    assert json_form("NoSuchEvent", payload) is None


def test_a_torn_kept_row_is_read_by_the_models_and_kept_again(ledger):
    home = ledger.home
    by_models = _outputs(home)
    db = sqlite3.connect(home / F.READS_NAME)
    db.execute("UPDATE task_rows SET memory='{\"status\": ', list_row='[' WHERE task_id=?",
               (TASK,))
    db.commit()
    db.close()
    assert F.fast_task_memory(home, TASK) is None and F.fast_task_list(home) is None
    assert _outputs(home) == by_models and all(_fast(home).values())


def test_a_time_range_is_read_from_the_stored_json_as_the_models_read_it(ledger):
    home = ledger.home
    times = sorted(r.event.occurred_at for r in ledger.ledger.log())
    lo, hi = times[len(times) // 3], times[2 * len(times) // 3]  # events on both bounds
    ranges = [("--since", lo.isoformat()), ("--until", hi.isoformat()),
              ("--since", lo.isoformat(), "--until", hi.isoformat())]
    cases = [(*base, *r) for r in ranges
             for base in (("log",), ("log", "--json"), ("log", "--task", TASK, "--json"))]
    by_models = {args: run_forge(*args, home=home) for args in cases}  # nothing kept yet
    assert all(r.returncode == 0 for r in by_models.values())
    assert F.fast_log(home, TASK, (), lo, hi) is not None
    for args, r in by_models.items():
        fast = run_forge(*args, home=home)
        assert (fast.returncode, fast.stdout, fast.stderr) == (0, r.stdout, r.stderr), args
    # Bounds are inclusive, as the models' path has them: an event at `lo` is in.
    at_lo = F.fast_log(home, None, (), lo, lo) or []
    assert at_lo and {datetime.fromisoformat(x.fields()["occurred_at"]) for x in at_lo} == {lo}
    whole = F.fast_log(home, None, ())
    assert whole is not None and 0 < len(F.fast_log(home, None, (), lo, hi) or []) < len(whole)
