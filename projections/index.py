"""The multi-dimensional index: a catch-up projector from the ledger's global log into DuckDB.

Contracts:
- Exactly once. Each batch of notifications becomes rows in every table plus the new
  `tracking` position, written in ONE DuckDB transaction: a crash or an error before commit
  leaves rows and tracking as they were; the next catch-up resumes from the tracked position.
- Every event is kept in `events` (bookkeeping markers excepted); events this projector does
  not project (other issues' types, types newer than this code) only advance the position.
  An event the ledger cannot decode (unknown type, corrupt JSON, a payload that fails
  validation such as `null` for a metric) is recorded in `skipped` with its position and the
  reason, and left out of every typed table (a JSON object stays in `events`, raw), in the
  same transaction: the position advances past it, it is read exactly once, and no bad row
  can stop the catch-up.
- Deterministic: rows depend on the ledger only (no ingestion times, no batch-dependent ids),
  so `rebuild` and incremental catch-up give the same `fingerprint`.
- One process at a time: `open_index` holds a file lock (`index.duckdb.lock`) around
  catch-up and the caller's queries, because DuckDB allows one read-write process per file.

Dimensions are read defensively from event payloads (plain mappings): a missing one is NULL.
"""

from __future__ import annotations

import array
import gc
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
from filelock import FileLock, Timeout

from ..ledger import codec
from ..ledger.clock import digest
from ..ledger.errors import LedgerError
from ..ledger.store import BOOKKEEPING_TYPES
from .errors import ProjectionError

PROJECTION = "index"
# Bump when tables or their meaning change: an index of another version is rebuilt.
INDEX_SCHEMA_VERSION = 3  # 3: table `skipped` (undecodable events)
SCHEMA_KEY = "index-schema"
INDEX_NAME = "index.duckdb"
LOCK_TIMEOUT_S = 120.0
# Notifications per transaction. Large: a table's insert of a full row group (122,880 rows)
# is written straight to the database file instead of the WAL, and each commit has a fixed
# cost. Memory stays bounded by ~3 batches (one read, one queued, one being written).
DEFAULT_BATCH = 200_000
# During catch-up the WAL may grow this far before DuckDB checkpoints inside a COMMIT;
# one CHECKPOINT at the end instead of one per batch (committed batches in the WAL are
# durable and replayed on open, so exactly-once holds either way).
CATCH_UP_CHECKPOINT_THRESHOLD = "4GB"

# --- schema -----------------------------------------------------------------------------

# Deployment-point dimensions, in the order they appear on tasks, measurements and decisions.
DIMS: list[tuple[str, str]] = [
    ("model", "VARCHAR"),
    ("model_revision", "VARCHAR"),
    ("task_type", "VARCHAR"),
    ("modality", "VARCHAR"),
    ("input_len", "BIGINT"),
    ("output_len", "BIGINT"),
    ("concurrency", "BIGINT"),
    ("request_rate", "DOUBLE"),
    ("scenario", "VARCHAR"),
    ("architecture", "VARCHAR"),
    ("tp", "BIGINT"),
    ("pp", "BIGINT"),
    ("dp", "BIGINT"),
    ("ep", "BIGINT"),
    ("parallelism", "VARCHAR"),
    ("service", "VARCHAR"),
    ("rev", "BIGINT"),
    ("runtime_profile", "VARCHAR"),
    ("engine", "VARCHAR"),
    ("accelerator_vendor", "VARCHAR"),
    ("accelerator", "VARCHAR"),
    ("accelerator_count", "BIGINT"),
    ("point_hash", "VARCHAR"),
]
DIM_NAMES = [d for d, _ in DIMS]
_POINT_HASH_AT = DIM_NAMES.index("point_hash")
_DIM_SQL = ",\n  ".join(f"{n} {t}" for n, t in DIMS)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS tracking(projection VARCHAR PRIMARY KEY, position BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS events(
  position BIGINT, stream VARCHAR, version BIGINT, type VARCHAR, schema_version BIGINT,
  event_id VARCHAR, occurred_at TIMESTAMPTZ, actor_kind VARCHAR, actor_name VARCHAR,
  actor_model VARCHAR, task_id VARCHAR, block_id VARCHAR, command_id VARCHAR,
  causation_id VARCHAR,
  -- JSON text (VARCHAR: no re-validation on insert). zstd: payloads repeat their keys, so
  -- it stores them ~5x smaller than the default choice and costs half the insert time.
  payload VARCHAR USING COMPRESSION zstd);
CREATE TABLE IF NOT EXISTS points(
  name VARCHAR, position BIGINT, pinned_at TIMESTAMPTZ, point JSON,
  {_DIM_SQL});
CREATE TABLE IF NOT EXISTS runtime_profiles(
  service VARCHAR, rev BIGINT, profile_hash VARCHAR, previous_hash VARCHAR, engine VARCHAR,
  image VARCHAR, framework VARCHAR, position BIGINT, revised_at TIMESTAMPTZ,
  profile JSON, config JSON, changes JSON);
CREATE TABLE IF NOT EXISTS tasks(
  task_id VARCHAR, title VARCHAR, goal VARCHAR, definition_hash VARCHAR,
  defined_position BIGINT, defined_at TIMESTAMPTZ, last_position BIGINT,
  exit_state VARCHAR, exit_reason VARCHAR, exit_handoff VARCHAR, exited_at TIMESTAMPTZ,
  definition JSON,
  {_DIM_SQL});
CREATE TABLE IF NOT EXISTS loop_blocks(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, block_index BIGINT, sub_goal VARCHAR, model_tier VARCHAR,
  agent_topology VARCHAR, executor VARCHAR, routing JSON, candidate JSON,
  candidate_key VARCHAR);
CREATE TABLE IF NOT EXISTS tool_calls(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, tool VARCHAR, argv VARCHAR[], exit_code BIGINT, duration_s DOUBLE,
  error VARCHAR, repo_digest VARCHAR, stdout_digest VARCHAR, stderr_digest VARCHAR);
CREATE TABLE IF NOT EXISTS measurement_runs(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, run_id VARCHAR, source VARCHAR, repeat BIGINT, success BOOLEAN,
  candidate VARCHAR, candidate_key VARCHAR, repo_snapshot VARCHAR,
  {_DIM_SQL},
  metrics MAP(VARCHAR, DOUBLE));
CREATE TABLE IF NOT EXISTS invalidations(
  position BIGINT, event_id VARCHAR, measurement_event_id VARCHAR, reason VARCHAR);
CREATE TABLE IF NOT EXISTS verifications(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, verdict VARCHAR, passed BOOLEAN, contract_hash VARCHAR,
  point_hash VARCHAR, candidate JSON, candidate_key VARCHAR, gates JSON,
  evidence VARCHAR[]);
CREATE TABLE IF NOT EXISTS gate_verdicts(
  position BIGINT, verification_id VARCHAR, task_id VARCHAR, block_id VARCHAR,
  gate VARCHAR, metric VARCHAR, verdict VARCHAR, observed DOUBLE, threshold DOUBLE,
  baseline DOUBLE, reason VARCHAR, detail JSON);
CREATE TABLE IF NOT EXISTS decisions(
  position BIGINT, decision_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, kind VARCHAR, candidate JSON, candidate_key VARCHAR, reason VARCHAR,
  evidence VARCHAR[], verification_event_id VARCHAR,
  {_DIM_SQL});
-- Stored events the ledger holds but cannot decode (unknown type, corrupt or invalid
-- payload): left out of every other table, recorded here; `forge check` names them too.
CREATE TABLE IF NOT EXISTS skipped(
  position BIGINT, stream VARCHAR, version BIGINT, type VARCHAR, error VARCHAR);
CREATE TABLE IF NOT EXISTS handoffs(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, kind VARCHAR, outcome VARCHAR, state_reached VARCHAR,
  findings VARCHAR[], next_sub_goal VARCHAR);
"""

VIEWS = """
-- One row per metric value (long format) with every dimension: the run rows unnested.
CREATE OR REPLACE VIEW measurements AS
  SELECT * EXCLUDE (metrics, kv), kv.key AS metric, kv.value AS value
  FROM (SELECT *, unnest(map_entries(metrics)) AS kv FROM measurement_runs);
CREATE OR REPLACE VIEW valid_runs AS
  SELECT r.* FROM measurement_runs r
  WHERE r.success AND r.event_id NOT IN (SELECT measurement_event_id FROM invalidations);
CREATE OR REPLACE VIEW valid_measurements AS
  SELECT * EXCLUDE (metrics, kv), kv.key AS metric, kv.value AS value
  FROM (SELECT *, unnest(map_entries(metrics)) AS kv FROM valid_runs);
CREATE OR REPLACE VIEW task_overview AS
  SELECT t.task_id, t.title, t.task_type, t.model, t.accelerator, t.engine,
         t.runtime_profile, t.architecture, t.parallelism, t.scenario, t.point_hash,
         CASE WHEN t.exit_state IS NOT NULL THEN 'exited'
              WHEN b.n > 0 THEN 'running' ELSE 'defined' END AS status,
         t.exit_state, t.exit_reason, coalesce(b.n, 0) AS blocks,
         coalesce(d.accepted, 0) AS accepted, coalesce(d.rejected, 0) AS rejected,
         t.goal
  FROM tasks t
  LEFT JOIN (SELECT task_id, count(*) n FROM loop_blocks GROUP BY ALL) b USING (task_id)
  LEFT JOIN (SELECT task_id, count(*) FILTER (kind = 'accepted') accepted,
                    count(*) FILTER (kind = 'rejected') rejected
             FROM decisions GROUP BY ALL) d USING (task_id);
CREATE OR REPLACE VIEW block_overview AS
  SELECT b.task_id, b.block_id, b.block_index, b.sub_goal, b.model_tier, b.agent_topology,
         b.candidate_key, h.outcome, h.state_reached, h.next_sub_goal,
         v.verdict, coalesce(m.n, 0) AS measurements, coalesce(c.n, 0) AS tool_calls
  FROM loop_blocks b
  LEFT JOIN (SELECT task_id, block_id, arg_max(outcome, position) outcome,
                    arg_max(state_reached, position) state_reached,
                    arg_max(next_sub_goal, position) next_sub_goal
             FROM handoffs WHERE kind = 'block' GROUP BY ALL) h USING (task_id, block_id)
  LEFT JOIN (SELECT task_id, block_id, arg_max(verdict, position) verdict
             FROM verifications GROUP BY ALL) v USING (task_id, block_id)
  LEFT JOIN (SELECT task_id, block_id, count(*) n
             FROM measurement_runs GROUP BY ALL) m USING (task_id, block_id)
  LEFT JOIN (SELECT task_id, block_id, count(*) n FROM tool_calls GROUP BY ALL) c
       USING (task_id, block_id);
CREATE OR REPLACE VIEW metric_summary AS
  SELECT task_id, block_id, candidate_key, model, task_type, accelerator, engine,
         runtime_profile, point_hash, metric, count(*) AS n, median(value) AS median,
         avg(value) AS mean, stddev_samp(value) AS stddev, min(value) AS min,
         max(value) AS max
  FROM valid_measurements GROUP BY ALL;
CREATE OR REPLACE VIEW profile_tradeoff AS
  SELECT runtime_profile, task_id, block_id, candidate_key,
         median(value) FILTER (metric = 'output_throughput') AS output_throughput,
         median(value) FILTER (metric = 'median_ttft_ms') AS median_ttft_ms
  FROM valid_measurements
  WHERE metric IN ('output_throughput', 'median_ttft_ms')
  GROUP BY ALL;
CREATE OR REPLACE VIEW decision_evidence AS
  SELECT d.decision_id, d.task_id, d.kind, e.evidence,
         ev.type AS evidence_type, ev.position AS evidence_position
  FROM decisions d, unnest(d.evidence) AS e(evidence)
  LEFT JOIN events ev ON ev.event_id = e.evidence;
"""

TABLES = ["events", "points", "runtime_profiles", "tasks", "loop_blocks", "tool_calls",
          "measurement_runs", "invalidations", "verifications", "gate_verdicts", "decisions",
          "handoffs", "skipped"]


# --- dimensions -------------------------------------------------------------------------


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    return None


def _str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def point_dims(point: Any) -> dict[str, Any]:
    """Deployment-point dimensions from a point mapping (DESIGN §9 shape); missing → None."""
    dims: dict[str, Any] = dict.fromkeys(DIM_NAMES)
    if not isinstance(point, dict):
        return dims
    model = point.get("model")
    if isinstance(model, str):
        dims["model"] = model
    else:
        dims["model"] = _str(_get(model, "name"))
        dims["model_revision"] = _str(_get(model, "revision"))
    scen = point.get("scenario")
    traffic = _get(scen, "traffic")
    dims["modality"] = _str(_get(scen, "modality"))
    dims["input_len"] = _int(_get(traffic, "input_len"))
    dims["output_len"] = _int(_get(traffic, "output_len"))
    dims["concurrency"] = _int(_get(traffic, "concurrency"))
    dims["request_rate"] = _float(_get(traffic, "request_rate"))
    if any(dims[k] is not None for k in ("modality", "input_len", "output_len", "concurrency")):
        dims["scenario"] = (
            f"{dims['modality'] or '?'} in{dims['input_len'] or '?'}"
            f"/out{dims['output_len'] or '?'} c{dims['concurrency'] or '?'}"
        )
    topo = point.get("topology")
    dims["architecture"] = _str(_get(topo, "architecture"))
    par = _get(topo, "parallelism")
    for k in ("tp", "pp", "dp", "ep"):
        dims[k] = _int(_get(par, k))
    if any(dims[k] is not None for k in ("tp", "pp", "dp", "ep")):
        dims["parallelism"] = "-".join(f"{k}{dims[k] or 1}" for k in ("tp", "pp", "dp", "ep"))
    rp = point.get("runtime_profile")
    dims["service"] = _str(_get(rp, "service"))
    dims["rev"] = _int(_get(rp, "rev"))
    if dims["service"] is not None:
        dims["runtime_profile"] = f"{dims['service']}@{dims['rev'] or '?'}"
    eng = _get(rp, "engine")
    if isinstance(eng, str):
        dims["engine"] = eng
    acc = point.get("accelerator")
    if isinstance(acc, str):
        dims["accelerator"] = acc
    else:
        dims["accelerator_vendor"] = _str(_get(acc, "vendor"))
        dims["accelerator"] = _str(_get(acc, "model"))
        dims["accelerator_count"] = _int(_get(acc, "count"))
    return dims


def profile_engine(profile: Any) -> str | None:
    eng = _get(profile, "engine")
    if isinstance(eng, dict):
        eng = eng.get("kind") or eng.get("name")
    return _str(eng)


def candidate_key(candidate: Any) -> str:
    """A stable text key for a candidate (sorted-keys JSON; '{}' is the baseline)."""
    return orjson.dumps(candidate or {}, option=orjson.OPT_SORT_KEYS).decode()


def _json(v: Any) -> str:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def _repo_snapshot(digests: Any) -> str | None:
    if not isinstance(digests, dict):
        return None
    for k in ("repo_snapshot", "repo", "snapshot", "repos"):
        if k in digests:
            return _str(digests[k])
    for k, v in digests.items():
        if "repo" in k:
            return _str(v)
    return None


def _point_ref(digests: Any) -> str | None:
    if not isinstance(digests, dict):
        return None
    for k in ("point", "point_hash", "deployment_point"):
        if k in digests:
            return _str(digests[k])
    return None


# --- the projector ----------------------------------------------------------------------


class _Rows:
    """Rows for one table in one batch, as tuples in `names` order: handlers append one
    tuple per row; `columns()` transposes them in C (zip) when the batch is written."""

    __slots__ = ("names", "rows", "append")

    def __init__(self, names: list[str]):
        self.names = names
        self.rows: list[tuple] = []
        self.append = self.rows.append

    def columns(self) -> dict[str, Any]:
        if not self.rows:
            return {n: [] for n in self.names}
        return dict(zip(self.names, zip(*self.rows, strict=True), strict=True))

    def __len__(self) -> int:
        return len(self.rows)


# Envelope columns of `events`, extracted from the payload by DuckDB (one parse per row).
_ENVELOPE = [("event_id", "$.event_id"), ("occurred_at", "$.occurred_at"),
             ("actor_kind", "$.actor.kind"), ("actor_name", "$.actor.name"),
             ("actor_model", "$.actor.model"), ("task_id", "$.task_id"),
             ("block_id", "$.block_id"), ("command_id", "$.command_id"),
             ("causation_id", "$.causation_id"), ("schema_version", "$._v")]
_EVENTS_INSERT = (
    "INSERT INTO events BY NAME SELECT position, stream, version, type, payload, "
    + ", ".join(f"j[{i + 1}] AS {name}" for i, (name, _) in enumerate(_ENVELOPE[:-1]))
    + f", coalesce(TRY_CAST(j[{len(_ENVELOPE)}] AS BIGINT), 1) AS schema_version "
    "FROM (SELECT *, json_extract_string(payload, ["
    + ", ".join(f"'{path}'" for _, path in _ENVELOPE) + "]) AS j FROM _batch_events)")
_MEAS_EV_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "run_id",
                 "source", "repeat", "success", "candidate", "candidate_key",
                 "repo_snapshot"]  # + DIM_NAMES, by reference to the batch's distinct dims
_BLOCK_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "block_index",
               "sub_goal", "model_tier", "agent_topology", "executor", "routing", "candidate",
               "candidate_key"]
_TOOL_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "tool", "argv",
              "exit_code", "duration_s", "error", "repo_digest", "stdout_digest",
              "stderr_digest"]
_VERIF_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "verdict",
               "passed", "contract_hash", "point_hash", "candidate", "candidate_key", "gates",
               "evidence"]
_GATE_COLS = ["position", "verification_id", "task_id", "block_id", "gate", "metric",
              "verdict", "observed", "threshold", "baseline", "reason", "detail"]
_DEC_COLS = ["position", "decision_id", "occurred_at", "task_id", "block_id", "kind",
             "candidate", "candidate_key", "reason", "evidence", "verification_event_id",
             *DIM_NAMES]
_HAND_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "kind", "outcome",
              "state_reached", "findings", "next_sub_goal"]


@dataclass
class CatchUpResult:
    events: int  # notifications read (bookkeeping included)
    projected: int  # events written to `events`
    position: int
    seconds: float
    batches: int
    skipped: list[tuple] = field(default_factory=list)  # (position, stream, version, type, error)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


class Projector:
    """Projects notifications into the index. One instance per catch-up run: its caches are
    loaded from the database and thrown away with the run (so a rolled-back batch can never
    leave a stale cache behind)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self.points: dict[str, dict[str, Any]] = {}  # point_hash -> row
        self.point_names: dict[str, str] = {}  # name -> point_hash
        self.profiles: dict[tuple[str, int | None], dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self._task_dims: dict[str, dict[str, Any]] = {}
        self._task_dims_row: dict[str, tuple] = {}
        self._load()

    def _load(self) -> None:
        for row in _dicts(self.con.execute("SELECT * FROM points")):
            self.points[row["point_hash"]] = row
            if row["name"]:
                self.point_names[row["name"]] = row["point_hash"]
        for row in _dicts(self.con.execute("SELECT * FROM runtime_profiles")):
            self.profiles[(row["service"], row["rev"])] = row
        for row in _dicts(self.con.execute("SELECT * FROM tasks")):
            self.tasks[row["task_id"]] = row

    # --- per batch ----------------------------------------------------------------------

    def _reset_batch(self) -> None:
        self.b_events: list[tuple] = []  # the stored rows themselves (payload included)
        self.b_points: dict[str, dict[str, Any]] = {}
        self.b_profiles: dict[tuple[str, int | None], dict[str, Any]] = {}
        self.b_tasks: dict[str, dict[str, Any]] = {}
        self.b_blocks = _Rows(_BLOCK_COLS)
        self.b_tools = _Rows(_TOOL_COLS)
        self.b_meas = _Rows(_MEAS_EV_COLS)
        # Runs share their task's dimensions: each run keeps an index into the batch's
        # distinct dimension tuples, expanded by Arrow's `take` (no per-run Python work).
        self.b_meas_dims: list[int] = []
        self.b_dims_index: dict[tuple, int] = {}
        self.b_metric: list[str] = []
        self.b_value: list[float | None] = []
        self.b_moff: list[int] = []
        self.b_inval = _Rows(["position", "event_id", "measurement_event_id", "reason"])
        self.b_verif = _Rows(_VERIF_COLS)
        self.b_gates = _Rows(_GATE_COLS)
        self.b_dec = _Rows(_DEC_COLS)
        self.b_hand = _Rows(_HAND_COLS)
        self.b_skipped: list[tuple] = []  # (position, stream, version, type, error)

    def project(self, rows: list[tuple]) -> int:
        """Add one batch of stored rows `(position, stream, version, type, state)` (as
        `Ledger.rows` gives them) to the pending rows. Returns events kept.

        Every event is checked as the ledger reads it: a payload of exactly its current
        form passes the codec's generated check (`codec.current_check`, no objects built);
        anything else is decoded in full (upcast, coerced) or, when the ledger cannot decode
        it (unknown type, corrupt JSON, invalid fields), left out of every table and recorded
        in `skipped`: the position still advances with the batch, so it is read once. The
        envelope columns of `events` are extracted by DuckDB's vectorized JSON reader at
        insert time (see `write`)."""
        self._reset_batch()
        loads = orjson.loads
        keep = self.b_events.append
        handlers = _HANDLERS
        bookkeeping = BOOKKEEPING_TYPES
        checks: dict[str, Callable[[dict[str, Any]], bool]] = {}
        for row in rows:
            topic = row[3]
            if topic in bookkeeping:
                continue
            check = checks.get(topic)
            if check is None:
                check = checks[topic] = codec.current_check(topic) or codec.never
            pos, state = row[0], row[4]
            try:
                d = loads(state)
            except orjson.JSONDecodeError:
                d = None
            if type(d) is not dict or not check(d):
                # Not exactly current: the ledger's own codec upcasts, coerces, or refuses.
                try:
                    ev_obj = codec.decode(str(row[1]), row[2], topic, bytes(state))
                except LedgerError as e:
                    self.b_skipped.append((pos, str(row[1]), row[2], topic, str(e)))
                    if type(d) is dict:
                        keep(row)  # a JSON object (e.g. a newer type): kept raw in `events`
                    continue
                d = ev_obj.model_dump(mode="json")
            keep(row)
            h = handlers.get(topic)
            if h is not None:
                h(self, pos, d)
        return len(self.b_events)

    # --- handlers -----------------------------------------------------------------------

    def _resolve_point(self, ref: Any, point_hash: str | None) -> tuple[dict[str, Any],
                                                                      str | None]:
        """Dimensions for a task's point: pinned by hash, inline mapping, or a pinned name."""
        if point_hash and point_hash in self.points:
            return self._dims_of_point_row(self.points[point_hash]), point_hash
        if isinstance(ref, dict):
            ph = point_hash or digest(ref)
            return point_dims(ref), ph
        if isinstance(ref, str):
            stem = Path(ref).stem if ("/" in ref or ref.endswith((".yaml", ".yml"))) else ref
            for key in (ref, stem):
                if key in self.point_names:
                    ph = self.point_names[key]
                    return self._dims_of_point_row(self.points[ph]), ph
                if key in self.points:
                    return self._dims_of_point_row(self.points[key]), key
        return dict.fromkeys(DIM_NAMES), point_hash

    @staticmethod
    def _dims_of_point_row(row: dict[str, Any]) -> dict[str, Any]:
        dims = {k: row.get(k) for k in DIM_NAMES}
        dims["point_hash"] = row["point_hash"]
        return dims

    def _fill_engine(self, dims: dict[str, Any]) -> dict[str, Any]:
        if dims.get("engine") is None and dims.get("service") is not None:
            prof = self.profiles.get((dims["service"], dims["rev"]))
            if prof is not None:
                dims["engine"] = prof["engine"]
        return dims

    def _on_point(self, pos: int, d: dict[str, Any]) -> None:
        point = d.get("point") or {}
        ph = d.get("point_hash") or digest(point)
        row = point_dims(point)
        row.pop("task_type")
        row.update(point_hash=ph, name=_str(d.get("name")), position=pos,
                   pinned_at=d.get("occurred_at"), point=_json(point))
        self._fill_engine(row)
        self.points[ph] = row
        if row["name"]:
            self.point_names[row["name"]] = ph
        self.b_points[ph] = row
        self._task_dims.clear()
        self._task_dims_row.clear()

    def _on_profile(self, pos: int, d: dict[str, Any]) -> None:
        prof = d.get("profile") or {}
        image = _get(prof, "image")
        fw = _get(prof, "framework")
        row = {
            "service": _str(d.get("service")), "rev": _int(d.get("rev")),
            "profile_hash": d.get("profile_hash"), "previous_hash": d.get("previous_hash"),
            "engine": profile_engine(prof),
            "image": _str(_get(image, "digest") or _get(image, "name")
                          if isinstance(image, dict) else image),
            "framework": (f"{fw.get('kind')} {fw.get('version') or ''}".strip()
                          if isinstance(fw, dict) else _str(fw)),
            "position": pos, "revised_at": d.get("occurred_at"), "profile": _json(prof),
            "config": _json(_get(prof, "config") or {}), "changes": _json(d.get("changes") or {}),
        }
        key = (row["service"], row["rev"])
        self.profiles[key] = row
        self.b_profiles[key] = row
        self._task_dims.clear()
        self._task_dims_row.clear()

    def _on_task_defined(self, pos: int, d: dict[str, Any]) -> None:
        tid = d.get("task_id")
        definition = d.get("definition") or {}
        ref = definition.get("point") if isinstance(definition, dict) else None
        dims, ph = self._resolve_point(ref, d.get("point_hash"))
        dims = self._fill_engine(dict(dims))
        if dims.get("engine") is None and isinstance(definition, dict):
            dims["engine"] = _str(definition.get("engine"))
        dims["point_hash"] = ph
        dims["task_type"] = _str(d.get("task_type"))
        prior = self.tasks.get(tid) or {}
        row = {
            **dims, "task_id": tid, "title": d.get("title"), "goal": d.get("goal"),
            "definition_hash": d.get("definition_hash"),
            "defined_position": prior.get("defined_position") or pos,
            "defined_at": prior.get("defined_at") or d.get("occurred_at"),
            "last_position": pos, "exit_state": None, "exit_reason": None,
            "exit_handoff": None, "exited_at": None, "definition": _json(definition),
        }
        self.tasks[tid] = row
        self.b_tasks[tid] = row
        self._task_dims.pop(tid, None)
        self._task_dims_row.pop(tid, None)

    def _dims(self, tid: str | None) -> dict[str, Any]:
        dims = self._task_dims.get(tid)  # type: ignore[arg-type]
        if dims is None:
            task = self.tasks.get(tid)  # type: ignore[arg-type]
            dims = {k: task.get(k) for k in DIM_NAMES} if task else dict.fromkeys(DIM_NAMES)
            self._fill_engine(dims)
            self._task_dims[tid] = dims  # type: ignore[index]
        return dims

    def _dims_row(self, tid: str | None) -> tuple:
        """The task's dimensions as a tuple in DIM_NAMES order (cached with `_dims`)."""
        row = self._task_dims_row.get(tid)  # type: ignore[arg-type]
        if row is None:
            dims = self._dims(tid)
            row = self._task_dims_row[tid] = tuple(dims.get(n) for n in DIM_NAMES)  # type: ignore[index]
        return row

    def _touch_task(self, tid: str | None, pos: int, **changes: Any) -> None:
        task = self.tasks.get(tid)  # type: ignore[arg-type]
        if task is None:
            return
        task = {**task, **changes, "last_position": pos}
        self.tasks[tid] = task  # type: ignore[index]
        self.b_tasks[tid] = task  # type: ignore[index]

    def _on_exit(self, pos: int, d: dict[str, Any]) -> None:
        self._touch_task(d.get("task_id"), pos, exit_state=d.get("state"),
                         exit_reason=d.get("reason"), exit_handoff=d.get("handoff"),
                         exited_at=d.get("occurred_at"))
        if d.get("handoff"):
            self.b_hand.append((pos, d.get("event_id"), d.get("occurred_at"), d.get("task_id"),
                                d.get("block_id"), "task-exit", d.get("state"),
                                d.get("reason"), [], d.get("handoff")))

    def _on_reopen(self, pos: int, d: dict[str, Any]) -> None:
        self._touch_task(d.get("task_id"), pos, exit_state=None, exit_reason=None,
                         exit_handoff=None, exited_at=None)

    def _on_block(self, pos: int, d: dict[str, Any]) -> None:
        routing = d.get("routing") or {}
        cand = d.get("candidate") or {}
        ckey = candidate_key(cand)
        self.b_blocks.append((
            pos, d.get("event_id"), d.get("occurred_at"), d.get("task_id"),
            d.get("block_id") or f"b{d.get('index')}", _int(d.get("index")),
            d.get("sub_goal"), _str(routing.get("model_tier")),
            _str(routing.get("agent_topology")), _str(routing.get("executor")),
            _json(routing), ckey, ckey))

    def _on_tool(self, pos: int, d: dict[str, Any]) -> None:
        argv = d.get("argv") or []
        get = d.get
        self.b_tools.append((
            pos, get("event_id"), get("occurred_at"), get("task_id"), get("block_id"),
            get("tool"), [a if type(a) is str else str(a) for a in argv],
            _int(get("exit_code")), _float(get("duration_s")), get("error"),
            get("repo_digest"), get("stdout_digest"), get("stderr_digest")))

    def _on_measurement(self, pos: int, d: dict[str, Any]) -> None:
        get = d.get
        tid = get("task_id")
        dims = self._dims_row(tid)
        digests = get("input_digests")
        ref = _point_ref(digests)
        if ref and ref != dims[_POINT_HASH_AT] and ref in self.points:
            pd = self._fill_engine(self._dims_of_point_row(self.points[ref]))
            pd["task_type"] = self._dims(tid).get("task_type")
            dims = tuple(pd.get(n) for n in DIM_NAMES)
        ckey = candidate_key(get("candidate"))
        self.b_meas.append((pos, get("event_id"), get("occurred_at"), tid, get("block_id"),
                            get("run_id"), get("source"), _int(get("repeat")),
                            bool(get("success", True)), ckey, ckey,
                            _repo_snapshot(digests)))
        i = self.b_dims_index.get(dims)
        if i is None:
            i = self.b_dims_index[dims] = len(self.b_dims_index)
        self.b_meas_dims.append(i)
        self.b_moff.append(len(self.b_metric))
        metrics = get("metrics") or {}
        self.b_metric.extend(metrics)
        self.b_value.extend(v if type(v) is float else _float(v) for v in metrics.values())

    def _on_invalidated(self, pos: int, d: dict[str, Any]) -> None:
        self.b_inval.append((pos, d.get("event_id"), _str(d.get("measurement_event_id")),
                             d.get("reason")))

    def _on_verification(self, pos: int, d: dict[str, Any]) -> None:
        cand = d.get("candidate") or {}
        gates = d.get("gates") or []
        vid = d.get("event_id")
        tid, bid = d.get("task_id"), d.get("block_id")
        ckey = candidate_key(cand)
        self.b_verif.append((
            pos, vid, d.get("occurred_at"), tid, bid, d.get("verdict"), d.get("passed"),
            d.get("contract_hash"), d.get("point_hash"), ckey, ckey, _json(gates),
            [str(x) for x in d.get("evidence") or []]))
        for g in gates:
            if not isinstance(g, dict):
                continue
            verdict = g.get("verdict")
            if verdict is None and isinstance(g.get("passed"), bool):
                verdict = "pass" if g["passed"] else "fail"
            self.b_gates.append((
                pos, vid, tid, bid, _str(g.get("name") or g.get("gate")),
                _str(g.get("metric")), _str(verdict),
                _float(_first(g, "observed", "value", "measured", "median")),
                _float(_first(g, "threshold", "at_least", "at_most", "limit")),
                _float(_first(g, "baseline", "baseline_median")),
                _str(_first(g, "reason", "why", "detail")), _json(g)))

    def _on_decision(self, pos: int, d: dict[str, Any], kind: str) -> None:
        tid = d.get("task_id")
        cand = d.get("candidate") or {}
        reason = d.get("reason") if kind == "rejected" else d.get("summary")
        ckey = candidate_key(cand)
        self.b_dec.append((
            pos, d.get("event_id"), d.get("occurred_at"), tid, d.get("block_id"), kind, ckey,
            ckey, reason, [str(x) for x in d.get("evidence") or []],
            _str(d.get("verification_event_id")), *self._dims_row(tid)))

    def _on_handoff(self, pos: int, d: dict[str, Any]) -> None:
        self.b_hand.append((
            pos, d.get("event_id"), d.get("occurred_at"), d.get("task_id"), d.get("block_id"),
            "block", d.get("outcome"), d.get("state_reached"),
            [str(x) for x in d.get("findings") or []], d.get("next_sub_goal")))

    # --- writing ------------------------------------------------------------------------

    def prepare(self) -> list[tuple]:
        """The pending batch as database operations (Arrow tables built here, in the
        caller's thread): ("sql", text, params) and ("insert", table, arrow) steps."""
        ops: list[tuple] = []
        if self.b_events:
            pos, stream, version, typ, state = zip(*self.b_events, strict=True)
            ops.append(("events", pa.table({
                "position": pa.array(pos, pa.int64()), "stream": pa.array(stream, pa.string()),
                "version": pa.array(version, pa.int64()), "type": pa.array(typ, pa.string()),
                "payload": _text_array(state)})))
        if self.b_points:
            rows = list(self.b_points.values())
            ops.append(("sql", "DELETE FROM points WHERE point_hash IN (SELECT unnest($1))",
                        [[r["point_hash"] for r in rows]]))
            ops.append(("insert", "points", _rows_table(rows)))
        if self.b_profiles:
            rows = list(self.b_profiles.values())
            ops.append(("sql", "DELETE FROM runtime_profiles WHERE service || '@' || "
                               "coalesce(rev::VARCHAR, '') IN (SELECT unnest($1))",
                        [[f"{r['service']}@{'' if r['rev'] is None else r['rev']}"
                          for r in rows]]))
            ops.append(("insert", "runtime_profiles", _rows_table(rows)))
        if self.b_tasks:
            rows = list(self.b_tasks.values())
            ops.append(("sql", "DELETE FROM tasks WHERE task_id IN (SELECT unnest($1))",
                        [[r["task_id"] for r in rows]]))
            ops.append(("insert", "tasks", _rows_table(rows)))
        for name, cols in (("loop_blocks", self.b_blocks), ("tool_calls", self.b_tools),
                           ("invalidations", self.b_inval), ("verifications", self.b_verif),
                           ("gate_verdicts", self.b_gates), ("decisions", self.b_dec),
                           ("handoffs", self.b_hand)):
            if len(cols):
                ops.append(("insert", name, _table(cols)))
        if self.b_skipped:
            ops.append(("insert", "skipped", pa.table({
                n: pa.array(v, t) for n, v, t in zip(
                    ("position", "stream", "version", "type", "error"),
                    zip(*self.b_skipped, strict=True),
                    (pa.int64(), pa.string(), pa.int64(), pa.string(), pa.string()),
                    strict=True)})))
        if len(self.b_meas):
            # Metrics as one MAP per run, built from flat arrays (no per-value Python work).
            offsets = pa.array(self.b_moff + [len(self.b_metric)], pa.int32())
            metrics = pa.MapArray.from_arrays(offsets, pa.array(self.b_metric, pa.string()),
                                              pa.array(self.b_value, pa.float64()))
            tbl = _table(self.b_meas)
            distinct = _Rows(DIM_NAMES)
            distinct.rows.extend(self.b_dims_index)  # insertion order = index order
            take = pa.array(self.b_meas_dims, pa.int32())
            for name, arr in zip(DIM_NAMES, _table(distinct).columns, strict=True):
                tbl = tbl.append_column(name, arr.take(take))
            ops.append(("insert", "measurement_runs", tbl.append_column("metrics", metrics)))
        return ops

    def write(self) -> None:
        """Insert the pending batch (the caller owns the transaction)."""
        apply(self.con, self.prepare())


def apply(con: duckdb.DuckDBPyConnection, ops: list[tuple]) -> None:
    for op in ops:
        if op[0] == "sql":
            con.execute(op[1], op[2])
        elif op[0] == "events":
            con.register("_batch_events", op[1])
            try:
                con.execute(_EVENTS_INSERT)
            finally:
                con.unregister("_batch_events")
        else:
            _insert(con, op[1], op[2])


def _first(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


_HANDLERS: dict[str, Callable[[Projector, int, dict[str, Any]], None]] = {
    "DeploymentPointPinned": Projector._on_point,
    "RuntimeProfileRevised": Projector._on_profile,
    "TaskDefined": Projector._on_task_defined,
    "TaskExited": Projector._on_exit,
    "TaskReopened": Projector._on_reopen,
    "LoopBlockStarted": Projector._on_block,
    "ToolInvoked": Projector._on_tool,
    "MeasurementRecorded": Projector._on_measurement,
    "MeasurementInvalidated": Projector._on_invalidated,
    "VerificationRecorded": Projector._on_verification,
    "DeliverableAccepted": lambda p, pos, d: p._on_decision(pos, d, "accepted"),
    "DirectionRejected": lambda p, pos, d: p._on_decision(pos, d, "rejected"),
    "LoopBlockHandedOff": Projector._on_handoff,
}


_SQL_ARROW = {"BIGINT": pa.int64(), "DOUBLE": pa.float64(), "VARCHAR": pa.string()}
# Arrow types of the batch columns (given, not inferred: inference costs a pass per column).
ARROW_TYPES: dict[str, pa.DataType] = {
    **{n: _SQL_ARROW[t] for n, t in DIMS},
    "position": pa.int64(), "version": pa.int64(), "schema_version": pa.int64(),
    "block_index": pa.int64(), "exit_code": pa.int64(), "repeat": pa.int64(),
    "defined_position": pa.int64(), "last_position": pa.int64(),
    "duration_s": pa.float64(), "observed": pa.float64(), "threshold": pa.float64(),
    "baseline": pa.float64(), "success": pa.bool_(), "passed": pa.bool_(),
    "argv": pa.list_(pa.string()), "evidence": pa.list_(pa.string()),
    "findings": pa.list_(pa.string()),
}


def _table(rows: _Rows) -> pa.Table:
    return pa.table({n: _array(v, ARROW_TYPES.get(n, pa.string()))
                     for n, v in rows.columns().items()})


def _array(values: list[Any], typ: pa.DataType | None = None) -> pa.Array:
    try:
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Mixed types in one column (e.g. an int where text was expected): keep as text.
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _text_array(values: tuple[bytes, ...]) -> pa.Array:
    """UTF-8 payloads as one Arrow string array, built from one joined buffer and their
    offsets (8x cheaper than converting object by object), then validated."""
    offsets = array.array("q", accumulate(map(len, values), initial=0))
    arr = pa.LargeStringArray.from_buffers(len(values), pa.py_buffer(offsets),
                                           pa.py_buffer(b"".join(values)))
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as e:
        raise ProjectionError(f"payload is not UTF-8 text: {e}") from None
    return arr


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    names = list(rows[0])
    return pa.table({n: _array([r.get(n) for r in rows]) for n in names})


def _insert(con: duckdb.DuckDBPyConnection, table: str, tbl: pa.Table) -> None:
    name = f"_batch_{table}"
    con.register(name, tbl)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {name}")
    finally:
        con.unregister(name)


def _dicts(rel: duckdb.DuckDBPyConnection) -> Iterator[dict[str, Any]]:
    names = [c[0] for c in rel.description]
    for row in rel.fetchall():
        yield dict(zip(names, row, strict=True))


# --- opening, catching up ---------------------------------------------------------------


def index_path(home: Path) -> Path:
    return Path(home) / INDEX_NAME


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise ProjectionError(f"cannot open index {path}: {' '.join(str(e).split())}") from None
    con.execute("SET TimeZone = 'UTC'")
    ensure_schema(con)
    return con


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(SCHEMA)
    con.execute(VIEWS)
    con.execute("INSERT INTO tracking VALUES (?, ?) ON CONFLICT DO NOTHING",
                [SCHEMA_KEY, INDEX_SCHEMA_VERSION])


def schema_version(path: Path) -> int | None:
    """The schema version of an existing index file (None: new, or too old to say)."""
    if not path.exists():
        return INDEX_SCHEMA_VERSION
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise ProjectionError(f"cannot open index {path}: {' '.join(str(e).split())}") from None
    try:
        row = con.execute("SELECT position FROM tracking WHERE projection = ?",
                          [SCHEMA_KEY]).fetchone()
        return int(row[0]) if row else None
    except duckdb.Error:
        return None
    finally:
        con.close()


def tracked_position(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT position FROM tracking WHERE projection = ?",
                      [PROJECTION]).fetchone()
    return int(row[0]) if row else 0


def _commit_batch(con: duckdb.DuckDBPyConnection, ops: list[tuple], first: int, last: int,
                  before_commit: Callable[[int], None] | None) -> None:
    """One batch's rows and the new tracking position, in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        apply(con, ops)
        con.execute("INSERT INTO tracking VALUES (?, ?) ON CONFLICT (projection) "
                    "DO UPDATE SET position = excluded.position", [PROJECTION, last])
        if before_commit is not None:
            before_commit(last)
        con.execute("COMMIT")
    except BaseException as e:
        con.execute("ROLLBACK")
        if isinstance(e, duckdb.Error):
            raise ProjectionError(f"index catch-up failed at positions {first}..{last}: "
                                  f"{' '.join(str(e).split())}") from None
        raise


def catch_up(
    con: duckdb.DuckDBPyConnection,
    ledger: Any,
    *,
    batch: int = DEFAULT_BATCH,
    stop: int | None = None,
    before_commit: Callable[[int], None] | None = None,
) -> CatchUpResult:
    """Project every notification after the tracked position (up to `stop`), one
    transaction per batch. `before_commit(position)` runs inside the transaction just
    before COMMIT (tests inject failures and kills there).

    Pipelined: this thread reads and projects batch N+1 (Python) while a writer thread
    inserts and commits batch N (DuckDB, which releases the GIL). Batches commit strictly
    in order; the first failure stops the run and is raised here, after the writer ends.
    After the last batch, one CHECKPOINT (counted in the result's time).
    """
    t0 = time.perf_counter()
    start = tracked_position(con)
    head = ledger.max_position() if stop is None else stop
    if head <= start:
        return CatchUpResult(0, 0, start, time.perf_counter() - t0, 0)
    proj = Projector(con)  # reads its caches now, before the writer owns the connection
    work: queue.Queue = queue.Queue(maxsize=1)
    failed: list[BaseException] = []
    committed = [start, 0]  # last position, batches

    def writer() -> None:
        while (item := work.get()) is not None:
            if failed:
                continue  # drain: nothing after a failed batch may commit
            ops, first, last = item
            try:
                _commit_batch(con, ops, first, last, before_commit)
                committed[0], committed[1] = last, committed[1] + 1
            except BaseException as e:  # handed to the reading thread
                failed.append(e)

    thread = threading.Thread(target=writer, name="index-writer", daemon=True)
    (threshold,) = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()
    con.execute(f"SET checkpoint_threshold = '{CATCH_UP_CHECKPOINT_THRESHOLD}'")
    # The batch is hundreds of thousands of short-lived tuples and dicts with no cycles:
    # the cyclic collector would rescan them over and over (~25% of the projecting time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    thread.start()
    read = kept = 0
    skipped: list[tuple] = []
    pos = start + 1
    try:
        while pos <= head and not failed:
            hi = min(head, pos + batch - 1)
            rows = list(ledger.rows(pos, hi, page=batch))  # plain tuples: no object per row
            if not rows:
                break
            kept += proj.project(rows)
            skipped.extend(proj.b_skipped)
            last = rows[-1][0]
            work.put((proj.prepare(), pos, last))
            read += len(rows)
            pos = last + 1
    finally:
        work.put(None)
        thread.join()
        if gc_was_enabled:
            gc.enable()
        con.execute(f"SET checkpoint_threshold = '{threshold}'")
    if failed:
        raise failed[0]
    con.execute("CHECKPOINT")
    return CatchUpResult(read, kept, committed[0], time.perf_counter() - t0, committed[1],
                         skipped)


@dataclass
class IndexSession:
    con: duckdb.DuckDBPyConnection
    path: Path
    caught_up: CatchUpResult | None
    ledger: Any


@contextmanager
def open_index(ws: Any, *, update: bool = True, rebuild: bool = False,
               batch: int = DEFAULT_BATCH,
               timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[IndexSession]:
    """Lock the index, (re)build or catch it up, and hand out the connection. Every query
    command goes through here, so queries always see the ledger as of this call."""
    path = index_path(ws.home)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock")
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise ProjectionError(f"index {path} is locked by another forge command "
                              f"(waited {timeout_s:.0f}s)") from None
    try:
        if rebuild or schema_version(path) != INDEX_SCHEMA_VERSION:
            # A projection: an index of another schema version is simply rebuilt.
            for p in (path, Path(str(path) + ".wal")):
                if p.exists():
                    os.remove(p)
        con = connect(path)
        try:
            result = catch_up(con, ws.ledger, batch=batch) if (update or rebuild) else None
            yield IndexSession(con, path, result, ws.ledger)
        finally:
            con.close()
    finally:
        lock.release()


def update(ws: Any, *, batch: int = DEFAULT_BATCH) -> dict[str, Any]:
    with open_index(ws, batch=batch) as s:
        return _report(s)


def rebuild(ws: Any, *, batch: int = DEFAULT_BATCH) -> dict[str, Any]:
    with open_index(ws, rebuild=True, batch=batch) as s:
        return _report(s)


def status(ws: Any) -> dict[str, Any]:
    """Where the index stands, without catching up."""
    with open_index(ws, update=False) as s:
        return _report(s)


def _report(s: IndexSession) -> dict[str, Any]:
    pos = tracked_position(s.con)
    head = s.ledger.max_position()
    counts = {t: s.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
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


def fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """A digest of every projected row, independent of row order and batch boundaries."""
    parts = []
    for t in ["tracking", *TABLES]:
        n, h = con.execute(f"SELECT count(*), coalesce(sum(hash(x)), 0) FROM {t} x").fetchone()
        parts.append([t, int(n), str(h)])
    return digest(parts)
