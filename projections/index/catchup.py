"""Catching up: batches of notifications, projected (`projector`) into Arrow tables and
written to DuckDB, each batch with the new tracking position in ONE transaction.

Exactly once: a crash or an error before a batch commits leaves rows and tracking as they
were, and the next catch-up resumes from the tracked position. An undecodable event is
recorded in `skipped` in the same transaction as its batch, so it too is read once.
"""

from __future__ import annotations

import array
import functools
import gc
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from ..errors import ProjectionError
from .endpoints import ops as endpoint_ops
from .projector import Projector, _Rows
from .schema import DIM_NAMES, DIMS, PROJECTION, tracked_position

if TYPE_CHECKING:  # imported where used: importing the index (every forge command) stays fast
    import duckdb
    import pyarrow as pa

# Notifications per transaction. Large: a table's insert of a full row group (122,880 rows)
# is written straight to the database file instead of the WAL, and each commit has a fixed
# cost. Memory stays bounded by ~3 batches (one read, one queued, one being written).
DEFAULT_BATCH = 200_000
# During catch-up the WAL may grow this far before DuckDB checkpoints inside a COMMIT;
# one CHECKPOINT at the end instead of one per batch (committed batches in the WAL are
# durable and replayed on open, so exactly-once holds either way).
CATCH_UP_CHECKPOINT_THRESHOLD = "4GB"

# Envelope columns of `events`, extracted from the payload by DuckDB (one parse per row).
_ENVELOPE = [("event_id", "$.event_id"), ("occurred_at", "$.occurred_at"),
             ("actor_kind", "$.actor.kind"), ("actor_name", "$.actor.name"),
             ("actor_model", "$.actor.model"), ("task_id", "$.task_id"),
             ("block_id", "$.block_id"), ("command_id", "$.command_id"),
             ("causation_id", "$.causation_id"), ("schema_version", "$._v")]
_EVENTS_INSERT = (
    "INSERT INTO events BY NAME SELECT position, stream, version, type, payload, "
    + ", ".join(f"j[{i + 1}] AS {name}" for i, (name, _) in enumerate(_ENVELOPE[:-1]))
    + f", coalesce(TRY_CAST(j[{len(_ENVELOPE)}] AS BIGINT), 1) AS schema_version "
    "FROM (SELECT *, json_extract_string(payload, ["
    + ", ".join(f"'{path}'" for _, path in _ENVELOPE) + "]) AS j FROM _batch_events)")


@dataclass
class CatchUpResult:
    events: int  # notifications read (bookkeeping included)
    projected: int  # events written to `events`
    position: int
    seconds: float
    batches: int
    skipped: list[tuple] = field(default_factory=list)  # (position, stream, version, type, error)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def batch_ops(p: Projector) -> list[tuple]:
    """The projector's pending batch as database operations (Arrow tables built here, in the
    caller's thread): ("sql", text, params) and ("insert", table, arrow) steps."""
    import pyarrow as pa

    ops: list[tuple] = []
    if p.b_events:
        pos, stream, version, typ, state = zip(*p.b_events, strict=True)
        ops.append(("events", pa.table({
            "position": pa.array(pos, pa.int64()), "stream": pa.array(stream, pa.string()),
            "version": pa.array(version, pa.int64()), "type": pa.array(typ, pa.string()),
            "payload": _text_array(state)})))
    if p.b_points:
        rows = list(p.b_points.values())
        ops.append(("sql", "DELETE FROM points WHERE point_hash IN (SELECT unnest($1))",
                    [[r["point_hash"] for r in rows]]))
        ops.append(("insert", "points", _rows_table(rows)))
    if p.b_profiles:
        rows = list(p.b_profiles.values())
        ops.append(("sql", "DELETE FROM runtime_profiles WHERE service || '@' || "
                           "coalesce(rev::VARCHAR, '') IN (SELECT unnest($1))",
                    [[f"{r['service']}@{'' if r['rev'] is None else r['rev']}"
                      for r in rows]]))
        ops.append(("insert", "runtime_profiles", _rows_table(rows)))
    if p.b_tasks:
        rows = list(p.b_tasks.values())
        ops.append(("sql", "DELETE FROM tasks WHERE task_id IN (SELECT unnest($1))",
                    [[r["task_id"] for r in rows]]))
        ops.append(("insert", "tasks", _rows_table(rows)))
    for name, cols in (("loop_blocks", p.b_blocks), ("tool_calls", p.b_tools),
                       ("invalidations", p.b_inval), ("verifications", p.b_verif),
                       ("gate_verdicts", p.b_gates), ("decisions", p.b_dec),
                       ("handoffs", p.b_hand), ("skills_provided", p.b_skills),
                       ("host_windows", p.b_hwin), ("gpu_windows", p.b_gwin),
                       ("gpu_changes", p.b_gchg), ("profile_ops", p.b_profops)):
        if len(cols):
            ops.append(("insert", name, _table(cols)))
    if p.b_hsamp["t"]:
        ts = pa.timestamp("us", tz="UTC")
        h = p.b_hsamp
        ops.append(("insert", "host_samples", pa.table({
            "position": pa.array(h["position"], pa.int64()),
            "host": pa.array(h["host"], pa.string()), "t": pa.array(h["t"], ts),
            "cpu_pct": pa.array(h["cpu_pct"], pa.float64()),
            "mem_used_mib": pa.array(h["mem_used_mib"], pa.int64())})))
    if p.b_gsamp["t"]:
        g = p.b_gsamp
        ops.append(("insert", "gpu_samples", pa.table({
            "position": pa.array(g["position"], pa.int64()),
            "host": pa.array(g["host"], pa.string()),
            "gpu_uuid": pa.array(g["gpu_uuid"], pa.string()),
            "t": pa.array(g["t"], pa.timestamp("us", tz="UTC")),
            "util": pa.array(g["util"], pa.float64()),
            "mem_used_mib": pa.array(g["mem_used_mib"], pa.int64()),
            "procs": pa.array(g["procs"], pa.int64())})))
    ops.extend(endpoint_ops(p.b_endpoints))
    if p.b_skipped:
        ops.append(("insert", "skipped", pa.table({
            n: pa.array(v, t) for n, v, t in zip(
                ("position", "stream", "version", "type", "error"),
                zip(*p.b_skipped, strict=True),
                (pa.int64(), pa.string(), pa.int64(), pa.string(), pa.string()),
                strict=True)})))
    if len(p.b_meas):
        # Metrics as one MAP per run, built from flat arrays (no per-value Python work).
        offsets = pa.array(p.b_moff + [len(p.b_metric)], pa.int32())
        metrics = pa.MapArray.from_arrays(offsets, pa.array(p.b_metric, pa.string()),
                                          pa.array(p.b_value, pa.float64()))
        tbl = _table(p.b_meas)
        distinct = _Rows(DIM_NAMES)
        distinct.rows.extend(p.b_dims_index)  # insertion order = index order
        take = pa.array(p.b_meas_dims, pa.int32())
        for name, arr in zip(DIM_NAMES, _table(distinct).columns, strict=True):
            tbl = tbl.append_column(name, arr.take(take))
        ops.append(("insert", "measurement_runs", tbl.append_column("metrics", metrics)))
    return ops


def apply(con: duckdb.DuckDBPyConnection, ops: list[tuple]) -> None:
    for op in ops:
        if op[0] == "sql":
            con.execute(op[1], op[2])
        elif op[0] == "events":
            con.register("_batch_events", op[1])
            try:
                con.execute(_EVENTS_INSERT)
            finally:
                con.unregister("_batch_events")
        else:
            _insert(con, op[1], op[2])


@functools.cache
def arrow_types() -> dict[str, pa.DataType]:
    """Arrow types of the batch columns (given, not inferred: inference costs a pass per
    column); built on first use."""
    import pyarrow as pa

    sql_arrow = {"BIGINT": pa.int64(), "DOUBLE": pa.float64(), "VARCHAR": pa.string()}
    return {
        **{n: sql_arrow[t] for n, t in DIMS},
        "position": pa.int64(), "version": pa.int64(), "schema_version": pa.int64(),
        "block_index": pa.int64(), "exit_code": pa.int64(), "repeat": pa.int64(),
        "rank": pa.int64(), "score": pa.float64(),
        "defined_position": pa.int64(), "last_position": pa.int64(),
        "duration_s": pa.float64(), "observed": pa.float64(), "threshold": pa.float64(),
        "baseline": pa.float64(), "success": pa.bool_(), "passed": pa.bool_(),
        "argv": pa.list_(pa.string()), "evidence": pa.list_(pa.string()),
        "findings": pa.list_(pa.string()),
        "interval_s": pa.float64(), "samples": pa.int64(), "missed": pa.int64(),
        "cpu_pct_mean": pa.float64(), "cpu_pct_max": pa.float64(),
        "mem_used_max_mib": pa.int64(), "samples_loaded": pa.bool_(),
        "util_mean": pa.float64(), "util_max": pa.float64(), "busy_samples": pa.int64(),
        "idle_streak": pa.int64(), "pids": pa.list_(pa.int64()),
        "added": pa.list_(pa.int64()), "removed": pa.list_(pa.int64()),
        "total_ms": pa.float64(), "share": pa.float64(), "count": pa.int64(),
    }


def _table(rows: _Rows) -> pa.Table:
    import pyarrow as pa

    types = arrow_types()
    return pa.table({n: _array(v, types.get(n, pa.string()))
                     for n, v in rows.columns().items()})


def _array(values: list[Any], typ: pa.DataType | None = None) -> pa.Array:
    import pyarrow as pa

    try:
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Mixed types in one column (e.g. an int where text was expected): keep as text.
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _text_array(values: tuple[bytes, ...]) -> pa.Array:
    """UTF-8 payloads as one Arrow string array, built from one joined buffer and their
    offsets (8x cheaper than converting object by object), then validated."""
    import pyarrow as pa

    offsets = array.array("q", accumulate(map(len, values), initial=0))
    arr = pa.LargeStringArray.from_buffers(len(values), pa.py_buffer(offsets),
                                           pa.py_buffer(b"".join(values)))
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as e:
        raise ProjectionError(f"payload is not UTF-8 text: {e}") from None
    return arr


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    import pyarrow as pa

    names = list(rows[0])
    return pa.table({n: _array([r.get(n) for r in rows]) for n in names})


def _insert(con: duckdb.DuckDBPyConnection, table: str, tbl: pa.Table) -> None:
    name = f"_batch_{table}"
    con.register(name, tbl)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {name}")
    finally:
        con.unregister(name)


def _commit_batch(con: duckdb.DuckDBPyConnection, ops: list[tuple], first: int, last: int,
                  before_commit: Callable[[int], None] | None) -> None:
    """One batch's rows and the new tracking position, in one transaction."""
    import duckdb

    con.execute("BEGIN TRANSACTION")
    try:
        apply(con, ops)
        con.execute("INSERT INTO tracking VALUES (?, ?) ON CONFLICT (projection) "
                    "DO UPDATE SET position = excluded.position", [PROJECTION, last])
        if before_commit is not None:
            before_commit(last)
        con.execute("COMMIT")
    except BaseException as e:
        con.execute("ROLLBACK")
        if isinstance(e, duckdb.Error):
            raise ProjectionError(f"index catch-up failed at positions {first}..{last}: "
                                  f"{' '.join(str(e).split())}") from None
        raise


def catch_up(
    con: duckdb.DuckDBPyConnection,
    ledger: Any,
    *,
    batch: int = DEFAULT_BATCH,
    stop: int | None = None,
    before_commit: Callable[[int], None] | None = None,
    artifacts: Callable[[str], bytes] | None = None,
) -> CatchUpResult:
    """Project every notification after the tracked position (up to `stop`), one
    transaction per batch. `before_commit(position)` runs inside the transaction just
    before COMMIT (tests inject failures and kills there). `artifacts` reads an artifact by
    digest (the observation summaries' samples; None: samples are not loaded).

    Pipelined: this thread reads and projects batch N+1 (Python) while a writer thread
    inserts and commits batch N (DuckDB, which releases the GIL). Batches commit strictly
    in order; the first failure stops the run and is raised here, after the writer ends.
    After the last batch, one CHECKPOINT (counted in the result's time).
    """
    t0 = time.perf_counter()
    start = tracked_position(con)
    head = ledger.max_position() if stop is None else stop
    if head <= start:
        return CatchUpResult(0, 0, start, time.perf_counter() - t0, 0)
    proj = Projector(con, artifacts)  # reads its caches now, before the writer owns the connection
    work: queue.Queue = queue.Queue(maxsize=1)
    failed: list[BaseException] = []
    committed = [start, 0]  # last position, batches

    def writer() -> None:
        while (item := work.get()) is not None:
            if failed:
                continue  # drain: nothing after a failed batch may commit
            ops, first, last = item
            try:
                _commit_batch(con, ops, first, last, before_commit)
                committed[0], committed[1] = last, committed[1] + 1
            except BaseException as e:  # handed to the reading thread
                failed.append(e)

    thread = threading.Thread(target=writer, name="index-writer", daemon=True)
    setting = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()
    assert setting is not None  # a scalar SELECT returns one row
    threshold = setting[0]
    con.execute(f"SET checkpoint_threshold = '{CATCH_UP_CHECKPOINT_THRESHOLD}'")
    # The batch is hundreds of thousands of short-lived tuples and dicts with no cycles:
    # the cyclic collector would rescan them over and over (~25% of the projecting time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    thread.start()
    read = kept = 0
    skipped: list[tuple] = []
    pos = start + 1
    try:
        while pos <= head and not failed:
            hi = min(head, pos + batch - 1)
            rows = list(ledger.rows(pos, hi, page=batch))  # plain tuples: no object per row
            if not rows:
                break
            kept += proj.project(rows)
            skipped.extend(proj.b_skipped)
            last = rows[-1][0]
            work.put((batch_ops(proj), pos, last))
            read += len(rows)
            pos = last + 1
    finally:
        work.put(None)
        thread.join()
        if gc_was_enabled:
            gc.enable()
        con.execute(f"SET checkpoint_threshold = '{threshold}'")
    if failed:
        raise failed[0]
    con.execute("CHECKPOINT")
    return CatchUpResult(read, kept, committed[0], time.perf_counter() - t0, committed[1],
                         skipped)
