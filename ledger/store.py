"""The event store, on the `eventsourcing` library's recorders.

Streams are named by text ids (`workspace`, `task:<id>`, `graph:<id>`, …) and stored as the
library's originator ids; the global log position is the library's notification id.
The backend (SQLite file by default, PostgreSQL for teams) is chosen by `forge.toml` only.

Contracts:
- `save()` writes every event of every given stream, plus a `CommandHandled` marker, in one
  transaction: all or nothing.
- Idempotent: a save retried with the same command id adds nothing and returns the first
  save's result (`duplicate=True`). Every save has a command id (generated when not given), so
  an internal retry after a lost acknowledgement can never duplicate.
- Optimistic concurrency: with `expected_version`, a stream that moved raises `ConflictError`
  naming the stream and both versions. Without it, the save appends at the end (starting
  from the version this process last wrote, else a read) and retries on a concurrent append
  for up to `lock_timeout_s` (each retry means another writer landed: progress, not a
  livelock; a hot writer winning race after race, as on PostgreSQL where a save is several
  round trips, delays it but cannot starve it within that time).
- Every payload passes through the redactor before it is written.

Why one module past 500 lines: it is the one class over the event table (`Ledger`): saving,
the reads and opening the backend (with its damage checks) share the recorder and its SQL.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import uuid4

import orjson
from eventsourcing.persistence import (
    DatabaseError,
    InfrastructureFactory,
    IntegrityError,
    OperationalError,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor

from . import codec
from .config import Config, load_config
from .errors import (
    ConflictError,
    DamagedLedgerError,
    LedgerBusyError,
    LedgerError,
    NotFoundError,
)
from .events import EVENT_TYPES, CommandHandled, Event
from .secrets.redactor import Redactor, secret_values_from

# The file checks and the files this process holds open: ledger/sqlite_file.py (re-exported).
from .sqlite_file import SQLITE_MAGIC as SQLITE_MAGIC
from .sqlite_file import check_sqlite_file as check_sqlite_file
from .sqlite_file import held_open, hold, release
from .sqlite_file import one_line as one_line
from .streams import COMMAND_PREFIX, task_stream

if TYPE_CHECKING:
    from eventsourcing.postgres import PostgresApplicationRecorder

    # What the library's factory builds for the two backends (it declares the base class).
    Recorder = SQLiteApplicationRecorder | PostgresApplicationRecorder

BOOKKEEPING_TYPES = frozenset({CommandHandled.TYPE})


@dataclass(frozen=True)
class Recorded:
    """An event as stored: its global position, its stream and version in that stream."""

    position: int
    stream: str
    version: int
    event: Event

    @property
    def type(self) -> str:
        return self.event.TYPE


@dataclass(frozen=True)
class Undecodable:
    """A stored event a reader could not decode (unknown type, corrupt JSON, a payload that
    fails validation, `null` where a number was stored): where it is, and why. Readers given
    an `on_error` callback hand these to it and keep reading; `forge check` lists them."""

    position: int
    stream: str
    version: int
    type: str
    error: str  # one line, from the codec

    def line(self) -> str:
        return (f"skipped undecodable event at position {self.position}: {self.error} "
                "(`forge check` lists the damage)")

    def as_dict(self) -> dict[str, Any]:
        """The record readers emit in JSON streams in the event's place: `undecodable` true
        (events themselves may have an `error` field) and the codec's `error`."""
        return {"position": self.position, "stream": self.stream, "version": self.version,
                "type": self.type, "undecodable": True, "error": self.error}


OnError = Callable[[Undecodable], None] | None


def _decode_at(pos: int, stream: str, version: int, topic: str, state: bytes,
               on_error: OnError) -> Event | None:
    """Decode one row; on failure hand an Undecodable to `on_error` (None returned), or,
    without one, raise the codec's error with the position in front."""
    try:
        return codec.decode(stream, version, topic, state)
    except LedgerError as e:
        if on_error is None:
            raise type(e)(f"position {pos}: {e} (run `forge check`)") from None
        msg = str(e)
        on_error(Undecodable(pos, stream, version, topic, msg))
        return None


@dataclass(frozen=True)
class Append:
    """One stream's part of a save. `expected_version` None means 'at the end, whatever it is'."""

    stream: str
    events: Sequence[Event]
    expected_version: int | None = None


@dataclass(frozen=True)
class SaveResult:
    command_id: str
    appended: dict[str, list[int]]  # stream -> [first version, last version]
    positions: list[int] = field(default_factory=list)
    duplicate: bool = False


class Ledger:
    """Append, read, stream and replay events. Open with `Ledger.open(home)`."""

    def __init__(self, config: Config, recorder: Recorder, factory: Any,
                 file_key: tuple[int, int] | None = None):
        self.config = config
        self.recorder = recorder
        self._factory = factory
        self._file_key = file_key  # the SQLite file this ledger holds open (see _OPEN_FILES)
        # The secret values are read at open; the redactor's patterns compile at its first
        # use (a write, a redaction): ~20 ms that a command which only reads never pays.
        self._secret_values = (secret_values_from(config.secret_env, config.secret_files)
                               + config.secret_values())
        self._versions: dict[str, int] = {}  # stream -> last version this process wrote

    @cached_property
    def redactor(self) -> Redactor:
        """The redactor of every payload this ledger writes: the rules and the workspace's
        secret values (configured, and the environment's, as they were at open)."""
        return Redactor(self._secret_values)

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    def open(cls, home: str | Path | None = None, *, config: Config | None = None,
             create: bool = False) -> Ledger:
        """Open the workspace's ledger. Only `create` (what `forge init` does for a new
        workspace) may create the SQLite file or the events table; otherwise a missing,
        empty, truncated or corrupt ledger raises DamagedLedgerError (naming the file and
        what is wrong) instead of silently starting a fresh, empty history."""
        config = config or load_config(home)
        env = config.persistence_env()
        postgres = config.backend == "postgres"
        # The library would run its CREATE statements on every open (and SQLite would create
        # a missing file): tables are created only when asked. On PostgreSQL, processes
        # opening at once would also collide in the catalog ("tuple concurrently updated").
        env["CREATE_TABLE"] = "false"
        db_file = None if postgres else Path(env["SQLITE_DBNAME"])
        if db_file is not None and not held_open(db_file):
            check_sqlite_file(db_file, missing_ok=create)
        try:
            factory = InfrastructureFactory.construct(env)
            recorder = cast("Recorder", factory.application_recorder())
            exists = _table_exists(recorder)
            if not exists and not create:
                where = (f"{config.display_url} (table {recorder.events_table_name})"
                         if postgres else str(db_file))
                raise DamagedLedgerError(where, f"its events table {recorder.events_table_name}"
                                                " is missing")
            if not exists:
                try:
                    recorder.create_table()
                except PersistenceError:
                    if postgres and _table_exists(recorder):
                        pass  # a concurrent creator won
                    else:
                        raise
        except (PersistenceError, OSError, sqlite3.DatabaseError) as e:
            if db_file is not None and _is_sqlite_damage(e):
                raise DamagedLedgerError(str(db_file), one_line(e)) from None
            raise LedgerError(config.scrub(f"cannot open ledger {config.display_url}: "
                                           f"{one_line(e)}")) from None
        return cls(config, recorder, factory, hold(db_file) if db_file is not None else None)

    def close(self) -> None:
        key, self._file_key = self._file_key, None
        self._factory.close()
        if key is not None:
            release(key)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- storage failures -----------------------------------------------------------------

    def _failure(self, e: BaseException, doing: str) -> LedgerError:
        """One line for a storage error: damage (a corrupt SQLite file) points to
        `forge check`; anything else says what failed."""
        if self.config.backend == "sqlite" and _is_sqlite_damage(e):
            return DamagedLedgerError(self.persistence_path(), one_line(e))
        return LedgerError(self.config.scrub(f"ledger {doing} failed: {one_line(e)}"))

    @contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        try:
            yield
        except (PersistenceError, sqlite3.DatabaseError) as e:
            raise self._failure(e, doing) from None

    def persistence_path(self) -> str:
        """The SQLite file (or the PostgreSQL URL, without a password) the ledger lives in."""
        env = self.config.persistence_env()
        return env.get("SQLITE_DBNAME") or self.config.display_url

    # --- writing --------------------------------------------------------------------------

    def written(self) -> list[str]:
        """The streams this object saved events to, in the order first written."""
        return list(self._versions)

    def append(
        self,
        stream: str,
        events: Sequence[Event],
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
    ) -> SaveResult:
        return self.save(Append(stream, events, expected_version), command_id=command_id)

    def save(self, *appends: Append, command_id: str | None = None) -> SaveResult:
        """Write all events of all `appends` atomically (see module contract)."""
        cid = command_id or uuid4().hex
        marker_stream = COMMAND_PREFIX + cid
        streams = [a.stream for a in appends]
        if len(set(streams)) != len(streams):
            # Each append numbers its events from the version it read: two on one stream
            # would claim the same versions and conflict with themselves forever.
            dup = sorted({s for s in streams if streams.count(s) > 1})
            raise LedgerError(f"one save appends to {', '.join(dup)} more than once; merge "
                              "those events into one append")
        for a in appends:
            self._refuse_secret(a.stream, a.stream)
        self._refuse_secret(marker_stream, cid)
        deadline = time.monotonic() + self.config.lock_timeout_s
        attempt = 0
        while True:
            stored: list[StoredEvent] = []
            appended: dict[str, list[int]] = {}
            for a in appends:
                if a.stream.startswith(COMMAND_PREFIX):
                    raise LedgerError(f"stream name {a.stream!r} is reserved")
                if a.expected_version is not None:
                    base = a.expected_version
                else:
                    # The version this process last wrote saves a read per save; if another
                    # writer moved the stream since, the insert conflicts and we re-read.
                    known = self._versions.get(a.stream) if attempt == 0 else None
                    base = self.version(a.stream) if known is None else known
                for i, ev in enumerate(a.events):
                    stored.append(codec.encode(a.stream, base + 1 + i, ev, self.redactor, cid))
                if a.events:
                    appended[a.stream] = [base + 1, base + len(a.events)]
            marker = CommandHandled(appended=appended, command_id=cid, seal=codec.seal(
                [e.topic for e in stored], [e.state for e in stored]))
            stored.append(codec.encode(marker_stream, 1, marker, None, cid))
            try:
                ids = self.recorder.insert_events(stored)
            except IntegrityError:
                for a in appends:
                    self._versions.pop(a.stream, None)
                prior = self._command_result(cid)
                if prior is not None:
                    return prior
                for a in appends:
                    if a.expected_version is not None:
                        actual = self.version(a.stream)
                        if actual != a.expected_version:
                            raise ConflictError(a.stream, a.expected_version, actual) from None
                # A stream without expectation moved under us: read again, retry. A short
                # random pause, longer after each loss, puts racing writers out of step.
                attempt += 1
                if time.monotonic() >= deadline:
                    raise LedgerBusyError(
                        f"gave up after {attempt} appends lost to concurrent writers in "
                        f"{self.config.lock_timeout_s}s (command {cid})") from None
                time.sleep(random.uniform(0, min(0.02, 0.001 * attempt)))
                continue
            except OperationalError as e:
                if "locked" in str(e).lower() or "lock timeout" in str(e).lower():
                    # The commit may still have happened; the marker tells.
                    prior = self._command_result(cid)
                    if prior is not None:
                        return prior
                    raise LedgerBusyError(
                        f"ledger {self.config.display_url} is locked by another writer "
                        f"(lock timeout {self.config.lock_timeout_s}s): {one_line(e)}"
                    ) from None
                raise self._failure(e, "write") from None
            except (PersistenceError, sqlite3.DatabaseError) as e:
                raise self._failure(e, "write") from None
            for stream, (_first, last) in appended.items():
                self._versions[stream] = last
            positions = list(ids or [])[:-1]
            return SaveResult(cid, appended, positions)

    def _refuse_secret(self, name: str, text: str) -> None:
        """Stream names and command ids are stored as given (they key the ledger and the
        markers), so one that holds a secret (`--task ghp_…`) is refused rather than redacted;
        the error names the kind of secret, never the value."""
        kinds = self.redactor.secret_kinds(text)
        if kinds:
            prefix, sep, _ = name.partition(":")
            what = f"{prefix} id" if sep and prefix.isidentifier() else "stream name"
            raise LedgerError(f"{what} looks like a secret ({', '.join(kinds)}); refusing to "
                              "record it")

    def _command_result(self, cid: str) -> SaveResult | None:
        with self._guard("read"):
            rows = self.recorder.select_events(COMMAND_PREFIX + cid, limit=1)
        if not rows:
            return None
        marker = codec.decode(COMMAND_PREFIX + cid, 1, rows[0].topic, rows[0].state)
        assert isinstance(marker, CommandHandled)
        return SaveResult(cid, dict(marker.appended), [], duplicate=True)

    def command_done(self, command_id: str) -> bool:
        with self._guard("read"):
            return bool(self.recorder.select_events(COMMAND_PREFIX + command_id, limit=1))

    # --- reading --------------------------------------------------------------------------

    def version(self, stream: str) -> int:
        """The stream's current version (0 if empty), read from the store."""
        with self._guard("read"):
            rows = self.recorder.select_events(stream, desc=True, limit=1)
        return rows[0].originator_version if rows else 0

    def stream(self, stream: str, *, until_version: int | None = None,
               on_error: OnError = None) -> list[Recorded]:
        """Events of one stream in version order, with their global positions.

        An event that cannot be decoded raises the codec's error (naming position, stream
        and version), or, given `on_error`, is handed to it and left out."""
        where = ["originator_id={p}"] + (["originator_version<={p}"]
                                         if until_version is not None else [])
        params: list[Any] = [stream] + ([until_version] if until_version is not None else [])
        out = []
        for pos, v, topic, state in self._select(where, params, "originator_version",
                                                 columns=False):
            ev = _decode_at(pos, stream, v, topic, state, on_error)
            if ev is not None:
                out.append(Recorded(pos, stream, v, ev))
        return out

    def last(self, stream: str, *, on_error: OnError = None) -> Recorded | None:
        """The stream's newest event (None if the stream is empty): one row read, however
        long the stream (a lease's latest heartbeat)."""
        for pos, v, topic, state in self._select(["originator_id={p}"], [stream],
                                                 "originator_version DESC", 1, columns=False):
            ev = _decode_at(pos, stream, v, topic, state, on_error)
            return None if ev is None else Recorded(pos, stream, v, ev)
        return None

    def raw_state(self, position: int) -> bytes:
        """The stored payload at a global position, as bytes (b"" if there is none)."""
        rows = self._select(["{pos}={p}"], [position], "{pos}", 1)
        return bytes(rows[0][4]) if rows else b""

    def max_position(self) -> int:
        with self._guard("read"):
            return self.recorder.max_notification_id() or 0

    def log(
        self,
        start: int = 1,
        stop: int | None = None,
        types: Iterable[str] = (),
        *,
        page: int = 1000,
        include_bookkeeping: bool = False,
        on_error: OnError = None,
    ) -> Iterator[Recorded]:
        """The global ordered log from position `start` to `stop` (inclusive).

        An event that cannot be decoded raises the codec's error (naming position, stream
        and version), or, given `on_error`, is handed to it in order and reading goes on."""
        decode = codec.decode
        for pos, stream, version, topic, state in self.rows(start, stop, types, page=page):
            if not include_bookkeeping and topic in BOOKKEEPING_TYPES:
                continue
            try:
                ev = decode(stream, version, topic, state)
            except LedgerError:
                handled = _decode_at(pos, stream, version, topic, state, on_error)
                if handled is None:
                    continue
                ev = handled
            yield Recorded(pos, stream, version, ev)

    def rows(
        self, start: int = 1, stop: int | None = None, types: Iterable[str] = (), *,
        page: int = 1000,
    ) -> Iterator[tuple[int, str, int, str, bytes]]:
        """Raw stored rows `(position, stream, version, type, state)` in global order, paged."""
        topics = self._check_types(types)
        pos = max(1, start)
        while True:
            where = ["{pos}>={p}"] + (["{pos}<={p}"] if stop is not None else [])
            params: list[Any] = [pos] + ([stop] if stop is not None else [])
            if topics:
                where.append("topic IN (" + ",".join("{p}" for _ in topics) + ")")
                params.extend(topics)
            batch = self._select(where, params, "{pos}", page)
            if not batch:
                return
            yield from batch
            pos = batch[-1][0] + 1
            if len(batch) < page:
                return

    def notifications(
        self, start: int = 1, stop: int | None = None, types: Iterable[str] = (), *,
        page: int = 1000,
    ) -> Iterator[Any]:
        """Raw stored notifications (undecoded, the library's objects), paged."""
        topics = self._check_types(types)
        pos = max(1, start)
        while True:
            with self._guard("read"):
                batch = self.recorder.select_notifications(pos, page, stop=stop,
                                                           topics=topics)
            if not batch:
                return
            yield from batch
            pos = batch[-1].id + 1
            if len(batch) < page:
                return

    @staticmethod
    def _check_types(types: Iterable[str]) -> tuple[str, ...]:
        topics = tuple(types)
        for t in topics:
            if t not in EVENT_TYPES:
                raise NotFoundError(f"unknown event type {t!r}")
        return topics

    def events(
        self,
        *,
        task: str | None = None,
        types: Iterable[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        stop: int | None = None,
        on_error: OnError = None,
    ) -> Iterator[Recorded]:
        """Filter the log by task, event type and time range (time is the event's own).

        `on_error` as in `log`; an undecodable event is handed to it when it may belong to
        the filter (its stream is the task's, or its raw payload names the task: its own time
        is unknown, so a time range does not exclude it)."""
        stream = task_stream(task) if task else None
        if on_error is not None and task:
            report = on_error

            def on_error(u: Undecodable) -> None:
                if u.stream == stream or _raw_task_id(self, u) == task:
                    report(u)

        for r in self.log(1, stop, types, on_error=on_error):
            if stream is not None and r.stream != stream and r.event.task_id != task:
                continue
            if since is not None and r.event.occurred_at < since:
                continue
            if until is not None and r.event.occurred_at > until:
                continue
            yield r

    def stream_log(self, stream: str, stop: int | None = None,
                   on_error: OnError = None) -> list[Recorded]:
        """One stream with global positions, up to position `stop` (`on_error` as in log)."""
        out = []
        for pos, v, topic, state in self.stream_rows(stream, stop):
            ev = _decode_at(pos, stream, v, topic, state, on_error)
            if ev is not None:
                out.append(Recorded(pos, stream, v, ev))
        return out

    def stream_rows(
        self, stream: str, stop: int | None = None
    ) -> list[tuple[int, int, str, bytes]]:
        """Raw rows `(position, version, type, state)` of one stream in version order."""
        where = ["originator_id={p}"] + (["{pos}<={p}"] if stop is not None else [])
        params: list[Any] = [stream] + ([stop] if stop is not None else [])
        return self._select(where, params, "originator_version", columns=False)

    _stream_positions = stream_rows  # older name

    def _select(
        self, where: list[str], params: list[Any], order: str, limit: int | None = None,
        *, columns: bool = True,
    ) -> list[Any]:
        """One query on the events table with the global position: the library's selects
        carry no positions per stream and build an object per row, which reading 100k events
        notices. `{pos}` and `{p}` in the fragments become the backend's column/placeholder.
        Rows: (position, stream, version, type, state), without the stream if not `columns`."""
        rec = self.recorder
        if isinstance(rec, SQLiteApplicationRecorder):  # the sqlite backend
            pos_col, ph, table = "rowid", "?", rec.events_table_name
        else:
            pos_col, ph = "notification_id", "%s"
            table = f'"{rec.datastore.schema}"."{rec.events_table_name}"'
        stream_col = "originator_id, " if columns else ""
        sql = (
            f"SELECT {pos_col}, {stream_col}originator_version, topic, state FROM {table} "
            f"WHERE " + " AND ".join(where) + f" ORDER BY {order}"
            + (" LIMIT {p}" if limit is not None else "")
        ).format(pos=pos_col, p=ph)
        if limit is not None:
            params = [*params, limit]
        try:
            with rec.datastore.transaction(commit=False) as c:
                if isinstance(c, SQLiteCursor):
                    c.sqlite_cursor.row_factory = None  # plain tuples: no per-row Row object
                c.execute(sql, params)
                rows = c.fetchall()
        except (PersistenceError, sqlite3.DatabaseError) as e:
            raise self._failure(e, "read") from None
        if self.config.backend == "sqlite":
            return rows
        if not columns:
            return [(r["notification_id"], r["originator_version"], r["topic"], bytes(r["state"]))
                    for r in rows]
        return [
            (r["notification_id"], r["originator_id"], r["originator_version"], r["topic"],
             bytes(r["state"]))
            for r in rows
        ]


def _raw_task_id(ledger: Ledger, u: Undecodable) -> Any:
    """The task id an undecodable event's raw payload names, if it parses that far."""
    try:
        payload = orjson.loads(ledger.raw_state(u.position))
    except orjson.JSONDecodeError:
        return None
    return payload.get("task_id") if isinstance(payload, dict) else None


def _is_sqlite_damage(e: BaseException) -> bool:
    """A SQLite error that means the file is not a sound database (not a lock or a bug)."""
    text = str(e).lower()
    return isinstance(e, sqlite3.DatabaseError | DatabaseError) and not isinstance(
        e, IntegrityError | sqlite3.IntegrityError) and any(
        s in text for s in ("malformed", "not a database", "disk i/o error", "corrupt"))


def _table_exists(recorder: Recorder) -> bool:
    if isinstance(recorder, SQLiteApplicationRecorder):
        with recorder.datastore.transaction(commit=False) as c:
            c.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                      [recorder.events_table_name])
            return c.fetchone() is not None
    name = f"{recorder.datastore.schema}.{recorder.events_table_name}"
    with recorder.datastore.transaction(commit=False) as pc:
        pc.execute("SELECT to_regclass(%s) AS t", [name])
        row = pc.fetchone()  # to_regclass returns one row: the table, or NULL
        return row is not None and row["t"] is not None
