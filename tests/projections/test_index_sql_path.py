"""Catch-up's SQL path (DuckDB extracts tool calls, measurement runs and handoffs from the
payloads) gives the same rows as projecting every event in Python, including for payloads
the codec coerces, skips, or reads with a duplicate key."""

from __future__ import annotations

import orjson
from eventsourcing.persistence import StoredEvent
from infer_forge.ledger import events as E
from infer_forge.projections import index as I

from tests.helpers.index_ledger import build

ENVELOPE = {"event_id": "6a2b3200-4c9a-4ae1-9419-eefcd5e73e3f",
            "occurred_at": "2026-11-29T12:00:00.000000+00:00",
            "actor": {"kind": "tool", "name": "odd", "model": None},
            "task_id": "tune-qwen-h200", "block_id": "b1", "command_id": None,
            "causation_id": None, "input_digests": {}}


def raw(stream: str, topic: str, body: str | bytes) -> StoredEvent:
    state = body if isinstance(body, bytes) else body.encode()
    return StoredEvent(originator_id=stream, originator_version=1, topic=topic, state=state)


def fields(**kw) -> str:
    """A payload's JSON text without its closing brace (to append keys by hand)."""
    return orjson.dumps({**ENVELOPE, **kw}).decode()[:-1]


def odd_rows() -> list[StoredEvent]:
    tool = {"tool": "a", "argv": ["x"], "exit_code": 0, "duration_s": 1.5}
    run = {"run_id": "r", "source": "s", "metrics": {"m": 1.0}, "repeat": 0}
    return [
        # duplicate top-level key: orjson (and so the index) reads the last value
        raw("odd:1", "ToolInvoked", fields(**tool) + ',"tool":"b","_v":1}'),
        # duplicate metric: the last value
        raw("odd:2", "MeasurementRecorded",
            fields(**{**run, "metrics": {}})[:-len('"metrics":{},"repeat":0')]
            + '"metrics":{"m":1.0,"m":2.0},"repeat":0,"_v":1}'),
        # an int where a float is declared: the codec coerces it (not the exact form)
        raw("odd:3", "MeasurementRecorded", fields(**{**run, "metrics": {"m": 3}}) + ',"_v":1}'),
        raw("odd:4", "ToolInvoked", fields(**{**tool, "exit_code": 2.0}) + ',"_v":1}'),
        # invalid: skipped, kept raw in `events`
        raw("odd:5", "MeasurementRecorded",
            fields(**{**run, "metrics": {"m": None}}) + ',"_v":1}'),
        raw("odd:6", "LoopBlockHandedOff", fields(outcome="progress", extra=1) + ',"_v":1}'),
        # not JSON to orjson (DuckDB's reader would take the first two)
        raw("odd:7", "ToolInvoked", fields(**tool) + ',"_v":1,}'),
        raw("odd:8", "ToolInvoked", fields(**{**tool, "duration_s": 1}).replace(
            '"duration_s":1', '"duration_s":NaN') + ',"_v":1}'),
        raw("odd:9", "ToolInvoked", b'{"tool":"\xff"}'),
        # exactly current: the SQL path
        raw("odd:10", "LoopBlockHandedOff", fields(findings=["f"]) + ',"_v":1}'),
    ]


def project(ws, path, sql_path: bool, batch: int) -> tuple[str, list]:
    con = I.connect(path / f"index-{sql_path}-{batch}.duckdb")  # a fresh index each
    try:
        r = I.catch_up(con, ws.ledger, batch=batch, sql_path=sql_path)
        rows = con.execute(
            "SELECT t.position, tool, exit_code, duration_s FROM tool_calls t "
            "JOIN events e USING (position) WHERE e.stream LIKE 'odd:%' ORDER BY 1").fetchall()
        runs = con.execute(
            "SELECT r.position, r.metrics FROM measurement_runs r JOIN events e "
            "USING (position) WHERE e.stream LIKE 'odd:%' ORDER BY 1").fetchall()
        return I.fingerprint(con), [rows, runs, sorted(s[1] for s in r.skipped)]
    finally:
        con.close()


def test_sql_path_equals_python_projection(workspace, tmp_path):
    build(workspace)
    workspace.ledger.recorder.insert_events(odd_rows())
    workspace.ledger.append("task:late", [E.ToolInvoked(tool="t", argv=["a"], task_id="late")])
    reference = project(workspace, tmp_path, sql_path=False, batch=1000)
    tools = [r[1:] for r in reference[1][0]]
    assert tools == [("b", 0, 1.5), ("a", 2, 1.5)]  # the last of a duplicate key; 2.0 -> 2
    assert [m for _, m in reference[1][1]] == [{"m": 2.0}, {"m": 3.0}]
    assert reference[1][2] == ["odd:5", "odd:6", "odd:7", "odd:8", "odd:9"]
    for batch in (1000, 7, 1):
        assert project(workspace, tmp_path, sql_path=True, batch=batch) == reference
