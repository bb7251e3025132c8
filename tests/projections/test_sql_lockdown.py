"""`forge sql` is a read-only window on the index: queries only, in a DuckDB
session that cannot write, read or reach anything outside the index, load no extension and
change no setting; with a row and a time limit. Every refusal is one line, and nothing on
disk changes: the ledger byte for byte, the index row for row, no new file anywhere."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pytest
from infer_forge.ledger.workspace import init_workspace, open_workspace
from infer_forge.projections import index as I
from infer_forge.projections import queries as Q
from infer_forge.projections.errors import ProjectionError

from tests.conftest import run_forge
from tests.helpers.index_ledger import build

SECRET = "forge-test-secret-7d1c"


@pytest.fixture(scope="module")
def built_once(tmp_path_factory) -> Path:
    """The hand-built ledger and its index, made once for the module (~2.5 s)."""
    home = tmp_path_factory.mktemp("sql-lockdown") / "home"
    ws, _ = init_workspace(home)
    try:
        build(ws)
        I.update(ws)
    finally:
        ws.close()
    return home


@pytest.fixture
def built(built_once, forge_home, tmp_path):
    """A copy of that workspace of this test's own (a refused statement must change
    nothing in it: each test checks its own copy)."""
    shutil.copytree(built_once, forge_home)
    workspace = open_workspace(forge_home)
    # Files a hostile query would like to read: planted with a marker it must never print.
    (tmp_path / "plain.txt").write_text(SECRET + "\n")
    (tmp_path / "rows.csv").write_text(f"a,b\n1,{SECRET}\n")
    (tmp_path / "rows.json").write_text(json.dumps([{"a": SECRET}]))
    con = duckdb.connect()
    con.execute(f"COPY (SELECT '{SECRET}' AS s) TO '{tmp_path / 'rows.parquet'}'")
    con.close()
    yield workspace
    workspace.close()


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _ledger_dump(home: Path) -> str:
    con = sqlite3.connect(f"file:{home / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return hashlib.sha256("\n".join(con.iterdump()).encode()).hexdigest()
    finally:
        con.close()


class Unchanged:
    """The ledger row for row, the index row for row, and no file added or removed anywhere
    under tmp_path (SQLite's -wal/-shm come and go with connections; a query's own catch-up
    may rewrite index.duckdb's bytes)."""

    def __init__(self, ws, root: Path):
        self.ws, self.root = ws, root
        self.ledger = _ledger_dump(ws.home)
        self.names = self._names()
        self.index = self._fingerprint()

    def _names(self) -> set[str]:
        return {n for n in _files(self.root) if not n.endswith(("-wal", "-shm", "-journal"))}

    def _fingerprint(self) -> str:
        with I.open_index(self.ws, update=False) as s:
            return I.fingerprint(s.con)

    def check(self) -> None:
        assert self._names() == self.names
        assert _ledger_dump(self.ws.home) == self.ledger
        assert self._fingerprint() == self.index


def _refused(ws, text: str, needle: str, **kw) -> str:
    with pytest.raises(ProjectionError) as e:
        Q.sql_ws(ws, text, **kw)
    msg = str(e.value)
    assert needle.lower() in msg.lower() and "\n" not in msg, msg
    assert SECRET not in msg
    return msg


# --- statements that are not queries: refused by kind, before anything runs --------------

SETTING = "a setting change (SET, RESET, USE, PRAGMA x = y) is not allowed"
WRITES = [
    ("COPY (SELECT 1) TO '{tmp}/out.csv'", "COPY is not allowed"),
    ("COPY (SELECT 1) TO '{home}/ledger.sqlite'", "COPY is not allowed"),
    ("COPY events TO '{tmp}/events.parquet' (FORMAT parquet)", "COPY is not allowed"),
    ("COPY tasks FROM '{tmp}/rows.csv'", "COPY is not allowed"),
    ("EXPORT DATABASE '{tmp}/exp'", "EXPORT is not allowed"),
    ("IMPORT DATABASE '{tmp}/exp'", "IMPORT is not allowed"),  # parsed as a PRAGMA
    ("-- note\n/* x */ IMPORT DATABASE '{tmp}/exp'", "IMPORT is not allowed"),
    ("CHECKPOINT", "CHECKPOINT is not allowed"),  # parsed as a CALL
    ("FORCE CHECKPOINT", "FORCE is not allowed"),
    ("ATTACH '{tmp}/other.db' AS other", "ATTACH is not allowed"),
    ("ATTACH ':memory:' AS m", "ATTACH is not allowed"),
    ("DETACH index", "DETACH is not allowed"),
    ("INSTALL httpfs", "INSTALL/LOAD is not allowed"),
    ("FORCE INSTALL httpfs", "INSTALL/LOAD is not allowed"),
    ("LOAD httpfs", "INSTALL/LOAD is not allowed"),
    ("LOAD '{tmp}/evil.duckdb_extension'", "INSTALL/LOAD is not allowed"),
    ("UPDATE EXTENSIONS", "is not allowed"),
    ("SET enable_external_access = true", SETTING),
    ("RESET enable_external_access", SETTING),
    ("SET lock_configuration = false", SETTING),
    ("SET memory_limit = '1GB'", SETTING),
    ("USE memory", SETTING),
    ("PRAGMA memory_limit = '1GB'", SETTING),
    ("PRAGMA enable_profiling = 'json'", SETTING),
    ("CREATE TABLE x (a INT)", "CREATE is not allowed"),
    ("CREATE TEMP TABLE x AS SELECT * FROM events", "CREATE is not allowed"),
    ("CREATE PERSISTENT SECRET s (TYPE http, BEARER_TOKEN 'x')", "CREATE is not allowed"),
    ("INSERT INTO tasks (task_id) VALUES ('x')", "INSERT is not allowed"),
    ("UPDATE tasks SET title = 'x'", "UPDATE is not allowed"),
    ("DELETE FROM events", "DELETE is not allowed"),
    ("DROP TABLE events", "DROP is not allowed"),
    ("ALTER TABLE tasks ADD COLUMN z INT", "ALTER is not allowed"),
    ("VACUUM", "VACUUM is not allowed"),
    ("BEGIN TRANSACTION", "TRANSACTION is not allowed"),
    ("SELECT 1; COPY (SELECT 1) TO '{tmp}/two.csv'", "statement 2: COPY is not allowed"),
    ("SELECT 1;\nDROP TABLE events;\nSELECT 2", "statement 2: DROP is not allowed"),
    ("WITH a AS (SELECT 1) INSERT INTO tasks (task_id) SELECT 'x'", "INSERT is not allowed"),
]


@pytest.mark.parametrize("text, needle", WRITES, ids=[w[0][:40] for w in WRITES])
def test_statements_other_than_queries_are_refused(built, tmp_path, text, needle):
    before = Unchanged(built, tmp_path)
    msg = _refused(built, text.format(tmp=tmp_path, home=built.home), needle)
    assert "read-only queries" in msg
    before.check()


# --- queries that try to reach outside: refused by the session itself ----------------------

READS = [
    "SELECT * FROM read_text('/proc/self/environ')",
    "SELECT * FROM read_blob('/proc/self/environ')",
    "SELECT * FROM read_text('{tmp}/plain.txt')",
    "SELECT * FROM read_text('{home}/ledger.sqlite')",
    "SELECT * FROM read_csv('{tmp}/rows.csv')",
    "SELECT * FROM read_csv_auto('{tmp}/*.csv')",
    "SELECT * FROM '{tmp}/rows.csv'",
    "SELECT * FROM read_parquet('{tmp}/rows.parquet')",
    "SELECT * FROM parquet_metadata('{tmp}/rows.parquet')",
    "SELECT * FROM read_json('{tmp}/rows.json')",
    "SELECT * FROM sniff_csv('{tmp}/rows.csv')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM glob('{tmp}/*')",
    "CALL glob('{home}/*')",
    "PRAGMA import_database('{tmp}')",
    "SELECT * FROM read_text('{home}/index.duckdb.tmp/x')",  # DuckDB's own temp directory
    "WITH t AS (SELECT content FROM read_text('{tmp}/plain.txt')) SELECT * FROM t",
]


@pytest.mark.parametrize("text", READS, ids=[r[14:54] for r in READS])
def test_queries_cannot_read_files(built, tmp_path, monkeypatch, text):
    monkeypatch.setenv("FORGE_TEST_TOKEN", SECRET)  # /proc/self/environ would print it
    before = Unchanged(built, tmp_path)
    _refused(built, text.format(tmp=tmp_path, home=built.home), "disabled by configuration")
    before.check()


@pytest.mark.parametrize("text, needle", [
    ("PRAGMA enable_profiling", "locked"),
    ("PRAGMA disable_optimizer", "locked"),
    ("PRAGMA enable_checkpoint_on_shutdown", "locked"),
    ("PRAGMA force_checkpoint", "locked"),
    ("CALL enable_logging(storage = 'file', storage_path = '{tmp}/logs')", "locked"),
    ("SELECT * FROM read_xlsx('{tmp}/rows.xlsx')", "excel extension"),  # no autoload
])
def test_configuration_is_locked_and_nothing_autoloads(built, tmp_path, text, needle):
    before = Unchanged(built, tmp_path)
    _refused(built, text.format(tmp=tmp_path), needle)
    before.check()


def test_session_refuses_even_without_the_statement_check(built, tmp_path):
    """The second wall: the locked-down session itself, given the statements that the
    statement check refuses first. Nothing on disk changes, not even index.duckdb's bytes
    (no catch-up here)."""
    files = _files(tmp_path)
    con = I.locked_connection(I.index_path(built.home))
    try:
        assert con.execute("SELECT current_setting('enable_external_access'), "
                           "current_setting('lock_configuration')").fetchone() == (False, True)
        for text, needle in [
            ("COPY (SELECT 1) TO '{tmp}/out.csv'", "disabled by configuration"),
            ("COPY (SELECT 1) TO '{home}/ledger.sqlite'", "disabled by configuration"),
            ("COPY (SELECT 1) TO '{home}/index.duckdb'", "attached database"),
            ("COPY (SELECT 1) TO '{home}/index.duckdb.tmp/x.csv'", "disabled by configuration"),
            ("EXPORT DATABASE '{tmp}/exp'", "disabled by configuration"),
            ("ATTACH '{tmp}/other.db' AS other", "disabled by configuration"),
            ("INSTALL httpfs", "disabled by configuration"),
            ("LOAD httpfs", "disabled through configuration"),
            ("SET enable_external_access = true", "locked"),
            ("RESET enable_external_access", "locked"),
            ("SET lock_configuration = false", "locked"),
            ("SET temp_directory = '{tmp}/spill'", "locked"),
            ("SET memory_limit = '1GB'", "locked"),
            ("CREATE TABLE x (a INT)", "read-only"),
            ("INSERT INTO tasks (task_id) VALUES ('x')", "read-only"),
            ("DELETE FROM events", "read-only"),
            ("DROP TABLE events", "read-only"),
            ("SELECT 1; COPY (SELECT 1) TO '{tmp}/two.csv'", "disabled by configuration"),
        ]:
            with pytest.raises(duckdb.Error, match=needle):
                con.execute(text.format(tmp=tmp_path, home=built.home))
        assert con.execute("SELECT count(*) FROM events").fetchone() == (66,)
    finally:
        con.close()
    assert _files(tmp_path) == files


def test_queries_still_work(built, tmp_path):
    before = Unchanged(built, tmp_path)
    assert Q.sql_ws(built, "SELECT count(*) AS n FROM events").records() == [{"n": 66}]
    assert Q.sql_ws(built, "WITH d AS (SELECT * FROM decisions) SELECT count(*) FROM d"
                    ).rows == [(3,)]
    assert Q.sql_ws(built, "SELECT 1; SELECT 2 AS two").records() == [{"two": 2}]
    assert Q.sql_ws(built, "-- the tasks\nSELECT count(*) FROM tasks").rows == [(4,)]
    assert ("task_id",) in {r[:1] for r in Q.sql_ws(built, "DESCRIBE tasks").rows}
    assert ("events",) in set(Q.sql_ws(built, "SHOW TABLES").rows)
    assert ("events",) in set(Q.sql_ws(built, "PRAGMA show_tables").rows)
    assert Q.sql_ws(built, "CALL pragma_table_info('tasks')").rows
    assert Q.sql_ws(built, "EXPLAIN SELECT * FROM tasks").rows
    assert Q.sql_ws(built, "SELECT now()::VARCHAR LIKE '%+00'").rows == [(True,)]  # UTC
    before.check()


# --- empty input ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "-- x", "/* nothing */", ";", " ; ;"])
def test_empty_query_is_one_line(built, tmp_path, text):
    before = Unchanged(built, tmp_path)
    _refused(built, text, "no SQL statement given")
    before.check()


@pytest.mark.parametrize("text", ["", "  ", "-- x"])
def test_empty_query_cli(built, text):
    r = run_forge("sql", text, home=built.home)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == ("Error: no SQL statement given "
                                "(the query is empty or only comments)")
    assert r.stdout == ""


# --- the CLI: one line, non-zero, for each wall ------------------------------------------


@pytest.mark.parametrize("text, needle", [
    ("COPY (SELECT 1) TO '{home}/ledger.sqlite'", "COPY is not allowed"),
    ("SELECT * FROM read_text('/proc/self/environ')", "disabled by configuration"),
    ("INSTALL httpfs", "INSTALL/LOAD is not allowed"),
    ("PRAGMA enable_profiling", "locked"),
    ("SELECT 1; DROP TABLE events", "statement 2: DROP is not allowed"),
])
def test_cli_refusals_are_one_line(built, tmp_path, text, needle):
    before = Unchanged(built, tmp_path)
    r = run_forge("sql", text.format(home=built.home), "--json", home=built.home,
                  env={"FORGE_TEST_TOKEN": SECRET})
    assert r.returncode == 1
    err = r.stderr.strip()
    assert err.startswith("Error: ") and needle in err and "\n" not in err, err
    assert "Traceback" not in r.stderr and SECRET not in r.stderr + r.stdout
    assert r.stdout == ""
    before.check()


# --- row limit --------------------------------------------------------------------------


def test_row_limit(built):
    # 10^11 rows: fetched all at once this would never return; the limit fetches N + 1.
    t = Q.sql_ws(built, "SELECT * FROM range(100000000000) r(i)", max_rows=5)
    assert t.rows == [(i,) for i in range(5)] and t.truncated
    t = Q.sql_ws(built, "SELECT * FROM range(5)", max_rows=5)
    assert len(t.rows) == 5 and not t.truncated
    t = Q.sql_ws(built, "SELECT * FROM range(10001)")  # the default: 10000
    assert len(t.rows) == Q.DEFAULT_MAX_ROWS == 10_000 and t.truncated
    t = Q.sql_ws(built, "SELECT * FROM range(25000)", max_rows=0)  # 0: no limit
    assert len(t.rows) == 25_000 and not t.truncated


@pytest.mark.parametrize("fmt", ["--json", "--csv", None])
def test_row_limit_cli(built, fmt):
    args = ["sql", "SELECT i FROM range(100000000000) r(i)", "--max-rows", "3"]
    r = run_forge(*args, *([fmt] if fmt else []), home=built.home)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == ("forge sql: output cut at 3 rows; the result has more "
                                "(--max-rows N to raise the limit, 0 for none)")
    if fmt == "--json":
        assert json.loads(r.stdout) == [{"i": 0}, {"i": 1}, {"i": 2}]
    elif fmt == "--csv":
        assert r.stdout.split() == ["i", "0", "1", "2"]
    else:
        assert "(3 rows)" in r.stdout
    r = run_forge("sql", "SELECT 1 AS one", "--max-rows", "1", "--json", home=built.home)
    assert r.returncode == 0 and r.stderr == "" and json.loads(r.stdout) == [{"one": 1}]


# --- time limit -------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "SELECT count(*) FROM range(1000000000000)",
    "SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b",
    "SELECT * FROM range(1000000000000) WHERE range < 0",  # streams, but never a row
])
def test_time_limit_interrupts(built, tmp_path, text):
    before = Unchanged(built, tmp_path)
    _refused(built, text, "query stopped after the time limit of 0.5s", timeout_s=0.5)
    # the lock is released and the next query runs
    assert Q.sql_ws(built, "SELECT 42").rows == [(42,)]
    before.check()


def test_time_limit_cli(built):
    r = run_forge("sql", "SELECT count(*) FROM range(1000000000000)", "--timeout", "1",
                  home=built.home)
    assert r.returncode == 1
    assert r.stderr.strip() == ("Error: query stopped after the time limit of 1s "
                                "(forge sql --timeout; 0 for none)")


@pytest.mark.parametrize("kw, needle", [
    ({"timeout_s": float("nan")}, "timeout must be"),
    ({"timeout_s": float("inf")}, "timeout must be"),
    ({"timeout_s": -1}, "timeout must be"),
    ({"timeout_s": "soon"}, "timeout must be"),
    ({"max_rows": -1}, "max rows must be"),
    ({"max_rows": 2.5}, "max rows must be"),
    ({"max_rows": True}, "max rows must be"),
])
def test_limits_are_checked(built, kw, needle):
    _refused(built, "SELECT 1", needle, **kw)


@pytest.mark.parametrize("args, code, needle", [
    (["--timeout", "nan"], 1, "timeout must be"),
    (["--timeout", "-1"], 1, "timeout must be"),
    (["--max-rows", "-1"], 2, "--max-rows"),
])
def test_limits_are_checked_cli(built, args, code, needle):
    r = run_forge("sql", "SELECT 1", *args, home=built.home)
    assert r.returncode == code
    assert needle in r.stderr and "Traceback" not in r.stderr
