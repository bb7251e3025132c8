"""Opening the index. `open_index`: one process at a time, holding a file lock
(`index.duckdb.lock`) around catch-up and the caller's queries, because DuckDB allows one
read-write process per file; an index of another schema version is rebuilt on opening.
`locked_connection`: the read-only, locked-down session that `forge sql` queries run in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from ...ledger.store import Ledger, one_line
from ...ledger.workspace import Workspace
from ..errors import ProjectionError
from .catchup import DEFAULT_BATCH, CatchUpProgress, CatchUpResult, catch_up
from .schema import INDEX_SCHEMA_VERSION, SCHEMA_KEY, TABLES, ensure_schema, tracked_position

if TYPE_CHECKING:  # imported where used: importing the index (every forge command) stays fast
    import duckdb

INDEX_NAME = "index.duckdb"
LOCK_TIMEOUT_S = 120.0


# The query session: the index opened read-only; no file outside it (COPY TO, EXPORT,
# read_text/read_csv/glob, ATTACH), no extension installed or loaded, no persistent
# secret, no scan of Python variables, no temp directory (DuckDB lets a session write in its
# own), and then the configuration locked so no SET/RESET/PRAGMA can undo any of it.
LOCKDOWN: dict[str, Any] = {
    "enable_external_access": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "allow_persistent_secrets": False,
    "python_enable_replacements": False,
    "temp_directory": "",
}


def index_path(home: Path) -> Path:
    return Path(home) / INDEX_NAME


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise ProjectionError(f"cannot open index {path}: {one_line(e)}") from None
    con.execute("SET TimeZone = 'UTC'")
    ensure_schema(con)
    return con


def schema_version(path: Path) -> int | None:
    """The schema version of an existing index file (None: new, or too old to say)."""
    if not path.exists():
        return INDEX_SCHEMA_VERSION
    import duckdb

    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise ProjectionError(f"cannot open index {path}: {one_line(e)}") from None
    try:
        row = con.execute("SELECT position FROM tracking WHERE projection = ?",
                          [SCHEMA_KEY]).fetchone()
        return int(row[0]) if row else None
    except duckdb.Error:
        return None
    finally:
        con.close()


def locked_connection(path: Path) -> duckdb.DuckDBPyConnection:
    """The index at `path`, read-only, in a session locked down as `LOCKDOWN` says."""
    import duckdb

    try:
        con = duckdb.connect(str(path), read_only=True, config=LOCKDOWN)
    except duckdb.Error as e:
        raise ProjectionError(f"cannot open index {path}: {one_line(e)}") from None
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


@dataclass
class IndexSession:
    con: duckdb.DuckDBPyConnection
    path: Path
    caught_up: CatchUpResult | None
    ledger: Ledger


@contextmanager
def open_index(ws: Workspace, *, update: bool = True, rebuild: bool = False,
               batch: int = DEFAULT_BATCH,
               timeout_s: float = LOCK_TIMEOUT_S,
               progress: Callable[[CatchUpProgress], None] | None = None,
               ) -> Iterator[IndexSession]:
    """Lock the index, (re)build or catch it up, and hand out the connection. Every query
    command goes through here, so queries always see the ledger as of this call.
    `progress`: as `catch_up`'s (after each batch of a catch-up longer than one)."""
    path = index_path(ws.home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with index_lock(path, timeout_s):
        if rebuild or schema_version(path) != INDEX_SCHEMA_VERSION:
            # A projection: an index of another schema version is simply rebuilt.
            for p in (path, Path(str(path) + ".wal")):
                if p.exists():
                    os.remove(p)
        con = connect(path)
        try:
            result = (catch_up(con, ws.ledger, batch=batch, artifacts=ws.artifacts.get,
                               progress=progress)
                      if (update or rebuild) else None)
            yield IndexSession(con, path, result, ws.ledger)
        finally:
            con.close()


@contextmanager
def index_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the index's file lock (one forge command at a time on the index)."""
    lock = FileLock(str(path) + ".lock")
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise ProjectionError(f"index {path} is locked by another forge command "
                              f"(waited {timeout_s:.0f}s)") from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def read_index(ws: Workspace, timeout_s: float = LOCK_TIMEOUT_S
               ) -> Iterator[duckdb.DuckDBPyConnection | None]:
    """The index as it is (no catch-up), read-only in the locked-down session, under its
    lock; None when there is no index."""
    path = index_path(ws.home)
    if not path.exists():
        yield None
        return
    with index_lock(path, timeout_s):
        con = locked_connection(path)
        try:
            yield con
        finally:
            con.close()


def update(ws: Workspace, *, batch: int = DEFAULT_BATCH,
           progress: Callable[[CatchUpProgress], None] | None = None) -> dict[str, Any]:
    with open_index(ws, batch=batch, progress=progress) as s:
        return _report(s)


def rebuild(ws: Workspace, *, batch: int = DEFAULT_BATCH,
            progress: Callable[[CatchUpProgress], None] | None = None) -> dict[str, Any]:
    with open_index(ws, rebuild=True, batch=batch, progress=progress) as s:
        return _report(s)


def status(ws: Workspace) -> dict[str, Any]:
    """Where the index stands, without catching up."""
    with open_index(ws, update=False) as s:
        return _report(s)


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None  # an aggregate returns one row
    return int(row[0])


def _report(s: IndexSession) -> dict[str, Any]:
    pos = tracked_position(s.con)
    head = s.ledger.max_position()
    counts = {t: _count(s.con, t) for t in TABLES}
    out: dict[str, Any] = {"path": str(s.path), "position": pos, "ledger_position": head,
                           "behind": max(0, head - pos), "rows": counts}
    if s.caught_up is not None:
        r = s.caught_up
        out["caught_up"] = {"events": r.events, "projected": r.projected,
                            "batches": r.batches, "seconds": round(r.seconds, 3),
                            "events_per_s": round(r.rate)}
    # Undecodable events the index left out (all of them, not only this catch-up's).
    out["skipped"] = [{"position": p, "stream": st, "version": v, "type": t, "error": e}
                      for p, st, v, t, e in s.con.execute(
                          "SELECT * FROM skipped ORDER BY position").fetchall()]
    return out
