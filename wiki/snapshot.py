"""What the wiki's pages are made of, read from the index in a few bulk queries: `load(con)`
gives a `Snapshot` (tasks, blocks, metric summaries, gate verdicts, verification steps,
reviews, decisions, handoffs, points, profiles), from which `pages.make_pages` is a pure
function."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from ..projections.index import tracked_position


def _rows(con, sql: str) -> list[dict[str, Any]]:
    rel = con.execute(sql)
    names = [d[0] for d in rel.description]
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


@dataclass
class Snapshot:
    position: int
    tasks: list[dict[str, Any]]
    blocks: dict[str, list[dict[str, Any]]]
    metrics: dict[str, list[dict[str, Any]]]  # task -> summary rows
    gates: dict[str, list[dict[str, Any]]]  # task -> gate rows
    decisions: list[dict[str, Any]]
    handoffs: dict[str, list[dict[str, Any]]]
    points: list[dict[str, Any]]
    profiles: list[dict[str, Any]]
    task_positions: dict[str, int]
    events_by_id: dict[str, tuple[str, int]] = field(default_factory=dict)
    # task -> the steps of each block's latest verification: {block_id, step, kind, outcome,
    # detail}, in ledger order
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # task -> its blocks' cross-model reviews (ReviewRecorded), in ledger order: {block_id,
    # tier, model, family, verdict, reasons}
    reviews: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # decision id -> its traceable path (projections.trace.traces_for; the build fills it from
    # the ledger: the index has no tool-call snapshots or graph handoffs per decision)
    traces: dict[str, dict[str, Any]] = field(default_factory=dict)
    # artifact digest -> its redacted preview (the build reads the artifacts the traces name:
    # tool output, engine logs; wiki/artifacts.py)
    previews: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def decided(self) -> dict[tuple, str]:
        """The latest decision kind by (task, "block", block) or, for a decision without a
        block, by (task, "candidate", candidate key)."""
        out: dict[tuple, str] = {}
        for d in self.decisions:  # in ledger order
            key = (("block", d["block_id"]) if d["block_id"] is not None
                   else ("candidate", d["candidate_key"]))
            out[(d["task_id"], *key)] = d["kind"]
        return out

    @cached_property
    def points_by_hash(self) -> dict[str, dict[str, Any]]:
        return {p["point_hash"]: p for p in self.points}


def load(con) -> Snapshot:
    # The index's own tracking row: the table also holds the schema version's row, which is
    # not a ledger position.
    pos = tracked_position(con)
    tasks = _rows(con, """SELECT t.*, o.status, o.blocks, o.accepted, o.rejected
                          FROM tasks t JOIN task_overview o USING (task_id)
                          ORDER BY t.task_id""")
    blocks: dict[str, list] = defaultdict(list)
    for r in _rows(con, "SELECT * FROM block_overview ORDER BY task_id, block_index, block_id"):
        blocks[r["task_id"]].append(r)
    metrics: dict[str, list] = defaultdict(list)
    for r in _rows(con, """SELECT task_id, block_id, candidate_key, metric, count(value) n,
                                  median(value) median, min(value) min, max(value) max
                           FROM valid_measurements GROUP BY ALL
                           ORDER BY task_id, block_id, candidate_key, metric"""):
        metrics[r["task_id"]].append(r)
    gates: dict[str, list] = defaultdict(list)
    for r in _rows(con, """SELECT g.*, v.verdict AS verification, v.event_id AS vid
                           FROM gate_verdicts g JOIN verifications v
                             ON v.event_id = g.verification_id
                           ORDER BY g.task_id, g.position, g.gate"""):
        gates[r["task_id"]].append(r)
    decisions = _rows(con, "SELECT * FROM decisions ORDER BY position")
    handoffs: dict[str, list] = defaultdict(list)
    for r in _rows(con, "SELECT * FROM handoffs ORDER BY position"):
        handoffs[r["task_id"]].append(r)
    points = _rows(con, "SELECT * FROM points ORDER BY point_hash")
    profiles = _rows(con, "SELECT * FROM runtime_profiles ORDER BY service, rev")
    task_positions = dict(con.execute(
        "SELECT task_id, max(position) FROM events WHERE task_id IS NOT NULL "
        "GROUP BY task_id").fetchall())
    ev_ids: set[str] = {e for d in decisions for e in d["evidence"] or []}
    events_by_id: dict[str, tuple[str, int]] = {}
    if ev_ids:
        for eid, typ, p in con.execute(
                "SELECT event_id, type, position FROM events WHERE event_id IN "
                "(SELECT unnest($1))", [sorted(ev_ids)]).fetchall():
            events_by_id[eid] = (typ, p)
    steps: dict[str, list] = defaultdict(list)
    for tid, bid, raw in con.execute(
            """SELECT task_id, block_id, CAST(json_extract(payload, '$.steps') AS VARCHAR)
               FROM events WHERE type = 'VerificationRecorded' AND task_id IS NOT NULL
               QUALIFY row_number() OVER (PARTITION BY task_id, block_id
                                          ORDER BY position DESC) = 1
               ORDER BY task_id, position""").fetchall():
        for x in orjson.loads(raw) if raw else []:
            steps[tid].append({"block_id": bid, "step": x.get("name"), "kind": x.get("kind"),
                               "outcome": x.get("outcome"), "detail": x.get("detail", "")})
    reviews: dict[str, list] = defaultdict(list)
    for tid, bid, raw in con.execute(
            """SELECT task_id, block_id, payload FROM events
               WHERE type = 'ReviewRecorded' AND task_id IS NOT NULL
               ORDER BY position""").fetchall():
        x = orjson.loads(raw) if raw else {}
        reviews[tid].append({"block_id": bid, "tier": x.get("tier"), "model": x.get("model"),
                             "family": x.get("family"), "verdict": x.get("verdict"),
                             "reasons": list(x.get("reasons") or [])})
    return Snapshot(pos, tasks, dict(blocks), dict(metrics), dict(gates), decisions,
                    dict(handoffs), points, profiles, task_positions, events_by_id,
                    dict(steps), dict(reviews))
