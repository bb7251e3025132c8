"""Two subjects side by side, in the order people read them: what differed, the gated metrics
(each side's median with its confidence interval, the delta as a difference and a ratio, which
side is better), the other metrics, and the latency distributions (TTFT, ITL, E2E) of the
requests both sides measured.

Contract:
- `comparison(con, a, b, read)` takes an open index connection and `read(digest) -> bytes`
  (the artifact store's `get`); it writes nothing. It extends `queries.compare` (whose keys it
  keeps: `differing_dimensions`, `same_dimensions`, `metrics`, `gates`) with `gated`,
  `other_metrics` and `latency`.
- Gated metrics: the metrics named by a gate of the contract of a task either side's
  measurements come from, or by a gate verdict of either side's latest verifications (the
  point's SLO gates). A gate's `at_least` says higher is better, `at_most` lower; a metric
  gated both ways, or only by a stability gate, has no better side (None).
- Confidence intervals: the seeded percentile bootstrap of the median over the side's valid
  runs (the gates' method: 2000 resamples, 95 %, seed 0); the ratio's interval resamples both
  sides. `beyond_noise`: the ratio's interval excludes 1. One run gives an interval of width 0.
- Latency distributions come from the per-request records each run stored as its artifact
  (forge's bench records, one JSON object a request; or a `sglang.bench_serving` result line
  with its per-request details): successful, measured (not warm-up) requests, in ms. A run
  without such records is listed under `latency.missing` with the reason; nothing is made up.
  A side reads at most MAX_RUNS_READ runs' records.
- Numbers that are not finite come out as None, as in `queries.compare`.
- Accuracy items (`accuracy`): per accuracy gate (a loop run's `meta.accuracy[<gate>]`) or
  `forge eval accuracy` task (`meta.items`, keyed `eval:<task>`) that both sides recorded,
  the items that changed between the side's first run holding it and the other's
  (`accuracy_items.changed_items`: lost, gained, unchanged, only on one side, accuracies),
  and whether both read the same documents (their items digests); empty when neither side
  has per-item results.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ..ledger.bootstrap import bootstrap_ci as _bootstrap
from ..ledger.errors import ArtifactIntegrityError, LedgerError, NotFoundError
from .accuracy_items import changed_items, items_of
from .index.session import open_index
from .queries import Subject, compare, resolve, valid_runs

if TYPE_CHECKING:
    import duckdb

    from ..ledger.workspace import Workspace

Read = Callable[[str], bytes]

LATENCIES = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
MAX_RUNS_READ = 64  # runs whose records one side reads (a task compares a block: a few)
CDF_POINTS = 201  # a distribution's CDF is given at most at this many points
CONFIDENCE, RESAMPLES, SEED = 0.95, 2000, 0


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def bootstrap_ci(samples: Sequence[float], baseline: Sequence[float] | None = None
                 ) -> tuple[float | None, float | None]:
    """The gates' interval (ledger/bootstrap.py) of median(samples), or of median(samples) /
    median(baseline) when a baseline is given; (None, None) without samples or where it is
    not a finite number."""
    if not samples or (baseline is not None and not baseline):
        return None, None
    lo, hi = _bootstrap(samples, baseline=baseline, confidence=CONFIDENCE,
                        iterations=RESAMPLES, seed=SEED)
    return _finite(lo), _finite(hi)


# --- reads ---------------------------------------------------------------------------------


def _samples(con: duckdb.DuckDBPyConnection, s: Subject) -> dict[str, list[float]]:
    rows = con.execute(
        f"SELECT kv.key, list(kv.value ORDER BY position) FROM "
        f"(SELECT position, unnest(map_entries(metrics)) kv FROM {s.runs} WHERE {s.where}) "
        "GROUP BY 1", s.params).fetchall()
    return {m: [float(v) for v in vs if v is not None] for m, vs in rows}


def _contract_gates(con: duckdb.DuckDBPyConnection, tasks: Sequence[str]
                    ) -> list[dict[str, Any]]:
    if not tasks:
        return []
    out: list[dict[str, Any]] = []
    for (raw,) in con.execute("SELECT CAST(definition AS VARCHAR) FROM tasks "
                              "WHERE task_id IN (SELECT unnest($1)) ORDER BY task_id",
                              [list(tasks)]).fetchall():
        d = orjson.loads(raw) if raw else {}
        gates = (d.get("contract") or {}).get("gates") if isinstance(d, dict) else None
        out += [g for g in gates or [] if isinstance(g, dict) and g.get("metric")]
    return out


def _verdict_gates(con: duckdb.DuckDBPyConnection, gates: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """The stored gate results (name, metric, direction) behind `queries.compare`'s rows."""
    keys = {(g["task_id"], g["block_id"]) for g in gates if g.get("gate")}
    if not keys:
        return []
    rows = con.execute(
        """SELECT g.task_id, g.block_id, CAST(g.detail AS VARCHAR) FROM gate_verdicts g
           WHERE g.metric IS NOT NULL AND g.task_id IN (SELECT unnest($1))
             AND g.position = (SELECT max(v.position) FROM verifications v
                               WHERE v.task_id = g.task_id
                                 AND v.block_id IS NOT DISTINCT FROM g.block_id)""",
        [sorted({k[0] for k in keys})]).fetchall()
    rows = [(r[2],) for r in rows if (r[0], r[1]) in keys]
    return [orjson.loads(r[0]) for r in rows if r[0]]


def _runs(con: duckdb.DuckDBPyConnection, s: Subject
          ) -> list[tuple[str, str, str | None, str | None]]:
    """(run id, source, artifact digest, task id) of the side's valid runs, in ledger
    order."""
    rows = con.execute(f"SELECT position, run_id, source, task_id FROM {s.runs} "
                       f"WHERE {s.where} ORDER BY position", s.params).fetchall()
    if not rows:
        return []
    pos = [r[0] for r in rows]
    # The digest is in the payload only; the events by position, their range first (zone maps
    # skip the rest of the table: ~4x faster than a join on a 30k-event index).
    digests = dict(con.execute(
        "SELECT position, json_extract_string(payload, '$.artifact_digest') FROM events "
        "WHERE position BETWEEN ? AND ? AND list_contains(?, position)",
        [pos[0], pos[-1], pos]).fetchall())
    return [(run_id, source, digests.get(p), tid) for p, run_id, source, tid in rows]


# --- per-request records -------------------------------------------------------------------


def _num(v: Any) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def request_latencies(data: bytes, run_id: str) -> tuple[dict[str, list[float]], str | None]:
    """A run's per-request latencies in ms ({ttft_ms, itl_ms, e2e_ms}: one value a request;
    ITL one a token gap) from its records artifact, and why a kind is missing (None when the
    records gave every kind). Forge's records: one JSON object a request (`ttft`, `itl`, `e2e`
    in seconds; `success`, `warmup`). A `sglang.bench_serving` file: the result line the run
    id names (`file:line`), its `ttfts` and `itls` (no per-request E2E is stored there)."""
    out: dict[str, list[float]] = {k: [] for k, _ in LATENCIES}
    lines = data.splitlines()
    first = _object(lines[0]) if lines else None
    if first is not None and "ttfts" in first:
        _, _, no = run_id.rpartition(":")
        line = _object(lines[int(no) - 1]) if no.isdigit() and 0 < int(no) <= len(lines) \
            else None
        if line is None or not isinstance(line.get("ttfts"), list):
            return out, f"no bench_serving result line {no or '?'} with per-request details"
        errors, itls = _list(line.get("errors")), _list(line.get("itls"))
        for i, t in enumerate(line["ttfts"]):
            if i < len(errors) and errors[i]:
                continue
            if (v := _num(t)) is not None:
                out["ttft_ms"].append(v * 1e3)
            gaps = _list(itls[i]) if i < len(itls) else []
            out["itl_ms"] += [g * 1e3 for x in gaps if (g := _num(x)) is not None]
        if not out["ttft_ms"]:
            return out, "the bench_serving line lists no successful request"
        return out, "bench_serving stores no per-request E2E latency"
    seen = False
    for raw in lines:
        r = _object(raw)
        if r is None or "ttft" not in r:
            continue
        seen = True
        if not r.get("success") or r.get("warmup"):
            continue
        if (v := _num(r.get("ttft"))) is not None:
            out["ttft_ms"].append(v * 1e3)
        if (v := _num(r.get("e2e", r.get("latency")))) is not None:
            out["e2e_ms"].append(v * 1e3)
        gaps = _list(r.get("itl"))
        out["itl_ms"] += [g * 1e3 for x in gaps if (g := _num(x)) is not None]
    if not seen:
        return out, "its artifact holds no per-request latency records"
    if not out["ttft_ms"]:
        return out, "no successful measured request in its records"
    return out, None


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _object(raw: bytes) -> dict[str, Any] | None:
    try:
        v = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # bench_serving writes Python's JSON: `"request_rate": Infinity`
            v = json.loads(raw)
        except ValueError:
            return None
    return v if isinstance(v, dict) else None


def distribution(values: Iterable[float]) -> dict[str, Any]:
    """n, mean, p50, p90, p99 and the empirical CDF as [value, fraction ≤ value] points (every
    value up to CDF_POINTS values, else CDF_POINTS evenly spaced quantiles)."""
    xs = sorted(v for v in values if math.isfinite(v))
    n = len(xs)
    if not n:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "cdf": []}

    def q(p: float) -> float:  # the inverted CDF: the smallest value with fraction ≥ p
        return xs[min(n - 1, max(0, math.ceil(p * n) - 1))]

    if n <= CDF_POINTS:
        cdf = [[x, (i + 1) / n] for i, x in enumerate(xs)]
    else:
        cdf = [[q(k / (CDF_POINTS - 1)), k / (CDF_POINTS - 1)] for k in range(1, CDF_POINTS)]
    return {"n": n, "mean": _finite(statistics.fmean(xs)), "p50": q(0.5), "p90": q(0.9),
            "p99": q(0.99), "cdf": cdf}


def _latency_side(runs: Sequence[tuple[str, str, str | None, str | None]], read: Read
                  ) -> tuple[dict[str, list[float]], list[dict[str, str]], int]:
    pooled: dict[str, list[float]] = {k: [] for k, _ in LATENCIES}
    missing: list[dict[str, str]] = []
    with_records = 0
    for run_id, source, digest, _ in runs[:MAX_RUNS_READ]:
        if not digest:
            missing.append({"run_id": run_id, "source": source,
                            "why": "the run stored no records artifact"})
            continue
        try:
            data = read(digest)
        except (LedgerError, OSError) as e:  # not found, corrupt, unreadable
            # Said without the store's path: the reason is shown on the journal's pages.
            why = ("its artifact is corrupt (its bytes no longer match its digest)"
                   if isinstance(e, ArtifactIntegrityError)
                   else "its artifact is not in the artifact store"
                   if isinstance(e, NotFoundError)
                   else f"its artifact cannot be read ({type(e).__name__})")
            missing.append({"run_id": run_id, "source": source, "why": why})
            continue
        got, gap = request_latencies(data, run_id)
        if got["ttft_ms"]:
            with_records += 1
        if gap is not None:
            missing.append({"run_id": run_id, "source": source, "why": gap})
        for k in pooled:
            pooled[k] += got[k]
    if len(runs) > MAX_RUNS_READ:
        missing.append({"run_id": f"{len(runs) - MAX_RUNS_READ} more runs", "source": "",
                        "why": f"only the first {MAX_RUNS_READ} runs' records are read"})
    return pooled, missing, with_records


# --- accuracy items --------------------------------------------------------------------------


def _accuracy_side(con: duckdb.DuckDBPyConnection, s: Subject
                   ) -> dict[str, tuple[dict[Any, bool], str | None]]:
    """{gate or `eval:<task>`: (items, items digest)} from the side's first run holding it."""
    pos = [r[0] for r in con.execute(f"SELECT position FROM {s.runs} WHERE {s.where} "
                                     "ORDER BY position", s.params).fetchall()]
    if not pos:
        return {}
    rows = con.execute(
        "SELECT position, json_extract_string(payload, '$.meta') FROM events "
        "WHERE position BETWEEN ? AND ? AND list_contains(?, position) ORDER BY position",
        [pos[0], pos[-1], pos]).fetchall()
    out: dict[str, tuple[dict[Any, bool], str | None]] = {}
    for _, raw in rows:
        meta = _object(raw.encode()) if raw else None
        if not meta:
            continue
        found: list[tuple[str, dict[str, Any], str | None, str | None]] = []
        if meta.get("items") and meta.get("task"):  # forge eval accuracy
            found.append((f"eval:{meta['task']}", {"items": meta["items"]}, None,
                          (meta.get("dataset") or {}).get("items_digest")))
        for gate, one in (meta.get("accuracy") or {}).items():
            if isinstance(one, dict) and one.get("items") and not one.get("error"):
                found.append((str(gate), {"accuracy": {str(gate): one}}, str(gate),
                              one.get("items_digest")))
        for key, m, gate, digest in found:
            if key in out:
                continue
            try:
                out[key] = (items_of(m, gate), digest)
            except (ValueError, TypeError):  # a malformed record: no items for this key
                continue
    return out


def accuracy_changes(con: duckdb.DuckDBPyConnection, a: Subject, b: Subject
                     ) -> list[dict[str, Any]]:
    """Per gate both sides recorded items for: which items changed (module contract)."""
    sa, sb = _accuracy_side(con, a), _accuracy_side(con, b)
    rows = []
    for key in sorted(set(sa) & set(sb)):
        (ia, da), (ib, db) = sa[key], sb[key]
        rows.append({"gate": key, **changed_items(ia, ib), "items_digest_a": da,
                     "items_digest_b": db,
                     "same_documents": None if None in (da, db) else da == db})
    return rows


# --- the comparison ------------------------------------------------------------------------


def _direction(gates: Iterable[dict[str, Any]]) -> str | None:
    ways = {"higher" if g.get("at_least") is not None or g.get("direction") == "at_least"
            else "lower" if g.get("at_most") is not None or g.get("direction") == "at_most"
            else None for g in gates}
    ways.discard(None)
    return ways.pop() if len(ways) == 1 else None


def _row(metric: str, xa: list[float], xb: list[float], direction: str | None
         ) -> dict[str, Any]:
    ma = _finite(statistics.median(xa)) if xa else None
    mb = _finite(statistics.median(xb)) if xb else None
    row: dict[str, Any] = {"metric": metric, "a": ma, "b": mb, "a_n": len(xa), "b_n": len(xb),
                           "a_ci": list(bootstrap_ci(xa)), "b_ci": list(bootstrap_ci(xb)),
                           "delta": None, "delta_pct": None, "ratio": None,
                           "ratio_ci": [None, None], "direction": direction, "better": None,
                           "beyond_noise": None}
    if ma is None or mb is None:
        return row
    row["delta"] = _finite(mb - ma)
    if ma:
        if row["delta"] is not None:
            row["delta_pct"] = _finite(100.0 * row["delta"] / abs(ma))
        row["ratio"] = _finite(mb / ma)
        lo, hi = bootstrap_ci(xb, xa)
        row["ratio_ci"] = [lo, hi]
        if lo is not None and hi is not None:
            row["beyond_noise"] = (lo > 1 or hi < 1) if ma > 0 else None
    if direction is not None and row["delta"] is not None:
        up = row["delta"] > 0
        row["better"] = ("same" if row["delta"] == 0
                         else "b" if up == (direction == "higher") else "a")
    return row


def comparison(con: duckdb.DuckDBPyConnection, a: str, b: str, read: Read) -> dict[str, Any]:
    """`queries.compare` of `a` and `b` with the gated metrics first (CI, delta, ratio,
    better side), the other metrics after, and the latency distributions (see the module's
    contract)."""
    base = compare(con, a, b)
    runs = valid_runs(con)
    sides = {"a": resolve(con, a, runs), "b": resolve(con, b, runs)}
    samples = {k: _samples(con, s) for k, s in sides.items()}
    runs_of = {k: _runs(con, s) for k, s in sides.items()}
    gate_defs = (_contract_gates(con, sorted({r[3] for rs in runs_of.values() for r in rs
                                              if r[3] is not None}))
                 + _verdict_gates(con, base["gates"]["a"] + base["gates"]["b"]))
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for g in gate_defs:
        by_metric.setdefault(str(g["metric"]), []).append(g)
    verdicts = {side: {(g["metric"], g["gate"]): g["verdict"] for g in base["gates"][side]
                       if g.get("metric")} for side in ("a", "b")}
    gated, others = [], []
    for m in sorted(set(samples["a"]) | set(samples["b"]) | set(by_metric),
                    key=lambda m: (m not in by_metric, m)):
        row = _row(m, samples["a"].get(m, []), samples["b"].get(m, []),
                   _direction(by_metric.get(m, [])))
        if m in by_metric:
            names = list(dict.fromkeys(str(g.get("name")) for g in by_metric[m]))
            row["gates"] = names
            row["verdicts"] = {side: {n: v for (mm, n), v in verdicts[side].items() if mm == m}
                               for side in ("a", "b")}
            gated.append(row)
        else:
            others.append(row)
    latency: dict[str, Any] = {"missing": {}, "runs": {}}
    pooled = {}
    for side, rs in runs_of.items():
        pooled[side], latency["missing"][side], n = _latency_side(rs, read)
        latency["runs"][side] = {"runs": len(rs), "with_records": n}
    for key, _ in LATENCIES:
        latency[key] = {side: distribution(pooled[side][key]) for side in ("a", "b")}
    return {**base, "gated": gated, "other_metrics": others, "latency": latency,
            "accuracy": accuracy_changes(con, sides["a"], sides["b"])}


def task_pairs(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """For each task with two measured blocks: its baseline block (the first measured block of
    the empty candidate, else its first measured block) and the block to hold against it (the
    block of its latest acceptance, else its best other block by the primary metric: the first
    bounded gate's, in its direction, else output throughput, higher), in task order. {task_id,
    a, b, b_is: accepted | best}."""
    runs = valid_runs(con)
    defs = dict(con.execute("SELECT task_id, CAST(definition AS VARCHAR) FROM tasks "
                            ).fetchall())
    firsts = {t: first_gate(d) for t, d in defs.items()}
    # Only the metrics a choice can rest on travel out of DuckDB (a run has ~40).
    wanted = sorted({m for m, _ in firsts.values() if m} | {"output_throughput"})
    blocks: dict[str, list[tuple[str, str | None, dict[str, Any]]]] = {}
    for tid, bid, cand, entries in con.execute(
            f"SELECT task_id, block_id, candidate_key, list_filter(map_entries(metrics), "
            f"lambda e: list_contains(?, e.key)) FROM {runs} "
            "WHERE task_id IS NOT NULL AND block_id IS NOT NULL ORDER BY position",
            [wanted]).fetchall():
        got = blocks.setdefault(tid, [])
        row = next((x for x in got if x[0] == bid), None)
        if row is None:
            row = (bid, cand, {})
            got.append(row)
        for e in entries or []:
            row[2].setdefault(e["key"], []).append(float(e["value"]))
    accepted = dict(con.execute(
        "SELECT task_id, block_id FROM decisions WHERE kind = 'accepted' "
        "AND block_id IS NOT NULL QUALIFY row_number() OVER "
        "(PARTITION BY task_id ORDER BY position DESC) = 1").fetchall())
    out = []
    for tid in sorted(blocks):
        bs = blocks[tid]
        if len(bs) < 2:
            continue
        base = next((b for b in bs if b[1] in (None, "{}")), bs[0])
        others = [b for b in bs if b[0] != base[0]]
        acc = accepted.get(tid)
        if acc is not None and any(b[0] == acc for b in others):
            out.append({"task_id": tid, "a": base[0], "b": acc, "b_is": "accepted"})
            continue
        metric, way = firsts.get(tid, (None, None))
        if metric is None or not any(metric in b[2] for b in others):
            metric, way = "output_throughput", "higher"
        scored = [(statistics.median(b[2][metric]), b[0]) for b in others if b[2].get(metric)]
        if not scored:
            continue
        best = (max if way == "higher" else min)(scored, key=lambda x: x[0])
        out.append({"task_id": tid, "a": base[0], "b": best[1], "b_is": "best"})
    return out


def first_gate(raw: str | None) -> tuple[str | None, str | None]:
    """(metric, "higher" | "lower") of the first gate with a metric and a bound in a task
    definition (JSON text), or (None, None)."""
    d = orjson.loads(raw) if raw else {}
    gates = (d.get("contract") or {}).get("gates") if isinstance(d, dict) else None
    for g in gates or []:
        if isinstance(g, dict) and g.get("metric"):
            way = _direction([g])
            if way is not None:
                return str(g["metric"]), way
    return None, None


def comparison_ws(ws: Workspace, a: str, b: str) -> dict[str, Any]:
    """`comparison` on the workspace's index (caught up) and artifact store."""
    with open_index(ws) as s:
        return comparison(s.con, a, b, ws.artifacts.get)


__all__ = ["LATENCIES", "bootstrap_ci", "comparison", "comparison_ws", "distribution",
           "first_gate", "request_latencies", "task_pairs"]
