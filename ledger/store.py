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
  from the version this process last wrote, else a read) and retries on a concurrent append.
- Every payload passes through the redactor before it is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import orjson
from eventsourcing.persistence import (
    ApplicationRecorder,
    InfrastructureFactory,
    IntegrityError,
    OperationalError,
    PersistenceError,
    StoredEvent,
)

from . import codec
from .config import Config, load_config
from .errors import ConflictError, LedgerBusyError, LedgerError, NotFoundError
from .events import EVENT_TYPES, CommandHandled, Event
from .redact import Redactor, secret_values_from

COMMAND_PREFIX = "command:"
BOOKKEEPING_TYPES = frozenset({CommandHandled.TYPE})


def task_stream(task_id: str) -> str:
    return f"task:{task_id}"


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
        return {"position": self.position, "stream": self.stream, "version": self.version,
                "type": self.type, "error": self.error}


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

    def __init__(self, config: Config, recorder: ApplicationRecorder, factory: Any):
        self.config = config
        self.recorder = recorder
        self._factory = factory
        self.redactor = Redactor(secret_values_from(config.secret_env, config.secret_files)
                                 + config.secret_values())
        self._versions: dict[str, int] = {}  # stream -> last version this process wrote

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    def open(cls, home: str | Path | None = None, *, config: Config | None = None) -> Ledger:
        config = config or load_config(home)
        env = config.persistence_env()
        postgres = config.backend == "postgres"
        if postgres:
            # The library re-runs its CREATE statements on every open; processes opening at
            # once then collide in PostgreSQL's catalog ("tuple concurrently updated").
            # Create only when the table is missing.
            env["CREATE_TABLE"] = "false"
        try:
            factory = InfrastructureFactory.construct(env)
            recorder = factory.application_recorder()
            if postgres and not _pg_table_exists(recorder):
                try:
                    recorder.create_table()
                except PersistenceError:
                    if not _pg_table_exists(recorder):  # not a concurrent creator: real
                        raise
        except (PersistenceError, OSError) as e:
            raise LedgerError(config.scrub(f"cannot open ledger {config.display_url}: "
                                           f"{one_line(e)}")) from None
        return cls(config, recorder, factory)

    def close(self) -> None:
        self._factory.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing --------------------------------------------------------------------------

    def append(
        self,
        stream: str,
        events: Sequence[Event],
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
    ) -> SaveResult:
        return self.save(Append(stream, events, expected_version), command_id=command_id)

    def save(
        self, *appends: Append, command_id: str | None = None, retries: int = 20
    ) -> SaveResult:
        """Write all events of all `appends` atomically (see module contract)."""
        cid = command_id or uuid4().hex
        marker_stream = COMMAND_PREFIX + cid
        for attempt in range(retries):
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
            marker = CommandHandled(appended=appended, command_id=cid)
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
                continue  # a stream without expectation moved under us: read again, retry
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
                raise LedgerError(f"ledger write failed: {one_line(e)}") from None
            for stream, (_first, last) in appended.items():
                self._versions[stream] = last
            positions = list(ids or [])[:-1]
            return SaveResult(cid, appended, positions)
        raise LedgerBusyError(f"gave up after {retries} concurrent-append retries (command {cid})")

    def _command_result(self, cid: str) -> SaveResult | None:
        rows = self.recorder.select_events(COMMAND_PREFIX + cid, limit=1)
        if not rows:
            return None
        marker = codec.decode(COMMAND_PREFIX + cid, 1, rows[0].topic, rows[0].state)
        assert isinstance(marker, CommandHandled)
        return SaveResult(cid, dict(marker.appended), [], duplicate=True)

    def command_done(self, command_id: str) -> bool:
        return bool(self.recorder.select_events(COMMAND_PREFIX + command_id, limit=1))

    # --- reading --------------------------------------------------------------------------

    def version(self, stream: str) -> int:
        """The stream's current version (0 if empty), read from the store."""
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

    def raw_state(self, position: int) -> bytes:
        """The stored payload at a global position, as bytes (b"" if there is none)."""
        rows = self._select(["{pos}={p}"], [position], "{pos}", 1)
        return bytes(rows[0][4]) if rows else b""

    def max_position(self) -> int:
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
                ev = _decode_at(pos, stream, version, topic, state, on_error)
                if ev is None:
                    continue
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
            batch = self.recorder.select_notifications(pos, page, stop=stop, topics=topics)
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
        if self.config.backend == "sqlite":
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
                if self.config.backend == "sqlite":
                    c.sqlite_cursor.row_factory = None  # plain tuples: no per-row Row object
                c.execute(sql, params)
                rows = c.fetchall()
        except OperationalError as e:
            raise LedgerError(f"ledger read failed: {one_line(e)}") from None
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


def _pg_table_exists(recorder: Any) -> bool:
    name = f"{recorder.datastore.schema}.{recorder.events_table_name}"
    with recorder.datastore.transaction(commit=False) as c:
        c.execute("SELECT to_regclass(%s) AS t", [name])
        return c.fetchone()["t"] is not None


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
