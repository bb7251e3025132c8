"""Every field of each event the index projects reaches `forge sql`: it is a column of a table
the event's rows land in (same name), or the projector declares it left out
(`projector.LEFT_OUT`, next to its handlers) with where it went or why. Behavioural: the
fields come from the event classes (pydantic), the tables and columns from a real DuckDB
index after a real catch-up of a real ledger holding every projected type."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from infer_forge.ledger import events as E
from infer_forge.ledger.streams import (
    DIAGNOSES_STREAM,
    ENDPOINTS_STREAM,
    NODES_STREAM,
    PROFILES_STREAM,
    task_stream,
)
from infer_forge.projections import index as I
from infer_forge.projections.index.projector import ENVELOPE_LEFT_OUT, LEFT_OUT, PROJECTED_TYPES

from tests.helpers.index_ledger import build

ENVELOPE = set(E.Event.model_fields)


def _the_other_projected_types(ws) -> None:
    """The projected types tests/helpers/index_ledger.py does not write, one each."""
    tool = E.Actor.tool("forge-test")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    t1 = t0 + timedelta(seconds=60)
    tid = "tune-qwen-h200"
    run = next(r for r in ws.ledger.stream(task_stream(tid))
               if isinstance(r.event, E.MeasurementRecorded)).event
    ws.ledger.append(task_stream(tid), [
        E.SkillsProvided(skills=["flags"], query="tune", scores={"flags": 0.5},
                         task_id=tid, block_id=run.block_id, actor=tool),
        E.MeasurementInvalidated(measurement_event_id=run.event_id, reason="bad run",
                                 task_id=tid, actor=tool),
        E.TaskReopened(reason="again", task_id=tid, actor=tool),
        E.ModelCalled(tier="small", model="m", family="f", tokens_in=10, tokens_out=2,
                      latency_s=0.1, cost_usd=0.001, task_id=tid, block_id=run.block_id,
                      actor=E.Actor.agent("forge-agent", "m"))])
    ws.ledger.append(NODES_STREAM, [
        E.HostSummarized(host="h1", start=t0, end=t1, interval_s=1.0, samples=60, missed=0,
                         cpu_pct_mean=10.0, cpu_pct_max=20.0, mem_used_max_mib=100,
                         gpus=(E.GpuWindow(uuid="GPU-1", samples=60),), nvml="ok",
                         actor=tool),
        E.GpuProcessesChanged(host="h1", gpu_uuid="GPU-1", at=t1, pids=(7,), added=(7,),
                              removed=(), actor=tool)])
    ws.ledger.append(ENDPOINTS_STREAM, [
        E.EndpointSummarized(url="http://127.0.0.1:1", start=t0, end=t1, interval_s=1.0,
                             samples=60, missed=0, errors=0, last_error="", actor=tool)])
    ws.ledger.append(DIAGNOSES_STREAM, [
        E.DiagnosisRecorded(url="http://127.0.0.1:1", start=t0, end=t1, interval_s=1.0,
                            samples=60, log_lines_read=0, healthy=True, actor=tool)])
    ws.ledger.append(PROFILES_STREAM, [
        E.ProfileCaptured(engine="sglang", url="http://127.0.0.1:1", method="torch-profiler",
                          duration_s=1.0, kind="gpu", unit="ms", total_ms=10.0, samples=1,
                          top=(E.ProfileOp(name="gemm", total_ms=10.0, share=1.0, count=1),),
                          actor=tool)])


def _projected(ws) -> tuple[dict[str, set[str]], set[str]]:
    """Event type -> the columns of every table its rows landed in (found by the tables'
    position columns), and the `events` table's columns."""
    build(ws)
    _the_other_projected_types(ws)
    I.update(ws)
    with I.open_index(ws) as s:
        con = s.con
        type_at = dict(con.execute("SELECT position, type FROM events").fetchall())
        cols: dict[str, list[str]] = defaultdict(list)
        for table, column in con.execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = 'main' AND table_name IN (SELECT table_name FROM "
                "information_schema.tables WHERE table_type = 'BASE TABLE')").fetchall():
            cols[table].append(column)
        out: dict[str, set[str]] = defaultdict(set)
        for table, names in cols.items():
            if table in ("events", "skipped", "tracking"):
                continue
            for c in names:
                if c == "position" or c.endswith("_position"):
                    for (p,) in con.execute(f"SELECT DISTINCT {c} FROM {table}").fetchall():
                        if p in type_at:
                            out[type_at[p]] |= set(names)
        return dict(out), set(cols["events"])


def test_every_field_of_a_projected_event_is_a_column_or_declared_left_out(workspace):
    columns, envelope_columns = _projected(workspace)
    # Every projected type was exercised (a new handler needs an event above).
    assert sorted(set(PROJECTED_TYPES) - set(columns)) == []
    vanished = {}
    for topic in sorted(PROJECTED_TYPES):
        fields = set(E.EVENT_TYPES[topic].model_fields) - ENVELOPE
        left_out = LEFT_OUT.get(topic, {})
        assert sorted(set(left_out) - fields) == [], topic  # no stale declaration
        missing = sorted(fields - columns[topic] - set(left_out))
        if missing:
            vanished[topic] = missing
    assert vanished == {}
    # The envelope (every event's common fields) is the `events` table's.
    assert sorted(ENVELOPE - envelope_columns - set(ENVELOPE_LEFT_OUT)) == []
