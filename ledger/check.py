"""`forge check`: the ledger is whole. Returns problems as one-line strings; empty means clean.

Checks: the backend's own integrity check (SQLite `PRAGMA integrity_check`), gap-free global
positions (on PostgreSQL a rolled-back insert leaves a gap in the sequence: a note, not a
problem), every stream's versions contiguous from 1, every event decodes (known type, valid
payload, upcastable) and every task stream replays (with the one task fold of `task`, as
`forge replay` and Task Memory fold it), every save is whole (its events match its
CommandHandled marker, and the seal the marker carries), every artifact hashes to its digest.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eventsourcing.persistence import PersistenceError
from eventsourcing.sqlite import SQLiteApplicationRecorder

from . import codec
from .config import load_config
from .errors import DamagedLedgerError, LedgerError
from .events import CommandHandled
from .store import Ledger, one_line
from .streams import COMMAND_PREFIX, is_task_stream
from .task import Task, apply
from .workspace import Workspace, open_workspace


@dataclass
class CheckReport:
    events: int = 0
    streams: int = 0
    tasks: int = 0
    artifacts: int = 0
    max_position: int = 0
    gaps: int = 0  # PostgreSQL: sequence gaps (a note, not a problem)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts worth knowing that are not damage

    @property
    def ok(self) -> bool:
        return not self.problems


def check_home(home: str | Path | None = None,
               progress: Callable[[int], None] | None = None) -> CheckReport:
    """`forge check` from the workspace directory: a ledger that cannot even be opened
    (missing, empty, truncated, not SQLite, no events table) is reported as a problem naming
    the file and the fault, not raised. A missing workspace (no forge.toml) still raises."""
    load_config(home)  # ConfigError: no workspace here at all
    try:
        ws = open_workspace(home)
    except DamagedLedgerError as e:
        report = CheckReport()
        report.problems.append(f"ledger {e.where}: {e.what}")
        return report
    with ws:
        return check_workspace(ws, progress)


def check_workspace(ws: Workspace, progress: Callable[[int], None] | None = None) -> CheckReport:
    report = CheckReport()
    ledger = ws.ledger
    where = ledger.persistence_path()
    if isinstance(ledger.recorder, SQLiteApplicationRecorder):  # the sqlite backend
        try:
            with ledger.recorder.datastore.transaction(commit=False) as c:
                c.execute("PRAGMA integrity_check")
                rows = [r[0] for r in c.fetchall()]
        except (PersistenceError, sqlite3.DatabaseError) as e:
            rows = [f"cannot be checked: {one_line(e)}"]
        if rows != ["ok"]:
            report.problems.extend(f"sqlite integrity of {where}: {r}" for r in rows)
    try:
        _scan(ws, report, progress)
    except DamagedLedgerError as e:
        report.problems.append(f"ledger {e.where}: {e.what} (reading stopped after position "
                               f"{report.max_position}; {report.events} events read)")
    report.artifacts = sum(1 for _ in ws.artifacts.digests())
    report.problems.extend(ws.artifacts.verify())
    return report


def _scan(ws: Workspace, report: CheckReport, progress: Callable[[int], None] | None) -> None:
    """Every stored row in order: positions, versions, decoding, replay, whole saves."""
    ledger = ws.ledger
    sqlite = ws.config.backend == "sqlite"
    versions: dict[str, int] = {}
    tasks: dict[str, Task] = {}
    saved: dict[str, list[tuple[int, int, str]]] = {}  # stream -> [(first, last, command)]
    try:
        _scan_rows(ledger, sqlite, report, progress, versions, tasks, saved)
    finally:  # also when the file's damage stops the reading: what was read is counted
        report.streams = len(versions)
        report.tasks = len(tasks)
    # No partial save: the saves' markers tile every stream's versions exactly.
    for stream, top in versions.items():
        if not stream.startswith(COMMAND_PREFIX):
            report.problems.extend(_untiled(stream, top, saved.pop(stream, [])))
    for stream, ranges in saved.items():
        report.problems.extend(_untiled(stream, 0, ranges))
    if report.gaps:
        report.notes.append(f"positions: {report.gaps} gaps left by rolled-back inserts "
                            "(PostgreSQL sequences are not transactional; no event is missing)")


def _scan_rows(ledger: Ledger, sqlite: bool, report: CheckReport,
               progress: Callable[[int], None] | None, versions: dict[str, int],
               tasks: dict[str, Task], saved: dict[str, list[tuple[int, int, str]]]
               ) -> None:
    expected_pos = 1
    since_marker: list[tuple[int, str, bytes]] = []  # a save's events precede its marker
    for pos, stream, version, topic, state in ledger.rows(1):
        if pos != expected_pos:
            if sqlite:
                report.problems.append(f"positions: gap before {pos} (expected {expected_pos})")
            else:
                report.gaps += 1
        expected_pos = pos + 1
        report.max_position = pos
        prev = versions.get(stream, 0)
        if version != prev + 1:
            report.problems.append(f"stream {stream!r}: version {version} follows {prev}")
        versions[stream] = version
        report.events += 1
        if topic != CommandHandled.TYPE:
            since_marker.append((pos, topic, state))
        try:
            event = codec.decode(stream, version, topic, state)
        except LedgerError as e:
            report.problems.append(f"position {pos}: {e}")
            continue
        if isinstance(event, CommandHandled):
            cid = stream[len(COMMAND_PREFIX):]
            for st, (first, last) in event.appended.items():
                saved.setdefault(st, []).append((first, last, cid))
            n = sum(last - first + 1 for first, last in event.appended.values())
            own = since_marker[len(since_marker) - n:]
            if event.seal is not None and 0 < n <= len(since_marker) and codec.seal(
                    [t for _, t, _ in own], [st for _, _, st in own]) != event.seal:
                report.problems.append(
                    f"save {cid!r} (positions {own[0][0]}..{own[-1][0]}): its events no "
                    "longer match the seal written with them (a type or payload changed "
                    "since)")
            since_marker.clear()
        if is_task_stream(stream):
            apply(tasks.setdefault(stream, Task(records=False)), event)
        if progress is not None and report.events % 10000 == 0:
            progress(report.events)


def _untiled(stream: str, top: int, ranges: list[tuple[int, int, str]]) -> list[str]:
    """Versions 1..top of `stream` against the saves that claim them (one line per fault)."""
    out = []
    nxt = 1
    for first, last, cid in sorted(ranges):
        if first > nxt:
            out.append(f"stream {stream!r}: versions {nxt}..{first - 1} belong to no save "
                       "(no CommandHandled marker)")
        elif first < nxt:
            out.append(f"stream {stream!r}: save {cid!r} claims versions {first}..{last}, "
                       "overlapping another save")
        if last > top:
            out.append(f"stream {stream!r}: save {cid!r} wrote versions {first}..{last} but "
                       f"the stream ends at {top} (partial save)")
        nxt = max(nxt, last + 1)
    if nxt <= top:
        out.append(f"stream {stream!r}: versions {nxt}..{top} belong to no save "
                   "(no CommandHandled marker)")
    return out
