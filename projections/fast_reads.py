"""The read commands without the models: `forge task list`, `forge task memory T` and
`forge log` answered from SQLite and stored JSON when that can be done exactly, else by the
models (Task Memory, the event store), which then keep what the next read needs.

Every `forge` call an agent makes pays its start-up; pydantic and the event models are
~100 ms of it (bench/RESULTS.md, issue 36). This module loads neither: the standard
library, orjson and the ledger's standard-library parts (the home, the file check, seals,
the stored forms). What it cannot answer exactly it leaves to the models (`None` from a
`fast_*` function; the `read_*` functions then take the models' path).

Task rows (`task list`, `task memory`): a read-side cache the models' path writes, never a
second fold. `<home>/reads.sqlite` holds, per task, the `task list` row and the Task Memory
JSON (`model_dump(mode="json")`) the fold and Task Memory computed (projections/memory.py),
keyed by the digest of the task stream's stored rows (versions, types, payloads) they were
computed from, and by a stamp: `ROW_VERSION`, this code (the size and time of the ledger's
modules, Task Memory's and this one) and the bytes of forge.toml that the models' open
validated. A row is used only when the stream's rows, read now, give the same digest and
the stamp is the same: an append, a changed or damaged event, another forge or an edited
forge.toml sends the read to the models, which write the row again (not for a task with an
undecodable event: the models' path warns of it on every read). The file is a projection:
deleted, it is rebuilt by the next reads; a read that cannot write it still answers.

Log (`forge log`): every stored row in order, each event printed
from its stored JSON when its save's seal holds (ledger/seals.py: exactly what the codec
wrote from a valid event) and its payload has its type's current form
(ledger/stored_forms.py: the JSON dump the models would print). A row that is neither,
and could be printed or reported, sends the whole read to the models (which decode and
report as before). It also needs the stamp: the models' open validated this forge.toml.

The ledger is opened read-only, after the file check the store makes (a damaged file is
the models' to report); a PostgreSQL ledger always takes the models' path.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import tomllib
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ..ledger.errors import LedgerError
from ..ledger.home import CONFIG_NAME, DEFAULT_LEDGER_URL, EVENTS_TABLE, resolve_home, sqlite_file
from ..ledger.numbers import json_text
from ..ledger.seals import MARKER_TYPE, sealed_rows
from ..ledger.sqlite_file import check_sqlite_file, held_open
from ..ledger.stored_forms import FORMS, VERSION_KEY, json_form
from ..ledger.streams import TASK_PREFIX, task_of, task_stream

if TYPE_CHECKING:
    from ..ledger.store import Ledger, OnError, Undecodable

ROW_VERSION = 1  # of the rows in reads.sqlite: bump when their content changes
READS_NAME = "reads.sqlite"
_PACKAGE = Path(__file__).resolve().parent.parent
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS stamps (stamp TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS task_rows (task_id TEXT PRIMARY KEY, stamp TEXT NOT NULL, "
    "digest TEXT NOT NULL, version INTEGER NOT NULL, list_row TEXT NOT NULL, memory TEXT)",
)


# --- where: the home, its ledger file, the stamp ----------------------------------------------


@dataclass(frozen=True)
class _Home:
    root: Path
    db: Path  # the SQLite ledger file
    stamp: str

    def ledger(self) -> sqlite3.Connection:
        """The ledger, after the store's file check (DamagedLedgerError). Opened to read
        only, but not `mode=ro`: a read-only connection, closing last, would leave the
        write-ahead log and its index beside the file (this one removes them, as the
        store's do); `mode=rw` never creates a missing file."""
        if not held_open(self.db):  # a plain open/close would drop this process's locks
            check_sqlite_file(self.db)
        return sqlite3.connect(f"{self.db.as_uri()}?mode=rw", uri=True, timeout=5,
                               isolation_level=None)

    def reads(self) -> sqlite3.Connection | None:
        path = self.root / READS_NAME
        if not path.is_file():
            return None
        return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=1)

    def stamped(self, reads: sqlite3.Connection) -> bool:
        return reads.execute("SELECT 1 FROM stamps WHERE stamp=?", (self.stamp,)).fetchone() \
            is not None


_CODE: list[bytes] = []


def _code() -> bytes:
    """This code, as the stamp names it: the size and modification time of the modules the
    rows are computed and read with, and of the installed pydantic that dumps them (found,
    not imported)."""
    if not _CODE:
        from importlib.util import find_spec

        files = sorted([*(_PACKAGE / "ledger").glob("*.py"), _PACKAGE / "projections" /
                        "memory.py", Path(__file__).resolve()])
        for lib in ("pydantic", "pydantic_core"):
            spec = find_spec(lib)
            files.append(Path(spec.origin) if spec is not None and spec.origin else
                         Path(lib))
        parts = []
        for f in files:
            try:
                st = f.stat()
                parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                parts.append(f"{f.name}:gone")
        _CODE.append("\n".join(parts).encode())
    return _CODE[0]


def _stamp(config: bytes) -> str:
    h = hashlib.sha256(b"%d\0" % ROW_VERSION)
    h.update(_code())
    h.update(b"\0")
    h.update(config)
    return h.hexdigest()


def _config_bytes(root: Path) -> bytes | None:
    try:
        return (root / CONFIG_NAME).read_bytes()
    except OSError:
        return None


def _home(home: str | Path | None) -> _Home | None:
    """The home with a SQLite ledger, or None (no forge.toml, not TOML, another backend:
    the models' open says what is wrong)."""
    root = resolve_home(home)
    config = _config_bytes(root)
    if config is None:
        return None
    try:
        data = tomllib.loads(config.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    ledger = data.get("ledger", {})
    url = ledger.get("url", DEFAULT_LEDGER_URL) if isinstance(ledger, dict) else None
    db = sqlite_file(root, url) if isinstance(url, str) else None
    if db is None:
        return None
    return _Home(root, db, _stamp(config))


def _digest(rows: Iterable[tuple[Any, ...]]) -> str:
    """Of a stream's stored rows `(version, type, state)`, in version order."""
    h = hashlib.sha256()
    for version, topic, state in rows:
        state = bytes(state)
        h.update(b"%d %d %s\n" % (version, len(state), str(topic).encode()))
        h.update(state)
    return h.hexdigest()


def _stream(c: sqlite3.Connection, stream: str) -> list[tuple[Any, ...]]:
    return c.execute(f"SELECT originator_version, topic, state FROM {EVENTS_TABLE} "
                     "WHERE originator_id=? ORDER BY originator_version", (stream,)).fetchall()


def _answer(home: str | Path | None, read: Callable[[_Home, sqlite3.Connection,
                                                     sqlite3.Connection], Any]) -> Any:
    """`read(home, ledger, reads)` in one read transaction of the ledger, or None when it
    cannot answer or anything is amiss (a missing or damaged file: the models say so)."""
    try:
        h = _home(home)
        if h is None:
            return None
        reads = h.reads()
        if reads is None:
            return None
        with closing(reads):
            if not h.stamped(reads):
                return None
            with closing(h.ledger()) as c:
                c.execute("BEGIN")  # one snapshot for all that is read
                return read(h, c, reads)
    except (sqlite3.Error, OSError, LedgerError, ValueError):
        return None  # ValueError: a kept row that is not JSON (see `_write`)


# --- task rows -----------------------------------------------------------------------------


def _task_ids(c: sqlite3.Connection) -> list[str]:
    """The tasks in the order they were defined (projections/memory.py `list_tasks`)."""
    rows = c.execute(f"SELECT originator_id FROM {EVENTS_TABLE} WHERE topic='TaskDefined' "
                     "AND originator_version=1 ORDER BY rowid").fetchall()
    return [s[len(TASK_PREFIX):] for (s,) in rows if s.startswith(TASK_PREFIX)]


def _row(h: _Home, c: sqlite3.Connection, reads: sqlite3.Connection, task_id: str,
         column: str) -> str | None:
    digest = _digest(_stream(c, task_stream(task_id)))
    found = reads.execute(f"SELECT {column} FROM task_rows WHERE task_id=? AND stamp=? "
                          "AND digest=?", (task_id, h.stamp, digest)).fetchone()
    return None if found is None else found[0]


def fast_task_list(home: str | Path | None) -> list[dict[str, Any]] | None:
    """`forge task list`'s rows from reads.sqlite, or None (module contract)."""

    def read(h: _Home, c: sqlite3.Connection, reads: sqlite3.Connection) -> Any:
        out = []
        for tid in _task_ids(c):
            row = _row(h, c, reads, tid, "list_row")
            if row is None:
                return None
            out.append(json.loads(row))
        return out

    return _answer(home, read)


def fast_task_memory(home: str | Path | None, task_id: str) -> dict[str, Any] | None:
    """`forge task memory`'s JSON from reads.sqlite, or None (module contract)."""

    def read(h: _Home, c: sqlite3.Connection, reads: sqlite3.Connection) -> Any:
        row = _row(h, c, reads, task_id, "memory")
        return None if row is None else json.loads(row)

    return _answer(home, read)


def read_task_list(home: str | Path | None, on_error: OnError = None
                   ) -> list[dict[str, Any]]:
    """`forge task list`: from reads.sqlite, else by the fold (projections/memory.py), whose
    rows are kept for the next read."""
    rows = fast_task_list(home)
    if rows is not None:
        return rows
    # For start-up time: the models' path (the event store, the fold: pydantic) loads
    # only when no row answers.
    from ..ledger.workspace import open_workspace
    from .memory import task_rows

    config = _config_bytes(resolve_home(home))
    with open_workspace(home) as ws:
        out, keep = [], []
        for row, version in task_rows(ws.ledger, on_error):
            out.append(row)
            if "damaged_events" not in row:
                keep.append((row["task_id"], version, json_text(row), None))
        _remember(ws.ledger, config, keep)
    return out


def read_task_memory(home: str | Path | None, task_id: str, on_error: OnError = None
                     ) -> dict[str, Any]:
    """`forge task memory --json`'s object: from reads.sqlite, else Task Memory
    (projections/memory.py), kept for the next read."""
    found = fast_task_memory(home, task_id)
    if found is not None:
        return found
    # For start-up time: the models' path (the event store, the fold, Task Memory, the
    # specs) loads only when no row answers.
    from ..ledger.workspace import open_workspace
    from .memory import list_row, read_memory

    config = _config_bytes(resolve_home(home))
    damaged: list[Undecodable] = []

    def seen(u: Undecodable) -> None:
        damaged.append(u)
        if on_error is not None:
            on_error(u)

    with open_workspace(home) as ws:
        mem, version = read_memory(ws.ledger, task_id, seen if on_error is not None else None)
        text = json_text(mem.model_dump(mode="json"))
        keep = [] if damaged else [(task_id, version, json_text(list_row(task_id, mem.task)),
                                    text)]
        _remember(ws.ledger, config, keep)
    out: dict[str, Any] = json.loads(text)
    return out


# A command that wrote more task streams than this keeps none (a graph run, an import): the
# next read of each pays the models' path once, as before.
KEEP_WRITTEN_MAX = 8


def keep_written(ledger: Ledger) -> int:
    """After a command that saved to task streams (`Ledger.written`), keep their rows, so the
    read that follows a write is answered from them too: the writer has the models loaded,
    folding a task again costs it a few ms, a reader's models' path ~0.2 s. Returns how
    many tasks were kept. Never fails: the command's work is done and recorded."""
    tasks = [t for t in (task_of(s) for s in ledger.written()) if t is not None]
    if not tasks or len(tasks) > KEEP_WRITTEN_MAX or ledger.config.backend != "sqlite":
        return 0
    # For start-up time: Task Memory (pydantic) loads only in a writer, which has it loaded.
    from .memory import list_row, read_memory

    config = _config_bytes(ledger.config.home)
    keep = []
    for task_id in tasks:
        try:
            mem, version = read_memory(ledger, task_id)  # an undecodable event raises
        except Exception:  # noqa: BLE001 - a cache: nothing here may fail a command that
            continue  # succeeded; damaged (or gone): its readers take the models' path
        keep.append((task_id, version, json_text(list_row(task_id, mem.task)),
                     json_text(mem.model_dump(mode="json"))))
    _remember(ledger, config, keep)
    return len(keep)


def _remember(ledger: Ledger, config: bytes | None,
              rows: Sequence[tuple[str, int, str, str | None]]) -> None:
    """Keep the stamp of the forge.toml the models' open validated, and the rows computed
    from each task stream at `version` (`(task_id, version, list row, memory or None)`)
    under the digest of the stream's rows up to it. Never fails a read: a workspace whose
    reads.sqlite cannot be written still answers, by the models."""
    try:
        _keep(ledger, config, rows)
    except (sqlite3.Error, OSError, LedgerError):
        pass  # the read has its answer; the next one tries again


def _keep(ledger: Ledger, config: bytes | None,
          rows: Sequence[tuple[str, int, str, str | None]]) -> None:
    if ledger.config.backend != "sqlite" or config is None:
        return
    root = ledger.config.home
    if _config_bytes(root) != config:
        return  # forge.toml changed while it was read: not the content validated
    stamp = _stamp(config)
    digests = []
    for task_id, version, list_row_text, memory in rows:
        stored = ledger.stream_rows(task_stream(task_id), None)
        if not stored or stored[-1][1] != version:
            continue  # the stream moved since the fold read it
        digests.append((task_id, stamp, _digest(r[1:] for r in stored), version,
                        list_row_text, memory))
    path = root / READS_NAME
    for _attempt in range(2):
        try:
            _write(path, stamp, digests)
            return
        except sqlite3.DatabaseError as e:
            text = str(e).lower()
            if "malformed" not in text and "not a database" not in text:
                return  # busy, read-only, …: the next read tries again
        except OSError:
            return
        # A damaged file (a power loss while it was written: no sync, see `_write`): it is
        # a projection, made again.
        with suppress(OSError):
            path.unlink()


def _write(path: Path, stamp: str,
           rows: Sequence[tuple[str, str, str, int, str, str | None]]) -> None:
    with closing(sqlite3.connect(path, timeout=1)) as db:
        # No fsync (~4-12 ms a read): a crash of the process loses nothing, a power loss
        # may lose or damage the file, which the next read finds (a digest that does not
        # match, an error) and makes again from the ledger.
        db.execute("PRAGMA synchronous=OFF")
        with db:
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("DELETE FROM stamps WHERE stamp<>?", (stamp,))
            db.execute("INSERT OR IGNORE INTO stamps VALUES (?)", (stamp,))
            db.execute("DELETE FROM task_rows WHERE stamp<>?", (stamp,))
            for task_id, st, digest, version, list_row_text, memory in rows:
                if memory is None:  # `task list` computes no memory: keep one already there
                    db.execute("INSERT INTO task_rows VALUES (?,?,?,?,?,NULL) ON CONFLICT"
                               "(task_id) DO UPDATE SET stamp=excluded.stamp, digest="
                               "excluded.digest, version=excluded.version, list_row="
                               "excluded.list_row, memory=CASE WHEN task_rows.digest="
                               "excluded.digest THEN task_rows.memory END",
                               (task_id, st, digest, version, list_row_text))
                else:
                    db.execute("INSERT OR REPLACE INTO task_rows VALUES (?,?,?,?,?,?)",
                               (task_id, st, digest, version, list_row_text, memory))


# --- log -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogRow:
    """An event as `forge log` prints it: `fields()` its JSON line (`position`, `stream`,
    `version`, `type`, then the event's JSON dump), and what its text line shows."""

    position: int
    stream: str
    version: int
    type: str
    payload: dict[str, Any] | None = None  # the JSON dump, from the stored JSON
    event: Any = None  # or the decoded event (the models' path)

    def fields(self) -> dict[str, Any]:
        dump = self.payload if self.payload is not None else self.event.model_dump(mode="json")
        return {"position": self.position, "stream": self.stream, "version": self.version,
                "type": self.type, **dump}

    def head(self) -> tuple[datetime, str | None, str | None, str, str | None]:
        """(when, task id, block id, actor's name, actor's model) of the event."""
        if self.payload is None:
            ev = self.event
            return ev.occurred_at, ev.task_id, ev.block_id, ev.actor.name, ev.actor.model
        p = self.payload
        return (datetime.fromisoformat(p["occurred_at"]), p["task_id"], p["block_id"],
                p["actor"]["name"], p["actor"]["model"])


def fast_log(home: str | Path | None, task: str | None, types: Iterable[str],
             since: datetime | None = None, until: datetime | None = None
             ) -> list[LogRow] | None:
    """The events `forge log [--task T] [--type X] [--since A] [--until B]` prints, from the
    stored JSON, or None (module contract). `since`/`until` are timezone-aware, as the
    models' path compares them with each event's own time."""
    wanted = tuple(types)
    if any(t not in FORMS for t in wanted):
        return None  # an unknown type: the store names it

    def read(h: _Home, c: sqlite3.Connection, reads: sqlite3.Connection) -> Any:
        rows = c.execute(f"SELECT rowid, originator_id, originator_version, topic, state "
                         f"FROM {EVENTS_TABLE} ORDER BY rowid").fetchall()
        return _log_rows(rows, task, wanted, since, until)

    return _answer(home, read)


def _log_rows(rows: list[tuple[Any, ...]], task: str | None, wanted: tuple[str, ...],
              since: datetime | None = None, until: datetime | None = None
              ) -> list[LogRow] | None:
    sealed = sealed_rows(rows)
    stream = task_stream(task) if task is not None else None
    out = []
    for i, (pos, s, v, topic, state) in enumerate(rows):
        if topic == MARKER_TYPE or (wanted and topic not in wanted):
            continue
        try:
            payload = orjson.loads(state)
        except orjson.JSONDecodeError:
            payload = None
        dump = json_form(topic, payload) if sealed[i] and type(payload) is dict else None
        if dump is None:  # not exactly as encoded: the models decode it, or report it
            if task is None or s == stream:
                return None  # it would be printed or reported
            if type(payload) is not dict:
                continue  # it names no task: the models leave it out silently
            entry = FORMS.get(topic)
            if payload.get("task_id") == task or entry is None \
                    or payload.get(VERSION_KEY) != entry[0]:
                return None  # it names the task, or an upcast of an old version might
            continue  # another task's, as the models would decode it: left out
        if stream is not None and s != stream and dump["task_id"] != task:
            continue
        # An event's own time, as the models' path compares it (an undecodable event has
        # none: it is reported whatever the range, so it went to the models above).
        if since is not None or until is not None:
            at = datetime.fromisoformat(dump["occurred_at"])
            if (since is not None and at < since) or (until is not None and at > until):
                continue
        out.append(LogRow(pos, s, v, topic, payload=dump))
    return out


def read_log(home: str | Path | None, *, task: str | None, types: Iterable[str],
             since: datetime | None, until: datetime | None
             ) -> list[LogRow | Undecodable]:
    """`forge log`'s records in global order: `LogRow`s and, in its place, the
    `Undecodable` of an event that cannot be decoded (the caller reports it). From the
    stored JSON when exact (module contract), else by the event store."""
    types = tuple(types)
    fast = fast_log(home, task, types, since, until)
    if fast is not None:
        return list(fast)
    # For start-up time: the models' path (the event store decodes every event with
    # pydantic) loads only when the stored JSON cannot answer.
    from ..ledger.workspace import open_workspace

    config = _config_bytes(resolve_home(home))
    out: list[LogRow | Undecodable] = []
    with open_workspace(home) as ws:
        for r in ws.ledger.events(task=task, types=types, since=since, until=until,
                                  on_error=out.append):
            out.append(LogRow(r.position, r.stream, r.version, r.type, event=r.event))
        _remember(ws.ledger, config, [])
    return out
