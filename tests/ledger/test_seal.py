"""Sealed saves: each save's marker carries the sha256 of its events as stored
(`codec.seal`). `forge check` finds a type or payload changed after the save; the index
reads a sealed payload of the current version without checking it again, and anything not
sealed (changed, unsealed, split across batches) is checked as before: same rows either way."""

from __future__ import annotations

import sqlite3

import orjson
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.check import check_workspace
from infer_forge.ledger.streams import COMMAND_PREFIX, task_stream
from infer_forge.projections import index as I
from infer_forge.projections.index.projector import Projector

from tests.conftest import insert_raw_event
from tests.helpers.index_ledger import build


def _rows(ws) -> list[tuple]:
    return list(ws.ledger.rows(1))


def _tool_save(ws, task: str = "t1", exit_code: int = 0):
    """One save of two events (a tool call and a measurement) on a task stream."""
    return ws.ledger.append(task_stream(task), [
        E.ToolInvoked(task_id=task, block_id="b1", tool="bench", argv=["forge", "bench"],
                      exit_code=exit_code, duration_s=1.5),
        E.MeasurementRecorded(task_id=task, block_id="b1", run_id=f"{task}-r1",
                              source="manual", metrics={"output_throughput": 10.0})])


def _tamper(ws, position: int, *, state: bytes | None = None, topic: str | None = None):
    con = sqlite3.connect(ws.home / "ledger.sqlite")
    try:
        if state is not None:
            con.execute("UPDATE stored_events SET state=? WHERE rowid=?", (state, position))
        if topic is not None:
            con.execute("UPDATE stored_events SET topic=? WHERE rowid=?", (topic, position))
        con.commit()
    finally:
        con.close()


def _catch_up(ws, path, *, sql_path: bool = True, batch: int = 1000):
    con = I.connect(path)
    try:
        r = I.catch_up(con, ws.ledger, batch=batch, sql_path=sql_path)
        return I.fingerprint(con), sorted((s[0], s[4]) for s in r.skipped)
    finally:
        con.close()


def test_a_save_seals_its_events_as_stored(workspace):
    res = _tool_save(workspace)
    rows = _rows(workspace)
    marker = rows[-1]
    assert marker[3] == "CommandHandled" and marker[1] == COMMAND_PREFIX + res.command_id
    saved = rows[-3:-1]
    assert [r[0] for r in saved] == res.positions
    seal = orjson.loads(marker[4])["seal"]
    assert seal == codec.seal([r[3] for r in saved], [r[4] for r in saved])
    assert seal.startswith("sha256:") and len(seal) == len("sha256:") + 64
    # The marker decodes (v2) with its seal; the seal covers types and payloads both.
    ev = codec.decode(marker[1], marker[2], marker[3], marker[4])
    assert isinstance(ev, E.CommandHandled) and ev.seal == seal
    assert codec.seal(["ToolInvoked", "ToolInvoked"], [r[4] for r in saved]) != seal
    assert codec.seal([r[3] for r in saved], [saved[1][4], saved[0][4]]) != seal


def test_the_index_trusts_exactly_the_sealed_rows(workspace):
    _tool_save(workspace, "t1")
    # An event written around the store (no marker): not sealed.
    plain = E.ToolInvoked(task_id="t2", tool="x", argv=[])
    pos = insert_raw_event(workspace.home, task_stream("t2"), 1, "ToolInvoked",
                           codec.encode(task_stream("t2"), 1, plain, None).state)
    _tool_save(workspace, "t3")
    rows = _rows(workspace)
    marks = Projector.sealed_rows(rows)
    sealed = {r[0] for r, m in zip(rows, marks, strict=True) if m}
    events = {r[0] for r in rows if r[3] != "CommandHandled"}
    assert sealed == events - {pos} and pos in events  # markers and the planted row: not
    # A batch that ends before a save's marker cannot see its seal: those rows are checked.
    cut = next(i for i, r in enumerate(rows) if r[1] == task_stream("t3"))
    head = Projector.sealed_rows(rows[:cut + 2])  # t3's two events, not its marker
    assert head[:cut] == marks[:cut] and head[cut:] == b"\x00\x00"


def test_a_payload_changed_after_its_save_is_checked_and_reported(workspace, tmp_path):
    build(workspace)
    res = _tool_save(workspace, "t9")
    tool_pos = res.positions[0]
    state = workspace.ledger.raw_state(tool_pos)
    bad = state.replace(b'"exit_code":0', b'"exit_code":"oops"')
    assert bad != state and bad.endswith(b',"_v":%d}' % E.ToolInvoked.SCHEMA_VERSION)
    _tamper(workspace, tool_pos, state=bad)
    # The seal no longer matches: nothing of the save is trusted, the check refuses the
    # changed payload (skipped, with the codec's error), the index equals the reference.
    rows = _rows(workspace)
    marks = Projector.sealed_rows(rows)
    assert not any(m for r, m in zip(rows, marks, strict=True) if r[0] in res.positions)
    sealed = _catch_up(workspace, tmp_path / "a.duckdb")
    reference = _catch_up(workspace, tmp_path / "b.duckdb", sql_path=False)
    assert sealed == reference
    assert [p for p, _ in sealed[1]] == [tool_pos] and "exit_code" in sealed[1][0][1]
    report = check_workspace(workspace)
    seal_problems = [p for p in report.problems if "seal" in p]
    assert len(seal_problems) == 1 and repr(res.command_id) in seal_problems[0]
    assert f"positions {res.positions[0]}..{res.positions[-1]}" in seal_problems[0]


def test_a_type_changed_after_its_save_breaks_the_seal(workspace, tmp_path):
    res = _tool_save(workspace, "t1")
    # A valid ToolInvoked payload read as a LoopBlockHandedOff: only the seal says so.
    _tamper(workspace, res.positions[0], topic="LoopBlockHandedOff")
    rows = _rows(workspace)
    marks = Projector.sealed_rows(rows)
    assert marks[0] and not any(m for r, m in zip(rows, marks, strict=True)
                                if r[0] in res.positions)  # the init save stays sealed
    assert any("seal" in p for p in check_workspace(workspace).problems)
    sealed = _catch_up(workspace, tmp_path / "a.duckdb")
    assert sealed == _catch_up(workspace, tmp_path / "b.duckdb", sql_path=False)
    assert [p for p, _ in sealed[1]] == [res.positions[0]]


def test_sealed_and_checked_paths_give_the_same_index_in_any_batching(workspace, tmp_path):
    build(workspace)
    for i in range(5):
        _tool_save(workspace, f"t{i}", exit_code=i)
    reference = _catch_up(workspace, tmp_path / "ref.duckdb", sql_path=False)
    assert reference[1] == []
    for batch in (1000, 5, 2, 1):  # small batches split saves from their markers
        assert _catch_up(workspace, tmp_path / f"s{batch}.duckdb", batch=batch) == reference
    assert check_workspace(workspace).ok


def test_an_unsealed_v1_marker_still_reads_and_checks(workspace):
    plain = E.ToolInvoked(task_id="old", tool="x", argv=[])
    stream, cid = task_stream("old"), "c0ffee"
    insert_raw_event(workspace.home, stream, 1, "ToolInvoked",
                     codec.encode(stream, 1, plain, None, cid).state)
    v1 = orjson.dumps({**orjson.loads(codec.encode(
        COMMAND_PREFIX + cid, 1, E.CommandHandled(appended={stream: [1, 1]}, command_id=cid),
        None).state), "_v": 1})
    v1 = v1.replace(b'"seal":null,', b"")
    assert b"seal" not in v1
    insert_raw_event(workspace.home, COMMAND_PREFIX + cid, 1, "CommandHandled", v1)
    marker = _rows(workspace)[-1]
    ev = codec.decode(marker[1], marker[2], marker[3], marker[4])
    assert isinstance(ev, E.CommandHandled) and ev.seal is None  # upcast from v1
    rows = _rows(workspace)
    assert not any(Projector.sealed_rows(rows)[len(rows) - 2:])
    report = check_workspace(workspace)
    assert report.ok, report.problems


def test_saves_are_sealed_and_read_sealed_on_both_backends(backend_home, tmp_path):
    from infer_forge.ledger.workspace import open_workspace

    with open_workspace(backend_home) as ws:
        saves = [_tool_save(ws, f"t{i}", exit_code=i) for i in range(3)]
        rows = _rows(ws)
        assert all(type(r[4]) is bytes for r in rows)  # what the sealed path reads
        marks = Projector.sealed_rows(rows)
        for res in saves:
            assert all(marks[i] for i, r in enumerate(rows) if r[0] in res.positions)
        assert not any(m for r, m in zip(rows, marks, strict=True) if r[3] == "CommandHandled")
        assert _catch_up(ws, tmp_path / "a.duckdb") == _catch_up(
            ws, tmp_path / "b.duckdb", sql_path=False)
        assert check_workspace(ws).ok


def test_forge_check_names_the_save_whose_seal_broke(workspace):
    from tests.conftest import run_forge

    res = _tool_save(workspace, "t1")
    state = workspace.ledger.raw_state(res.positions[1])
    _tamper(workspace, res.positions[1], state=state.replace(b'"source":"manual"',
                                                             b'"source":"edited"'))
    out = run_forge("check", home=workspace.home)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if "seal" in ln]
    assert repr(res.command_id) in line and f"{res.positions[0]}..{res.positions[1]}" in line
