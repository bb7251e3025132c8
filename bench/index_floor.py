"""The native floor of index catch-up: the least work any layout of today's index costs on
this machine (issue 36, part 2), for `bench/index.py --floor`.

An idealised pipeline with no Python per event: the ledger's rows read natively into Arrow
(ADBC's SQLite driver when installed, `pip install adbc-driver-sqlite`; else `sqlite3` and the
catch-up's own Arrow columns), then, per batch, DuckDB (every core) extracts the columns of the
high-volume tables from the payloads of the Arrow batch, unpersisted, and pyarrow writes each
table as a Parquet segment (zstd level 1, the cheapest way found to persist them: 3-4x cheaper
than a DuckDB table). The tables: `events` (envelope columns and the payload), `tool_calls`
and `handoffs` (catch-up's own SQL), `measurement_runs` (envelope, metrics as a MAP, candidate
text, host state, point reference, the task's point and type by a join), `verifications`,
`gate_verdicts`, `loop_blocks`.

What it leaves out, all of which a real catch-up must do: the seal check (every row trusted),
the rare types' tables and the upserted ones (tasks, points, profiles), dimensions beyond the
task's point hash and type, the candidate key's and JSON columns' sorted-key form, `skipped`,
exactly-once bookkeeping (tracking, transactions, segment lists) and compaction. So a real
catch-up is slower than this; when this is already slower than a goal, the goal is below
what the machine allows for this much data in this shape.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from infer_forge.projections.index import catchup as C

_ROWS = ("SELECT rowid AS position, originator_id AS stream, originator_version AS version, "
         "topic AS type, state FROM stored_events WHERE rowid BETWEEN ? AND ? ORDER BY rowid")


def _reader(ledger: Path) -> tuple[str, Any]:
    """(which read, a function (first, last) -> Arrow table of the stored rows)."""
    import pyarrow as pa

    try:
        import adbc_driver_sqlite.dbapi as adbc
    except ImportError:
        con = sqlite3.connect(ledger)

        def read_sqlite3(first: int, last: int) -> pa.Table:
            return C.raw_table(con.execute(_ROWS, (first, last)).fetchall())

        return "sqlite3 + Arrow columns (adbc-driver-sqlite not installed)", read_sqlite3
    acon = adbc.connect(str(ledger))

    def read_adbc(first: int, last: int) -> pa.Table:
        cur = acon.cursor()
        try:
            cur.execute(_ROWS, (first, last))
            tbl = cur.fetch_arrow_table()
        finally:
            cur.close()
        # Payloads as text (validated, as catch-up does), not bytes.
        return tbl.set_column(4, "payload", tbl.column(4).cast(pa.large_string()))

    return "ADBC SQLite driver (native, into Arrow)", read_adbc


_J = "json_extract_string"
_MEASUREMENT_PATHS = ["$.event_id", "$.occurred_at", "$.task_id", "$.block_id", "$.run_id",
                      "$.source", "$.repeat", "$.success", "$.candidate",
                      "$.input_digests.point", "$.input_digests.repo_snapshot"]
_TABLES = {
    "events": C._EVENTS_INSERT.split(" BY NAME ", 1)[1].replace(
        "_batch_raw WHERE keep", "_raw WHERE type <> 'CommandHandled'"),
    "tool_calls": C.SQL_INSERTS["ToolInvoked"].split(" BY NAME ", 1)[1].replace(
        "_batch_raw WHERE sql AND", "_raw WHERE"),
    "handoffs": C.SQL_INSERTS["LoopBlockHandedOff"].split(" BY NAME ", 1)[1].replace(
        "_batch_raw WHERE sql AND", "_raw WHERE"),
    "measurement_runs": f"""
        SELECT r.*, t.point_hash, t.task_type FROM (
          SELECT position, j[1] AS event_id, j[2]::TIMESTAMPTZ AS occurred_at, j[3] AS task_id,
                 j[4] AS block_id, j[5] AS run_id, j[6] AS source, j[7]::BIGINT AS repeat,
                 coalesce(j[8]::BOOLEAN, true) AS success, j[9] AS candidate,
                 j[10] AS point_ref, j[11] AS repo_snapshot,
                 json_transform(payload -> '$.metrics', '"MAP(VARCHAR, DOUBLE)"') AS metrics,
                 CAST(payload -> '$.meta.host' AS VARCHAR) AS host
          FROM (SELECT position, payload, {_J}(payload, {_MEASUREMENT_PATHS!r}) AS j
                FROM _raw WHERE type = 'MeasurementRecorded')) r
        LEFT JOIN _tasks t USING (task_id)""",
    "verifications": f"""
        SELECT position, j[1] AS event_id, j[2]::TIMESTAMPTZ AS occurred_at, j[3] AS task_id,
               j[4] AS block_id, j[5] AS verdict, j[6]::BOOLEAN AS passed,
               j[7] AS contract_hash, j[8] AS point_hash, j[9] AS candidate, j[10] AS gates,
               coalesce({_J}(j[11], '$[*]'), []) AS evidence
        FROM (SELECT position, {_J}(payload, ['$.event_id', '$.occurred_at', '$.task_id',
              '$.block_id', '$.verdict', '$.passed', '$.contract_hash', '$.point_hash',
              '$.candidate', '$.gates', '$.evidence']) AS j
              FROM _raw WHERE type = 'VerificationRecorded')""",
    "gate_verdicts": f"""
        SELECT position, event_id AS verification_id, task_id, block_id,
               {_J}(g, '$.name') AS gate, {_J}(g, '$.metric') AS metric,
               {_J}(g, '$.verdict') AS verdict, {_J}(g, '$.median')::DOUBLE AS observed,
               {_J}(g, '$.threshold')::DOUBLE AS threshold,
               {_J}(g, '$.baseline_median')::DOUBLE AS baseline,
               coalesce({_J}(g, '$.reason'), '') AS reason, CAST(g AS VARCHAR) AS detail
        FROM (SELECT position, {_J}(payload, '$.event_id') AS event_id,
                     {_J}(payload, '$.task_id') AS task_id,
                     {_J}(payload, '$.block_id') AS block_id,
                     unnest(json_extract(payload, '$.gates[*]')) AS g
              FROM _raw WHERE type = 'VerificationRecorded')""",
    "loop_blocks": f"""
        SELECT position, j[1] AS event_id, j[2]::TIMESTAMPTZ AS occurred_at, j[3] AS task_id,
               coalesce(j[4], 'b' || j[5]) AS block_id, j[5]::BIGINT AS block_index,
               j[6] AS sub_goal, {_J}(j[7], '$.model_tier') AS model_tier,
               {_J}(j[7], '$.agent_topology') AS agent_topology,
               {_J}(j[7], '$.executor') AS executor, j[7] AS routing, j[8] AS candidate
        FROM (SELECT position, {_J}(payload, ['$.event_id', '$.occurred_at', '$.task_id',
              '$.block_id', '$.index', '$.sub_goal', '$.routing', '$.candidate']) AS j
              FROM _raw WHERE type = 'LoopBlockStarted')""",
}
_TASKS = (f"SELECT {_J}(payload, '$.task_id') AS task_id, "
          f"{_J}(payload, '$.point_hash') AS point_hash, "
          f"{_J}(payload, '$.task_type') AS task_type FROM _raw WHERE type = 'TaskDefined'")


def native_floor(ledger: Path, head: int, batch: int, *, pipelined: bool = False
                 ) -> dict[str, Any]:
    """Run the idealised pipeline over positions 1..`head` in batches of `batch` (fresh
    output, removed after). `pipelined`: the next batch is read and the last one's segments
    written in two more threads while DuckDB extracts (ADBC and pyarrow release the GIL).
    Returns wall and CPU seconds (this process, every thread) in all, seconds by stage (busy
    time of each; overlapping when pipelined), the read used, rows out per table and the
    segments' bytes."""
    from concurrent.futures import Future, ThreadPoolExecutor

    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(tempfile.mkdtemp(prefix="forge-bench-floor-"))
    pool = ThreadPoolExecutor(2) if pipelined else None
    try:
        how, read = _reader(ledger)
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        by: dict[str, float] = {"read": 0.0, "extract": 0.0, "write": 0.0}
        rows: dict[str, int] = dict.fromkeys(["tasks", *_TABLES], 0)
        tasks: list[pa.Table] = []

        def timed(stage: str, fn: Any, *a: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                by[stage] += time.perf_counter() - t

        def write(n: int, done: dict[str, pa.Table]) -> None:
            for name, tbl in done.items():
                pq.write_table(tbl, out / f"{name}-{n:05d}.parquet", compression="zstd",
                               compression_level=1)

        def submit(fn: Any, *a: Any) -> Future[Any]:
            if pool is not None:
                return pool.submit(fn, *a)
            f: Future[Any] = Future()  # sequential: done now
            f.set_result(fn(*a))
            return f

        t0, c0 = time.perf_counter(), time.process_time()
        first, n = 1, 0
        nxt = submit(timed, "read", read, first, min(head, first + batch - 1))
        writing: Future[Any] | None = None
        while True:
            raw = nxt.result()
            if raw.num_rows == 0:
                break
            first = int(raw.column(0)[-1].as_py()) + 1
            if first <= head:
                nxt = submit(timed, "read", read, first, min(head, first + batch - 1))
            con.register("_raw", raw)
            t = time.perf_counter()
            # A run's task may be defined in an earlier batch: the tasks so far, joined.
            tasks.append(con.sql(_TASKS).to_arrow_table())
            con.register("_tasks", pa.concat_tables(tasks))
            done = {name: con.sql(sql).to_arrow_table() for name, sql in _TABLES.items()}
            by["extract"] += time.perf_counter() - t
            con.unregister("_raw")
            con.unregister("_tasks")
            if writing is not None:
                writing.result()
            writing = submit(timed, "write", write, n, done)
            rows["tasks"] += tasks[-1].num_rows
            for name, tbl in done.items():
                rows[name] += tbl.num_rows
            n += 1
            if first > head:
                break
        if writing is not None:
            writing.result()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        size = sum(p.stat().st_size for p in out.iterdir())
        con.close()
        return {"read_with": how, "wall_s": wall, "cpu_s": cpu, "by": by, "rows": rows,
                "bytes": size, "batches": n, "pipelined": pipelined}
    finally:
        if pool is not None:
            pool.shutdown()
        shutil.rmtree(out, ignore_errors=True)
