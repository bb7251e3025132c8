"""`forge check`: the ledger is whole. Returns problems as one-line strings; empty means clean.

Checks: the backend's own integrity check (SQLite `PRAGMA integrity_check`), gap-free global
positions, every stream's versions contiguous from 1, every event decodes (known type, valid
payload, upcastable) and every task stream replays, every artifact hashes to its digest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import codec
from .errors import LedgerError
from .state import TaskState, apply
from .workspace import Workspace


@dataclass
class CheckReport:
    events: int = 0
    streams: int = 0
    tasks: int = 0
    artifacts: int = 0
    max_position: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_workspace(ws: Workspace, progress: Callable[[int], None] | None = None) -> CheckReport:
    report = CheckReport()
    ledger = ws.ledger
    if ws.config.backend == "sqlite":
        with ledger.recorder.datastore.transaction(commit=False) as c:
            c.execute("PRAGMA integrity_check")
            rows = [r[0] for r in c.fetchall()]
        if rows != ["ok"]:
            report.problems.extend(f"sqlite integrity: {r}" for r in rows)
    expected_pos = 1
    versions: dict[str, int] = {}
    tasks: dict[str, TaskState] = {}
    for n in ledger.notifications(1):
        stream = str(n.originator_id)
        if n.id != expected_pos:
            report.problems.append(f"positions: gap before {n.id} (expected {expected_pos})")
        expected_pos = n.id + 1
        prev = versions.get(stream, 0)
        if n.originator_version != prev + 1:
            report.problems.append(
                f"stream {stream!r}: version {n.originator_version} follows {prev}"
            )
        versions[stream] = n.originator_version
        report.events += 1
        try:
            event = codec.decode(stream, n.originator_version, n.topic, n.state)
        except LedgerError as e:
            report.problems.append(f"position {n.id}: {e}")
            continue
        if stream.startswith("task:"):
            apply(tasks.setdefault(stream, TaskState()), event)
        if progress is not None and report.events % 10000 == 0:
            progress(report.events)
    report.max_position = expected_pos - 1
    report.streams = len(versions)
    report.tasks = len(tasks)
    for digest in ws.artifacts.digests():
        report.artifacts += 1
    report.problems.extend(ws.artifacts.verify())
    return report
