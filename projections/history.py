"""A deployment point's history: its primary metric block after block, across runtime profile
revisions and code snapshots.

Contract:
- A *series* is every measured (task, block) at one deployment point with its runtime
  profile's revision left out (model, model revision, scenario, architecture, parallelism,
  profile service, accelerator and count: `SERIES_DIMS`), so the revisions of a profile, and
  the code snapshots measured under them, line up in one series.
- Its metric is the primary one: the metric of the first gate (with a metric and a bound) of
  most of its tasks' contracts (ties: by name), else `output_throughput` when measured, else
  the metric most runs measured. Its direction (higher or lower is better) is that gate's.
- Each point is one block: the median of the metric over its valid runs, when it was first
  measured (UTC), its profile(s) and code snapshot(s), its candidate and the task's latest
  decision on it (accepted, rejected; else baseline for the empty candidate, else unjudged).
  Points are in ledger order; series by their first measurement.
- Reads the index only; the same index gives the same series.
"""

from __future__ import annotations

import statistics
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .comparison import first_gate
from .queries import valid_runs

if TYPE_CHECKING:
    import duckdb

SERIES_DIMS = ["model", "model_revision", "scenario", "architecture", "parallelism", "service",
               "accelerator", "accelerator_count"]
FALLBACK_METRIC = "output_throughput"


def _primary(firsts: list[tuple[str | None, str | None]]) -> tuple[str | None, str | None]:
    """(metric, direction) of the first bounded gate most contracts start with."""
    counted = Counter(g for g in firsts if g[0] is not None)
    if not counted:
        return None, None
    (metric, way), _ = min(counted.items(), key=lambda kv: (-kv[1], kv[0]))
    return metric, way


def _values(con: duckdb.DuckDBPyConnection, runs: str, metric: str, tasks: list[str]
            ) -> dict[tuple[str, str], list[float]]:
    """(task, block) -> the values of `metric` in these tasks' runs."""
    out: dict[tuple[str, str], list[float]] = {}
    for tid, bid, v in con.execute(
            f"SELECT task_id, block_id, metrics[?] FROM {runs} "
            "WHERE task_id IN (SELECT unnest(?)) ORDER BY position", [metric, tasks]).fetchall():
        if v is not None:
            out.setdefault((tid, bid), []).append(float(v))
    return out


def history(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Every series (see the module's contract): {key: {dimension: value}, metric,
    direction, tasks, points: [{task_id, block_id, at, position, runtime_profiles,
    repo_snapshots, candidate, median, n, verdict, decided_position}]}."""
    runs = valid_runs(con)
    firsts = {t: first_gate(d) for t, d in con.execute(
        "SELECT task_id, CAST(definition AS VARCHAR) FROM tasks").fetchall()}
    # Only the metrics a series can plot travel out of DuckDB (a run has ~40).
    wanted = sorted({m for m, _ in firsts.values() if m} | {FALLBACK_METRIC})
    dims = ", ".join(f"r.{d}" for d in SERIES_DIMS)
    rows = con.execute(
        f"""SELECT {dims}, r.task_id, r.block_id, r.candidate_key, r.runtime_profile,
                   r.repo_snapshot, epoch(r.occurred_at), r.position,
                   list_filter(map_entries(r.metrics), lambda e: list_contains(?, e.key))
            FROM {runs} r WHERE r.task_id IS NOT NULL
            ORDER BY r.position""", [wanted]).fetchall()
    nd = len(SERIES_DIMS)
    decided = {(t, b): (k, p) for t, b, k, p in con.execute(
        "SELECT task_id, block_id, kind, position FROM decisions WHERE block_id IS NOT NULL "
        "QUALIFY row_number() OVER (PARTITION BY task_id, block_id ORDER BY position DESC) = 1"
    ).fetchall()}
    series: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = tuple(r[:nd])
        tid, bid, cand, rp, snap, at, pos, entries = r[nd:]
        s = series.setdefault(key, {"key": dict(zip(SERIES_DIMS, key, strict=True)),
                                    "blocks": {}})
        b = s["blocks"].setdefault((tid, bid), {
            "task_id": tid, "block_id": bid, "at": at, "position": pos, "candidate": cand,
            "runtime_profiles": [], "repo_snapshots": [], "runs": []})
        for field, v in (("runtime_profiles", rp), ("repo_snapshots", snap)):
            if v is not None and v not in b[field]:
                b[field].append(v)
        b["runs"].append({e["key"]: e["value"] for e in entries or []})
    out = []
    for s in series.values():
        blocks = list(s.pop("blocks").values())
        tasks = sorted({b["task_id"] for b in blocks})
        metric, way = _primary([firsts.get(t, (None, None)) for t in tasks])
        measured: Counter[str] = Counter(m for b in blocks for run in b["runs"] for m in run)
        if metric is None or not measured[metric]:
            metric, way = (FALLBACK_METRIC, "higher") if measured[FALLBACK_METRIC] else (
                None, None)
        if metric is not None:
            values = {(b["task_id"], b["block_id"]): [float(run[metric]) for run in b["runs"]
                                                      if metric in run] for b in blocks}
        else:  # none of the wanted metrics: the one most of the series' runs measured
            counts = con.execute(
                f"SELECT kv.key, count(*) FROM (SELECT unnest(map_entries(metrics)) kv "
                f"FROM {runs} WHERE task_id IN (SELECT unnest(?))) GROUP BY 1",
                [tasks]).fetchall()
            if not counts:
                continue
            metric = min(counts, key=lambda kv: (-kv[1], kv[0]))[0]
            values = _values(con, runs, metric, tasks)
        points = []
        for b in blocks:
            del b["runs"]
            vals = values.get((b["task_id"], b["block_id"]), [])
            if not vals:
                continue
            kind, decided_at = decided.get((b["task_id"], b["block_id"]), (None, None))
            verdict = (kind if kind in ("accepted", "rejected")
                       else "baseline" if b["candidate"] in (None, "{}") else "unjudged")
            at = datetime.fromtimestamp(b["at"], UTC).isoformat() if b["at"] is not None \
                else None
            points.append({**b, "at": at, "median": statistics.median(vals), "n": len(vals),
                           "verdict": verdict, "decided_position": decided_at})
        if points:
            out.append({**s, "metric": metric, "direction": way, "tasks": tasks,
                        "points": points})
    return sorted(out, key=lambda s: s["points"][0]["position"])


__all__ = ["SERIES_DIMS", "history"]
