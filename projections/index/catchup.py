"""Catching up: batches of notifications, projected (`projector`) into Arrow tables and
written to DuckDB, each batch with the new tracking position in ONE transaction.

Exactly once: a crash or an error before a batch commits leaves rows and tracking as they
were, and the next catch-up resumes from the tracked position. An undecodable event is
recorded in `skipped` in the same transaction as its batch, so it too is read once.

Sealed saves: a save's marker carries the seal of its events (`codec.seal`); a row whose
seal matches, of its type's current version, is the codec's own output and is not checked
again (`Projector.sealed_rows`); any other row is checked as below.

SQL path: each batch's stored rows go to DuckDB once, as Arrow columns (`raw_table`);
`events` and the tables of the high-volume types (`SQL_TOPICS`: tool calls, measurement
runs, handoffs) are extracted there from the payloads (`SQL_INSERTS`) for every row the
projector marked: one the codec's check passed, with as many top-level keys in DuckDB's
reading as in orjson's (`key_counts`). Python keeps the check, every other row, and what
depends on earlier events (a run's dimensions) or is parsed there already (candidate keys,
a run's metrics: Arrow builds the MAP from flat arrays, ~10x cheaper than DuckDB's cast).
"""

from __future__ import annotations

import array
import functools
import gc
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from ..errors import ProjectionError
from .endpoints import ops as endpoint_ops
from .projector import SQL_TOPICS, Projector, TableRows
from .schema import DIM_NAMES, DIMS, PROJECTION, tracked_position

if TYPE_CHECKING:  # imported where used: importing the index (every forge command) stays fast
    import duckdb
    import pyarrow as pa

    from ...ledger.store import Ledger

# Notifications per transaction. Large: a table's insert of a full row group (122,880 rows)
# is written straight to the database file instead of the WAL, and each commit has a fixed
# cost. Memory stays bounded by ~3 batches (one read, one queued, one being written).
DEFAULT_BATCH = 200_000
# During catch-up the WAL may grow this far before DuckDB checkpoints inside a COMMIT;
# one CHECKPOINT at the end instead of one per batch (committed batches in the WAL are
# durable and replayed on open, so exactly-once holds either way).
CATCH_UP_CHECKPOINT_THRESHOLD = "4GB"
# Python's thread switch interval during catch-up. DuckDB's client takes the GIL now and
# then while a query runs (interrupt checks, Arrow scans); with the reading thread busy in
# Python, each take waits up to the interval: the writer's three 200k batches took 9.2 s
# beside a busy Python thread at the default 5 ms, 4.1 s at 0.2 ms, 3.8 s alone.
CATCH_UP_SWITCH_INTERVAL = 0.0005

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
    + ", ".join(f"'{path}'" for _, path in _ENVELOPE) + "]) AS j FROM _batch_raw WHERE keep)")


def _sql_insert(table: str, topic: str, paths: list[str], select: str, join: str = "") -> str:
    """INSERT of `table` from the batch's rows of `topic` marked for SQL: `j[n]` in
    `select` is the text at the n-th path (JSON null or absent: NULL)."""
    return (f"INSERT INTO {table} BY NAME SELECT position, {select} FROM (SELECT position, "
            f"json_extract_string(payload, [{', '.join(repr(p) for p in paths)}]) AS j "
            f"FROM _batch_raw WHERE sql AND type = '{topic}'){join}")


_HEAD = ["$.event_id", "$.occurred_at", "$.task_id", "$.block_id"]
_HEAD_SQL = "j[1] AS event_id, j[2] AS occurred_at, j[3] AS task_id, j[4] AS block_id"
# The projector's handlers of SQL_TOPICS, as SQL over payloads that passed the codec's check
# (every field of exactly its type, so the casts below cannot fail; text lists stay lists).
SQL_INSERTS = {
    "ToolInvoked": _sql_insert("tool_calls", "ToolInvoked", [
        *_HEAD, "$.tool", "$.argv", "$.exit_code", "$.duration_s", "$.error", "$.repo_digest",
        "$.stdout_digest", "$.stderr_digest"],
        f"{_HEAD_SQL}, j[5] AS tool, coalesce(json_extract_string(j[6], '$[*]'), []) AS argv, "
        "j[7]::BIGINT AS exit_code, j[8]::DOUBLE AS duration_s, j[9] AS error, "
        "j[10] AS repo_digest, j[11] AS stdout_digest, j[12] AS stderr_digest"),
    "LoopBlockHandedOff": _sql_insert("handoffs", "LoopBlockHandedOff", [
        *_HEAD, "$.outcome", "$.state_reached", "$.findings", "$.next_sub_goal"],
        f"{_HEAD_SQL}, 'block' AS kind, j[5] AS outcome, j[6] AS state_reached, "
        "coalesce(json_extract_string(j[7], '$[*]'), []) AS findings, "
        "j[8] AS next_sub_goal"),
    # Dimensions, candidate key, repo snapshot and metrics come from Python (`_batch_mx`).
    "MeasurementRecorded": _sql_insert("measurement_runs", "MeasurementRecorded", [
        *_HEAD, "$.run_id", "$.source", "$.repeat", "$.success"],
        f"{_HEAD_SQL}, j[5] AS run_id, j[6] AS source, j[7]::BIGINT AS repeat, "
        "coalesce(j[8]::BOOLEAN, true) AS success, x.* EXCLUDE (position)",
        " JOIN _batch_mx x USING (position)"),
}
# Per row, the top-level keys DuckDB reads: the projector sends a row to SQL only when
# orjson read as many (no duplicate key read first here, last there).
_KEY_COUNTS = (
    "SELECT CASE WHEN type IN ({topics}) AND sealed = 0 THEN len(TRY(json_keys(payload))) "
    "END FROM _batch_keys ORDER BY position").format(
        topics=", ".join(f"'{t}'" for t in sorted(SQL_TOPICS)))


@dataclass
class CatchUpResult:
    events: int  # notifications read (bookkeeping included)
    projected: int  # events written to `events`
    position: int
    seconds: float
    batches: int
    # (position, stream, version, type, error)
    skipped: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CatchUpProgress:
    """Where a long catch-up stands after a committed batch."""

    done: int  # notifications committed by this catch-up
    total: int  # notifications it set out to read
    position: int  # the tracked position now
    seconds: float

    def line(self) -> str:
        rate = self.done / self.seconds if self.seconds > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        return (f"index: {self.done:,}/{self.total:,} notifications "
                f"({100 * self.done / self.total:.0f}%, {rate:,.0f}/s, ~{left:.0f}s left)")


def batch_ops(p: Projector, raw: pa.Table) -> list[tuple[Any, ...]]:
    """The projector's pending batch as database operations (Arrow tables built here, in the
    caller's thread): ("raw", rows, runs) for `events` and the SQL path (`raw`: the batch's
    stored rows, `raw_table`), ("sql", text, params) and ("insert", table, arrow) steps."""
    import pyarrow as pa

    ops: list[tuple[Any, ...]] = []
    if p.b_kept:
        rows = raw.append_column("keep", pa.array(p.b_keep, pa.bool_())).append_column(
            "sql", pa.array(p.b_sql, pa.bool_()))
        ops.append(("raw", rows, _runs_table(p)))
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
                       ("gpu_changes", p.b_gchg), ("profile_ops", p.b_profops),
                       ("model_calls", p.b_models)):
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
        tbl = _with_dims(_table(p.b_meas), p, p.b_meas_dims)
        ops.append(("insert", "measurement_runs", tbl.append_column(
            "metrics", _metrics_map(p.b_moff, p.b_metric, p.b_value))))
    return ops


def prepare_batch(proj: Projector, cur: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]],
                  sql_path: bool = True) -> list[tuple[Any, ...]]:
    """The reading thread's whole work on one batch of stored rows: Arrow columns, seals,
    DuckDB's key counts (on `cur`), the check and projection, and the database operations
    (`batch_ops`) the writer applies. `sql_path=False`: every row checked and projected in
    Python (the reference). The projector keeps the batch's counts (`b_kept`, `b_skipped`)."""
    raw = raw_table(rows)
    if sql_path:
        sealed = proj.sealed_rows(rows)
        proj.project(rows, key_counts(cur, raw, sealed), sealed)
    else:
        proj.project(rows)
    return batch_ops(proj, raw)


def apply(con: duckdb.DuckDBPyConnection, ops: list[tuple[Any, ...]]) -> None:
    for op in ops:
        if op[0] == "sql":
            con.execute(op[1], op[2])
        elif op[0] == "raw":
            _apply_raw(con, op[1], op[2])
        else:
            _insert(con, op[1], op[2])


def _apply_raw(con: duckdb.DuckDBPyConnection, rows: pa.Table, runs: pa.Table | None) -> None:
    """`events` from the kept rows, and the SQL path's tables from the rows marked `sql`."""
    import pyarrow.compute as pc

    con.register("_batch_raw", rows)
    if runs is not None:
        con.register("_batch_mx", runs)
    try:
        con.execute(_EVENTS_INSERT)
        if pc.any(rows["sql"]).as_py():
            for topic, sql in SQL_INSERTS.items():
                if topic != "MeasurementRecorded" or runs is not None:
                    con.execute(sql)
    finally:
        con.unregister("_batch_raw")
        if runs is not None:
            con.unregister("_batch_mx")


def _runs_table(p: Projector) -> pa.Table | None:
    """What Python adds to the runs the SQL path projects: position, candidate key, repo
    snapshot, host state and dimensions (None: no such run)."""
    import pyarrow as pa

    pos, dims, ckey, repo, host, dirty = p.b_mx
    if not pos:
        return None
    return _with_dims(pa.table({
        "position": pa.array(pos, pa.int64()), "candidate": pa.array(ckey, pa.string()),
        "candidate_key": pa.array(ckey, pa.string()),
        "repo_snapshot": pa.array(repo, pa.string()),
        "host": pa.array(host, pa.string()), "contaminated": pa.array(dirty, pa.bool_()),
        "metrics": _metrics_map(p.b_mx_off, p.b_mx_metric, p.b_mx_value)}), p, dims)


def _metrics_map(offsets: list[int], names: list[str], values: list[Any]) -> pa.Array:
    """Runs' metrics as one MAP per run, from flat names and values and each run's offset
    into them (no per-value Python work)."""
    import pyarrow as pa

    return pa.MapArray.from_arrays(pa.array(offsets + [len(names)], pa.int32()),
                                   pa.array(names, pa.string()),
                                   pa.array(values, pa.float64()))


def _with_dims(tbl: pa.Table, p: Projector, dims: list[int]) -> pa.Table:
    """`tbl` with the dimension columns of each row's distinct dimension set (`dims`: an
    index into the projector's `b_dims_index`)."""
    import pyarrow as pa

    distinct = TableRows(DIM_NAMES)
    distinct.rows.extend(p.b_dims_index)  # insertion order = index order
    take = pa.array(dims, pa.int32())
    for name, arr in zip(DIM_NAMES, _table(distinct).columns, strict=True):
        tbl = tbl.append_column(name, arr.take(take))
    return tbl


def raw_table(rows: list[tuple[Any, ...]]) -> pa.Table:
    """Stored rows `(position, stream, version, type, state)` as Arrow columns. A payload
    that is not UTF-8 text is NULL here (no such row is kept: orjson refuses it too)."""
    import pyarrow as pa

    pos, stream, version, typ, state = zip(*rows, strict=True)
    try:
        payload = _text_array(state)
    except ProjectionError:  # rare: find the rows that are not text
        payload = pa.array([_text(b) for b in state], pa.large_string())
    return pa.table({
        "position": pa.array(pos, pa.int64()), "stream": pa.array(stream, pa.string()),
        "version": pa.array(version, pa.int64()), "type": pa.array(typ, pa.string()),
        "payload": payload})


def _text(b: bytes) -> str | None:
    try:
        return bytes(b).decode()
    except UnicodeDecodeError:
        return None


def key_counts(cur: duckdb.DuckDBPyConnection, raw: pa.Table,
               sealed: bytes | bytearray | None = None) -> list[Any]:
    """Per row of `raw`: DuckDB's count of its top-level keys (None where not asked, or not
    JSON to DuckDB, or `sealed`: the codec wrote it, no key twice). Runs on its own cursor
    (the reading thread)."""
    import pyarrow as pa

    marks = bytes(len(raw)) if sealed is None else sealed
    cur.register("_batch_keys", raw.append_column("sealed", pa.Array.from_buffers(
        pa.uint8(), len(raw), [None, pa.py_buffer(marks)])))
    try:
        tbl = cur.sql(_KEY_COUNTS).to_arrow_table()
    finally:
        cur.unregister("_batch_keys")
    return tbl.column(0).to_pylist()


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
        "contaminated": pa.bool_(),
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


def _table(rows: TableRows) -> pa.Table:
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
    data = b"".join(values)
    arr = pa.LargeStringArray.from_buffers(len(values), pa.py_buffer(offsets),
                                           pa.py_buffer(data))
    if data.isascii():  # ASCII is UTF-8 (a C scan, ~10x cheaper than validating)
        return arr
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


def _commit_batch(con: duckdb.DuckDBPyConnection, ops: list[tuple[Any, ...]], first: int, last: int,
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
    ledger: Ledger,
    *,
    batch: int = DEFAULT_BATCH,
    stop: int | None = None,
    before_commit: Callable[[int], None] | None = None,
    artifacts: Callable[[str], bytes] | None = None,
    sql_path: bool = True,
    progress: Callable[[CatchUpProgress], None] | None = None,
) -> CatchUpResult:
    """Project every notification after the tracked position (up to `stop`), one
    transaction per batch. `before_commit(position)` runs inside the transaction just
    before COMMIT (tests inject failures and kills there). `artifacts` reads an artifact by
    digest (the observation summaries' samples; None: samples are not loaded).
    `sql_path=False` projects every row in Python (the reference the SQL path of the
    high-volume types is tested against; same rows). `progress` is called after each
    committed batch of a catch-up longer than one batch (from the writer thread).

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
    cur = con.cursor()  # the reading thread's own, for `key_counts`
    work: queue.Queue[Any] = queue.Queue(maxsize=1)
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
                if progress is not None and head - start > batch:
                    progress(CatchUpProgress(last - start, head - start, last,
                                             time.perf_counter() - t0))
            except BaseException as e:  # handed to the reading thread
                failed.append(e)

    thread = threading.Thread(target=writer, name="index-writer", daemon=True)
    setting = con.execute("SELECT current_setting('checkpoint_threshold'), "
                          "current_setting('threads')").fetchone()
    assert setting is not None  # a scalar SELECT returns one row
    threshold, threads = setting
    con.execute(f"SET checkpoint_threshold = '{CATCH_UP_CHECKPOINT_THRESHOLD}'")
    # One core stays with the reading thread (Python): on 2 cores DuckDB's second thread
    # only contends with it (600k slice: 3-7% slower, 5-20% more CPU).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    con.execute(f"SET threads = {max(1, min(int(threads), (cores or 1) - 1))}")
    # The batch is hundreds of thousands of short-lived tuples and dicts with no cycles:
    # the cyclic collector would rescan them over and over (~25% of the projecting time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, CATCH_UP_SWITCH_INTERVAL))
    thread.start()
    read = kept = 0
    skipped: list[tuple[Any, ...]] = []
    pos = start + 1
    try:
        while pos <= head and not failed:
            hi = min(head, pos + batch - 1)
            rows = list(ledger.rows(pos, hi, page=batch))  # plain tuples: no object per row
            if not rows:
                break
            ops = prepare_batch(proj, cur, rows, sql_path)
            kept += proj.b_kept
            skipped.extend(proj.b_skipped)
            last = rows[-1][0]
            work.put((ops, pos, last))
            read += len(rows)
            pos = last + 1
    finally:
        work.put(None)
        thread.join()
        cur.close()
        if gc_was_enabled:
            gc.enable()
        sys.setswitchinterval(switch)
        con.execute(f"SET checkpoint_threshold = '{threshold}'")
        con.execute(f"SET threads = {int(threads)}")
    if failed:
        raise failed[0]
    con.execute("CHECKPOINT")
    return CatchUpResult(read, kept, committed[0], time.perf_counter() - t0, committed[1],
                         skipped)
