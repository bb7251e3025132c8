"""Questions over the index: SQL, compare two subjects side by side, filter measurements.

Each function takes an open DuckDB connection (from `index.open_index`, which has already
caught up); the `*_ws` wrappers open, catch up and query in one locked step for the CLI.
"""

from __future__ import annotations

import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ledger.store import one_line
from ..ledger.workspace import Workspace
from .errors import ProjectionError
from .index.session import LOCKDOWN, locked_connection, open_index

if TYPE_CHECKING:  # imported where used: importing the queries (every forge command) stays fast
    import duckdb

# Dimensions worth showing when two subjects differ (the rest are derived or redundant).
COMPARE_DIMS = ["model", "model_revision", "task_type", "modality", "input_len", "output_len",
                "concurrency", "request_rate", "architecture", "parallelism", "runtime_profile",
                "engine", "accelerator_vendor", "accelerator", "accelerator_count",
                "point_hash", "repo_snapshot", "candidate_key"]

# filter flag -> column. Values of one flag are OR-ed, different flags AND-ed.
FILTER_COLUMNS = {
    "model": "model", "task_type": "task_type", "gpu": "accelerator", "engine": "engine",
    "metric": "metric", "task": "task_id", "profile": "runtime_profile",
    "architecture": "architecture", "point": "point_hash", "parallelism": "parallelism",
}


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False  # more rows than the limit: `rows` holds the first ones

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


# --- sql --------------------------------------------------------------------------------

DEFAULT_MAX_ROWS = 10_000
DEFAULT_TIMEOUT_S = 30.0

# What `forge sql` runs: queries. Any other statement (COPY, EXPORT, ATTACH, INSTALL, LOAD,
# SET, CREATE, INSERT, ...) is refused by kind before anything runs, and the session below
# refuses it again should one get through.
QUERY_STATEMENTS = ("SELECT", "EXPLAIN", "PRAGMA", "CALL")  # SELECT: also WITH/DESCRIBE/SHOW

_KIND_LABEL = {"LOAD": "INSTALL/LOAD", "SET": "a setting change (SET, RESET, USE, PRAGMA x = y)",
               "VARIABLE_SET": "SET VARIABLE"}
# DuckDB parses some commands as a PRAGMA or CALL (IMPORT DATABASE, CHECKPOINT): those kinds
# count as queries only when written as such.
_SPELLED_OUT = ("PRAGMA", "CALL")
_LEADING_COMMENTS = re.compile(r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)


def _first_word(sql: str) -> str:
    lead = _LEADING_COMMENTS.match(sql)
    assert lead is not None  # every part of the pattern is optional: it always matches
    rest = sql[lead.end():]
    m = re.match(r"[A-Za-z_]+", rest)
    return m.group(0).upper() if m else "?"


def _statements(con: duckdb.DuckDBPyConnection, text: str) -> list[Any]:
    """Parse `text`: the statements if every one is a query, else a one-line error naming
    the first statement that is not (or saying that there is none)."""
    import duckdb

    try:
        statements = con.extract_statements(text)
    except duckdb.Error as e:
        raise ProjectionError(one_line(e)) from None
    if not statements:
        raise ProjectionError("no SQL statement given (the query is empty or only comments)")
    for i, st in enumerate(statements, 1):
        word = _first_word(st.query)
        try:
            kind = st.type.name
        except ValueError:  # a statement kind the Python client has no name for
            kind = word
        if kind in _SPELLED_OUT and word != kind:
            kind = word
        if kind not in QUERY_STATEMENTS:
            where = f"statement {i}: " if len(statements) > 1 else ""
            raise ProjectionError(
                f"{where}{_KIND_LABEL.get(kind, kind.replace('_', ' '))} is not allowed: "
                f"forge sql runs read-only queries ({', '.join(QUERY_STATEMENTS)})")
    return statements


def check_query(text: str) -> None:
    """Refuse, before any work, SQL that `forge sql` would refuse to run."""
    import duckdb

    con = duckdb.connect(":memory:", config=LOCKDOWN)
    try:
        _statements(con, text)
    finally:
        con.close()


def _limits(max_rows: int | None, timeout_s: float | None) -> tuple[int, float]:
    rows = DEFAULT_MAX_ROWS if max_rows is None else max_rows
    secs = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ProjectionError(f"max rows must be a whole number >= 0 (0: no limit), "
                              f"got {rows!r}")
    try:
        secs = float(secs)
    except (TypeError, ValueError):
        raise ProjectionError(f"timeout must be a number of seconds >= 0 (0: no limit), "
                              f"got {secs!r}") from None
    if not math.isfinite(secs) or secs < 0:
        raise ProjectionError(f"timeout must be a number of seconds >= 0 (0: no limit), "
                              f"got {secs!r}")
    return rows, secs


def run_sql(con: duckdb.DuckDBPyConnection, text: str, *, max_rows: int | None = None,
            timeout_s: float | None = None) -> Table:
    """Run user SQL (queries only, see `QUERY_STATEMENTS`) on `con`: at most `max_rows`
    rows are fetched (`Table.truncated` says there were more), and the query is interrupted
    after `timeout_s` seconds (0: no limit for either). Every failure is a one-line
    ProjectionError. The session's own lockdown is the caller's (`locked_connection`)."""
    import duckdb

    rows_cap, secs = _limits(max_rows, timeout_s)
    statements = _statements(con, text)
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        try:
            con.interrupt()
        except duckdb.Error:  # the query has just ended and the connection with it
            pass

    timer = threading.Timer(secs, stop) if secs else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        for st in statements:  # the statements checked above, not the text parsed again
            rel = con.execute(st)
        if rel.description is None:
            return Table([], [])
        cols = [d[0] for d in rel.description]
        if not rows_cap:
            return Table(cols, rel.fetchall())
        rows = rel.fetchmany(rows_cap + 1)  # one more than shown: were there more?
        return Table(cols, rows[:rows_cap], truncated=len(rows) > rows_cap)
    except duckdb.Error as e:
        if fired.is_set() and isinstance(e, duckdb.InterruptException):
            raise ProjectionError(f"query stopped after the time limit of {secs:g}s "
                                  "(forge sql --timeout; 0 for none)") from None
        raise ProjectionError(one_line(e)) from None
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()  # a callback already running finishes before the caller closes


def sql_ws(ws: Workspace, text: str, *, max_rows: int | None = None,
           timeout_s: float | None = None) -> Table:
    """Catch up, then run `text` in a locked-down session (`locked_connection`): read-only
    on the index, nothing outside it, no extensions, configuration locked; with a row and
    a time limit (`run_sql`). The file lock is held until the query ends."""
    _limits(max_rows, timeout_s)
    check_query(text)
    with open_index(ws) as s:
        s.con.close()  # the catch-up's read-write connection; the query gets its own
        con = locked_connection(s.path)
        try:
            return run_sql(con, text, max_rows=max_rows, timeout_s=timeout_s)
        finally:
            con.close()


# --- compare ----------------------------------------------------------------------------


@dataclass
class Subject:
    text: str
    kind: str  # task | block | profile | point
    where: str  # SQL over valid_measurements
    params: list[Any]
    note: str = ""
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (task_id, block_id)
    runs: str = "valid_runs"  # the relation of valid runs to query (see `valid_runs`)


def _exists(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> bool:
    return con.execute(sql, params).fetchone() is not None


def valid_runs(con: duckdb.DuckDBPyConnection) -> str:
    """The cheapest relation equal to the `valid_runs` view: with no invalidation recorded
    (the common case) it is the successful runs, without the view's anti-join."""
    row = con.execute("SELECT count(*) FROM invalidations").fetchone()
    assert row is not None  # an aggregate returns one row
    return "valid_runs" if row[0] else "(SELECT * FROM measurement_runs WHERE success)"


def resolve(con: duckdb.DuckDBPyConnection, text: str, runs: str | None = None) -> Subject:
    """A task id, a block (`task/block`), a runtime profile (`service@rev`) or a point hash
    (prefix of at least 8 characters, with or without `sha256:`)."""
    runs = valid_runs(con) if runs is None else runs
    s = _resolve(con, text, runs)
    s.runs = runs
    return s


def _resolve(con: duckdb.DuckDBPyConnection, text: str, runs: str) -> Subject:
    if _exists(con, "SELECT 1 FROM tasks WHERE task_id = ?", [text]):
        # A task is represented by its deliverable: the accepted block, else its last block
        # with measurements.
        row = con.execute(
            "SELECT block_id FROM decisions WHERE task_id = ? AND kind = 'accepted' "
            "AND block_id IS NOT NULL ORDER BY position DESC LIMIT 1", [text]).fetchone()
        note = "accepted block"
        if row is None:
            row = con.execute(
                "SELECT block_id FROM measurement_runs WHERE task_id = ? "
                "ORDER BY position DESC LIMIT 1", [text]).fetchone()
            note = "last measured block"
        if row is None or row[0] is None:
            return Subject(text, "task", "task_id = ?", [text], "all measurements")
        return Subject(text, "task", "task_id = ? AND block_id = ?", [text, row[0]],
                       f"{note} {row[0]}")
    for sep in ("/", ":"):
        if sep in text:
            task, _, block = text.rpartition(sep)
            if _exists(con, "SELECT 1 FROM loop_blocks WHERE task_id = ? AND block_id = ?",
                       [task, block]):
                return Subject(text, "block", "task_id = ? AND block_id = ?", [task, block])
    if _exists(con, "SELECT 1 FROM measurement_runs WHERE runtime_profile = ? LIMIT 1", [text]):
        base = _exists(con, f"SELECT 1 FROM {runs} WHERE runtime_profile = ? "
                            "AND candidate_key = '{}' LIMIT 1", [text])
        if base:
            return Subject(text, "profile", "runtime_profile = ? AND candidate_key = '{}'",
                           [text], "as configured (baseline candidate)")
        return Subject(text, "profile", "runtime_profile = ?", [text], "all candidates")
    h = text if text.startswith("sha256:") else "sha256:" + text
    if len(h) >= 15:
        rows = con.execute("SELECT DISTINCT point_hash FROM measurement_runs "
                           "WHERE starts_with(point_hash, ?)", [h]).fetchall()
        if len(rows) == 1:
            return Subject(text, "point", "point_hash = ?", [rows[0][0]])
        if len(rows) > 1:
            raise ProjectionError(f"compare: point hash prefix {text!r} is ambiguous "
                                  f"({len(rows)} points)")
    rows = con.execute("SELECT DISTINCT task_id FROM loop_blocks WHERE block_id = ?",
                       [text]).fetchall()
    if len(rows) == 1:
        return Subject(text, "block", "task_id = ? AND block_id = ?", [rows[0][0], text])
    for sep in ("/", ":"):  # a known task, a block it never reached (it exited before)
        task, _, block = text.rpartition(sep)
        has = [r[0] for r in con.execute("SELECT block_id FROM loop_blocks WHERE task_id = ? "
                                         "ORDER BY position", [task]).fetchall()] if task else []
        if has:
            raise ProjectionError(f"compare: task {task} has no block {block!r} (its blocks: "
                                  f"{', '.join(has)})")
    raise ProjectionError(
        f"compare: {text!r} is not a task, block (task/block), runtime profile "
        "(service@rev) or point hash in the index")


def _finite(x: float | None) -> float | None:
    """`x` when it is a finite number, else None (a computed number is checked like an
    input: an overflow is no value)."""
    return x if x is not None and math.isfinite(x) else None


def compare(con: duckdb.DuckDBPyConnection, a: str, b: str) -> dict[str, Any]:
    """Two subjects side by side: the dimensions that differ, each metric's medians with
    the delta, and the gate verdicts of the verifications covering each side. A median or
    delta that is not a finite number (finite samples whose median or difference overflow,
    e.g. 1.7e308 and -1.7e308) is None, as is a delta of a median that is None."""
    # The two sides are independent read-only queries: side b runs in a second thread
    # (DuckDB releases the GIL) on a cursor of its own that no other thread touches, so a
    # compare costs about one side's time. The cursor is closed only after that thread has
    # ended, whatever either side raised (the pool's exit waits for it); when both sides
    # fail, side a's error is the one reported.
    runs = valid_runs(con)
    cur = con.cursor()
    try:
        with ThreadPoolExecutor(1) as pool:
            fb = pool.submit(_side, cur, b, runs)
            sa, dims_a, ma, gates_a = _side(con, a, runs)
            sb, dims_b, mb, gates_b = fb.result()
    finally:
        cur.close()
    differ = [{"dimension": d, "a": dims_a[d], "b": dims_b[d]} for d in COMPARE_DIMS
              if dims_a[d] != dims_b[d]]
    same = {d: dims_a[d] for d in COMPARE_DIMS if dims_a[d] == dims_b[d] and dims_a[d]}
    metrics = []
    for m in sorted(set(ma) | set(mb)):
        va, vb = ma.get(m), mb.get(m)
        a_med, b_med = _finite(va[0] if va else None), _finite(vb[0] if vb else None)
        row: dict[str, Any] = {"metric": m, "a": a_med, "b": b_med,
                               "a_n": va[1] if va else 0, "b_n": vb[1] if vb else 0,
                               "delta": None, "delta_pct": None}
        if a_med is not None and b_med is not None:
            row["delta"] = _finite(b_med - a_med)
            if a_med and row["delta"] is not None:
                row["delta_pct"] = _finite(100.0 * row["delta"] / abs(a_med))
        metrics.append(row)
    return {
        "a": {"subject": a, "kind": sa.kind, "scope": sa.note},
        "b": {"subject": b, "kind": sb.kind, "scope": sb.note},
        "differing_dimensions": differ,
        "same_dimensions": same,
        "metrics": metrics,
        "gates": {"a": gates_a, "b": gates_b},
    }


_Side = tuple[Subject, dict[str, str | None], dict[str, tuple[float | None, int]],
              list[dict[str, Any]]]


def _side(con: duckdb.DuckDBPyConnection, text: str, runs: str) -> _Side:
    s = resolve(con, text, runs)
    return s, _dims(con, s), _metrics(con, s), _gates(con, s)


def _dims(con: duckdb.DuckDBPyConnection, s: Subject) -> dict[str, str | None]:
    # DISTINCT rows, then per-dimension value sets in Python (cheaper than 18 string_aggs).
    cols = ", ".join(COMPARE_DIMS)
    rows = con.execute(f"SELECT DISTINCT {cols} FROM {s.runs} WHERE {s.where}",
                       s.params).fetchall()
    out: dict[str, str | None] = {}
    for i, d in enumerate(COMPARE_DIMS):
        vals = sorted({str(r[i]) for r in rows if r[i] is not None})
        out[d] = ", ".join(vals) if vals else None
    return out


def _metrics(con: duckdb.DuckDBPyConnection, s: Subject) -> dict[str, tuple[float | None, int]]:
    # Unnest only the subject's runs (filter first, then explode the metric maps).
    rows = con.execute(f"SELECT kv.key, median(kv.value), count(kv.value) FROM "
                       f"(SELECT unnest(map_entries(metrics)) kv FROM {s.runs} "
                       f"WHERE {s.where}) GROUP BY 1", s.params).fetchall()
    return {m: (v, n) for m, v, n in rows}


def _gates(con: duckdb.DuckDBPyConnection, s: Subject) -> list[dict[str, Any]]:
    """Gates of the latest verification of each (task, block) the subject's measurements
    come from."""
    # Joined on positions (integers, ordered: zone maps prune) rather than event ids; a
    # verification's gate rows carry its position.
    rows = con.execute(
        f"""
        WITH scope AS (SELECT DISTINCT task_id, block_id FROM {s.runs} WHERE {s.where}),
             latest AS (SELECT v.task_id, v.block_id, max(v.position) vpos
                        FROM verifications v SEMI JOIN scope USING (task_id, block_id)
                        GROUP BY ALL)
        SELECT l.task_id, l.block_id, v.verdict, g.gate, g.metric, g.verdict, g.observed,
               g.threshold, g.reason
        FROM latest l JOIN verifications v ON v.position = l.vpos
        LEFT JOIN gate_verdicts g ON g.position = l.vpos AND g.verification_id = v.event_id
        ORDER BY l.task_id, l.block_id, g.gate""", s.params).fetchall()
    keys = ["task_id", "block_id", "verification", "gate", "metric", "verdict", "observed",
            "threshold", "reason"]
    return [dict(zip(keys, r, strict=True)) for r in rows]


def compare_ws(ws: Workspace, a: str, b: str) -> dict[str, Any]:
    with open_index(ws) as s:
        return compare(s.con, a, b)


# --- filter -----------------------------------------------------------------------------


def filter_measurements(con: duckdb.DuckDBPyConnection, *, limit: int | None = 1000,
                        **criteria: list[str] | tuple[str, ...] | None) -> Table:
    """Measurements summarized per task, block, candidate and metric, where every given
    flag matches (AND) and, within a flag, any of its values matches (OR). Text matches
    ignore case."""
    where, params = ["TRUE"], []
    entries, metric_params = "map_entries(metrics)", []
    for flag, values in criteria.items():
        if flag not in FILTER_COLUMNS:
            raise ProjectionError(f"filter: unknown criterion {flag!r} "
                                  f"(known: {', '.join(sorted(FILTER_COLUMNS))})")
        if not values:
            continue
        lowered = [str(v).lower() for v in values]
        if flag == "metric":
            # Drop unwanted metrics inside each run's list, before unnest and grouping.
            entries = "list_filter(map_entries(metrics), lambda e: list_contains(?, lower(e.key)))"
            metric_params = [lowered]
            continue
        where.append(f"list_contains(?, lower(CAST({FILTER_COLUMNS[flag]} AS VARCHAR)))")
        params.append(lowered)
    # Dimension predicates on the runs first, then explode only the matching metric entries.
    sql = f"""
        SELECT task_id, block_id, candidate_key AS candidate, model, task_type, accelerator,
               engine, runtime_profile, kv.key AS metric, count(kv.value) AS n,
               median(kv.value) AS median, min(kv.value) AS min, max(kv.value) AS max
        FROM (SELECT task_id, block_id, candidate_key, model, task_type, accelerator, engine,
                     runtime_profile, unnest({entries}) AS kv
              FROM {valid_runs(con)} WHERE {' AND '.join(where)})
        GROUP BY ALL ORDER BY task_id, block_id, candidate, metric
        {f'LIMIT {int(limit)}' if limit else ''}"""
    rel = con.execute(sql, metric_params + params)  # placeholders in text order
    return Table([d[0] for d in rel.description], rel.fetchall())


def filter_ws(ws: Workspace, *, limit: int | None = 1000, **criteria: Any) -> Table:
    with open_index(ws) as s:
        return filter_measurements(s.con, limit=limit, **criteria)


__all__ = ["Table", "check_query", "compare", "compare_ws", "filter_measurements", "filter_ws",
           "resolve", "run_sql", "sql_ws"]
