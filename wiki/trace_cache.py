"""Decision traces kept between wiki builds (`wiki/_traces.json`).

A decision page shows the decision's traceable path (`projections.trace.traces_for`), which
reads the decision's whole task stream from the ledger: ~15 ms a decision, minutes for a
journal of 10k tasks. A trace is made of the task's events (its stream, and the engine
events that name it: all in the index's `events` with its task id), the graph streams'
verifications and handoffs, and the artifacts it names. So it is kept with a key of the
task's last indexed position and the last graph event's position: a build traces again only
the decisions of tasks that moved (or all of them after new graph events). A damaged record
is ignored (every decision traced again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..ledger.atomic import write_atomic
from ..ledger.workspace import Workspace
from .snapshot import Snapshot

TRACES = "_traces.json"
GRAPH_TYPES = ("NodeVerified", "HandoffDelivered")  # what trace._graph_feeds reads


def graph_position(con: Any) -> int:
    """The position of the last graph verification or handoff in the index (0: none)."""
    return con.execute("SELECT coalesce(max(position), 0) FROM events WHERE type IN "
                       f"{GRAPH_TYPES!r}").fetchone()[0]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def traces(ws: Workspace, snap: Snapshot, wiki_dir: Path, graph_pos: int
           ) -> tuple[dict[str, dict[str, Any]], int]:
    """Decision id -> trace for every decision of the snapshot, and how many were traced
    afresh (the others come from the record, which is rewritten when anything changed)."""
    # In the function for start-up time: a fresh build returns before it traces; the trace
    # reads (~20 ms) load when decisions are traced.
    from ..projections.trace import traces_for

    path = wiki_dir / TRACES
    kept = _load(path)
    keys = {str(d["decision_id"]): f"{snap.task_positions.get(d['task_id'], 0)}:{graph_pos}"
            for d in snap.decisions}
    out: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, str]] = []
    for d in snap.decisions:
        did = str(d["decision_id"])
        k = kept.get(did)
        if isinstance(k, list) and len(k) == 2 and k[0] == keys[did] and isinstance(k[1], dict):
            out[did] = k[1]
        else:
            todo.append((d["task_id"], did))
    if todo:
        out.update(traces_for(ws, todo, stop=snap.position))
    record = {did: [keys[did], chain] for did, chain in out.items()}
    if record.keys() != kept.keys() or todo:
        wiki_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, orjson.dumps(record))
    return out, len(todo)
