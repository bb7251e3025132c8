"""The event → row projector: each stored notification becomes rows of the index's tables
(pending, per batch; `catchup` writes them).

- Every event is kept in `events` (bookkeeping markers excepted); events this projector does
  not project (other issues' types, types newer than this code) only advance the position.
  An event the ledger cannot decode (unknown type, corrupt JSON, a payload that fails
  validation such as `null` for a metric) is recorded in `skipped` with its position and the
  reason, and left out of every typed table (a JSON object stays in `events`, raw): no bad
  row can stop the catch-up.
- Deterministic: rows depend on the ledger only (no ingestion times, no batch-dependent ids),
  so `rebuild` and incremental catch-up give the same `fingerprint`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from ...ledger import codec, seals
from ...ledger.errors import LedgerError
from ...ledger.events import EVENT_TYPES
from ...ledger.payloads import Digest
from ...ledger.samples import decode_samples
from ...ledger.specs import stored_point, stored_profile
from ...ledger.store import BOOKKEEPING_TYPES
from .dims import (
    as_float,
    as_int,
    as_str,
    candidate_key,
    point_dims,
    profile_row,
    sorted_json,
)
from .endpoints import EndpointBatch, on_diagnosis, on_summary
from .schema import DIM_NAMES

if TYPE_CHECKING:
    import duckdb

_POINT_HASH_AT = DIM_NAMES.index("point_hash")
# High-volume types whose rows DuckDB extracts from the payload when they pass the check
# (`catchup.SQL_INSERTS`); their handlers below stay for every other row of them.
SQL_TOPICS = frozenset({"ToolInvoked", "MeasurementRecorded", "LoopBlockHandedOff"})


def _host_of(meta: Any) -> tuple[str | None, bool | None]:
    """A run's host state as JSON text and whether it was contaminated (its meta's `host`
    and `contaminated`, harness/nodes/host_state.py); None where the run has none."""
    if type(meta) is not dict:
        return None, None
    host, dirty = meta.get("host"), meta.get("contaminated")
    return (sorted_json(host) if type(host) is dict else None,
            bool(dirty) if type(dirty) is list else None)


class TableRows:
    """Rows for one table in one batch, as tuples in `names` order: handlers append one
    tuple per row; `columns()` transposes them in C (zip) when the batch is written."""

    __slots__ = ("names", "rows", "append")

    def __init__(self, names: list[str]):
        self.names = names
        self.rows: list[tuple[Any, ...]] = []
        self.append = self.rows.append

    def columns(self) -> dict[str, Any]:
        if not self.rows:
            return {n: [] for n in self.names}
        return dict(zip(self.names, zip(*self.rows, strict=True), strict=True))

    def __len__(self) -> int:
        return len(self.rows)


_MEAS_EV_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "run_id",
                 "source", "repeat", "success", "candidate", "candidate_key",
                 "repo_snapshot", "host", "contaminated"]  # + DIM_NAMES, by reference to
# the batch's distinct dims
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
_SKILL_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "skill", "rank",
               "score", "query", "fallback"]
_HWIN_COLS = ["position", "host", "start_at", "end_at", "interval_s", "samples", "missed",
              "cpu_pct_mean", "cpu_pct_max", "mem_used_max_mib", "nvml", "samples_artifact",
              "samples_loaded"]
_GWIN_COLS = ["position", "host", "gpu_uuid", "start_at", "end_at", "samples", "util_mean",
              "util_max", "mem_used_max_mib", "busy_samples", "idle_streak"]
_GCHG_COLS = ["position", "host", "gpu_uuid", "observed_at", "pids", "added", "removed"]
_PROF_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "engine", "method",
              "kind", "rank", "name", "total_ms", "share", "count"]
_MODEL_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "tier", "model",
               "family", "purpose", "tokens_in", "tokens_out", "latency_s", "cost_usd",
               "success", "error"]
_HAND_COLS = ["position", "event_id", "occurred_at", "task_id", "block_id", "kind", "outcome",
              "state_reached", "findings", "next_sub_goal"]


class Projector:
    """Projects notifications into the index. One instance per catch-up run: its caches are
    loaded from the database and thrown away with the run (so a rolled-back batch can never
    leave a stale cache behind)."""

    def __init__(self, con: duckdb.DuckDBPyConnection,
                 artifacts: Callable[[str], bytes] | None = None):
        self.con = con
        self.artifacts = artifacts  # reads a summary's samples artifact (None: not loaded)
        self.points: dict[str, dict[str, Any]] = {}  # point_hash -> row
        self.profiles: dict[tuple[str, int | None], dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self._task_dims: dict[str, dict[str, Any]] = {}
        self._task_dims_row: dict[str, tuple[Any, ...]] = {}
        self._load()

    def _load(self) -> None:
        for row in _dicts(self.con.execute("SELECT * FROM points")):
            self.points[row["point_hash"]] = row
        for row in _dicts(self.con.execute("SELECT * FROM runtime_profiles")):
            self.profiles[(row["service"], row["rev"])] = row
        for row in _dicts(self.con.execute("SELECT * FROM tasks")):
            self.tasks[row["task_id"]] = row

    # --- per batch ----------------------------------------------------------------------

    def _reset_batch(self) -> None:
        self.b_keep: list[bool] = []  # per row of the batch: kept in `events`
        self.b_sql: list[bool] = []  # per row: projected in SQL (`catchup.SQL_TOPICS`)
        self.b_kept = 0
        # Runs projected in SQL: position, dimension index, candidate key, repo snapshot,
        # host state (JSON text) and whether it contaminated the run; their metrics as flat
        # names and values with each run's offset (one MAP per run, built by Arrow:
        # DuckDB's JSON-to-MAP cast costs ~4 us a run, this ~0.3 us).
        self.b_mx: tuple[list[int], list[int], list[str], list[Any], list[str | None],
                         list[bool | None]] = ([], [], [], [], [], [])
        self.b_mx_metric: list[str] = []
        self.b_mx_value: list[float] = []
        self.b_mx_off: list[int] = []
        self.b_points: dict[str, dict[str, Any]] = {}
        self.b_profiles: dict[tuple[str, int | None], dict[str, Any]] = {}
        self.b_tasks: dict[str, dict[str, Any]] = {}
        self.b_blocks = TableRows(_BLOCK_COLS)
        self.b_tools = TableRows(_TOOL_COLS)
        self.b_meas = TableRows(_MEAS_EV_COLS)
        # Runs share their task's dimensions: each run keeps an index into the batch's
        # distinct dimension tuples, expanded by Arrow's `take` (no per-run Python work).
        self.b_meas_dims: list[int] = []
        self.b_dims_index: dict[tuple[Any, ...], int] = {}
        self.b_metric: list[str] = []
        self.b_value: list[float | None] = []
        self.b_moff: list[int] = []
        self.b_inval = TableRows(["position", "event_id", "measurement_event_id", "reason"])
        self.b_verif = TableRows(_VERIF_COLS)
        self.b_gates = TableRows(_GATE_COLS)
        self.b_dec = TableRows(_DEC_COLS)
        self.b_hand = TableRows(_HAND_COLS)
        self.b_skills = TableRows(_SKILL_COLS)
        self.b_hwin = TableRows(_HWIN_COLS)
        self.b_gwin = TableRows(_GWIN_COLS)
        self.b_gchg = TableRows(_GCHG_COLS)
        self.b_profops = TableRows(_PROF_COLS)
        self.b_models = TableRows(_MODEL_COLS)
        # Samples as flat columns (a day of a cluster is millions of rows: no tuple per row).
        self.b_hsamp: dict[str, list[Any]] = {k: [] for k in (
            "position", "host", "t", "cpu_pct", "mem_used_mib")}
        self.b_gsamp: dict[str, list[Any]] = {k: [] for k in (
            "position", "host", "gpu_uuid", "t", "util", "mem_used_mib", "procs")}
        self.b_skipped: list[tuple[Any, ...]] = []  # (position, stream, version, type, error)
        self.b_endpoints = EndpointBatch()  # forge monitor / diagnose (endpoints.py)

    def project(self, rows: list[tuple[Any, ...]], counts: Sequence[Any] = (),
                sealed: bytes | bytearray = b"") -> int:
        """Add one batch of stored rows `(position, stream, version, type, state)` (as
        `Ledger.rows` gives them) to the pending rows. Returns events kept.

        Every event is checked as the ledger reads it: a payload of exactly its current
        form passes the codec's generated check (`codec.current_check`, no objects built);
        anything else is decoded in full (upcast, coerced) or, when the ledger cannot decode
        it (unknown type, corrupt JSON, invalid fields), left out of every table and recorded
        in `skipped`: the position still advances with the batch, so it is read once. The
        envelope columns of `events` are extracted by DuckDB's vectorized JSON reader at
        insert time (see `catchup.batch_ops`).

        SQL path: a row of `SQL_TOPICS` that passes the check, whose payload has exactly as
        many top-level keys as DuckDB counted (`counts[i]`: no duplicate key where DuckDB
        would read the first and orjson the last) is only marked in `b_sql`: DuckDB extracts
        its columns from the payload (`catchup.SQL_INSERTS`); Python adds what depends on
        earlier events or is already parsed here (a run's dimensions, candidate key and
        metrics).

        Sealed rows (`sealed[i]`, from `sealed_rows`): the payload is exactly what the
        codec's `encode` wrote. One that ends in its type's current version (`encode` writes
        `"_v"` last) is what the check passes, so it is not checked again; of `SQL_TOPICS`
        (given `counts`: the SQL path) it is not even parsed here, unless a run's."""
        self._reset_batch()
        loads = orjson.loads
        keep, sql = self.b_keep, self.b_sql
        handlers = _HANDLERS
        bookkeeping = BOOKKEEPING_TYPES
        never = codec.never
        checks: dict[str, tuple[Callable[[dict[str, Any]], bool], bytes | None]] = {}
        counted = bool(counts)
        for i, row in enumerate(rows):
            topic = row[3]
            if topic in bookkeeping:
                keep.append(False)
                sql.append(False)
                continue
            check, current = checks.get(topic) or (None, None)
            if check is None:
                check = codec.current_check(topic) or never
                cls = EVENT_TYPES.get(topic)
                # A type the check cannot express (`never`) is always decoded in full.
                current = None if check is never or cls is None else (
                    b',"%s":%d}' % (codec.VERSION_KEY.encode(), cls.SCHEMA_VERSION))
                checks[topic] = (check, current)
            pos, state = row[0], row[4]
            if current is not None and sealed and sealed[i] and type(state) is bytes \
                    and state.endswith(current):
                keep.append(True)
                if counted and topic in SQL_TOPICS:
                    sql.append(True)
                    if topic == "MeasurementRecorded":
                        self._sql_measurement(pos, loads(state))
                    continue
                sql.append(False)
                h = handlers.get(topic)
                if h is not None:
                    h(self, pos, loads(state))
                continue
            try:
                d = loads(state)
            except orjson.JSONDecodeError:
                d = None
            if type(d) is not dict or not check(d):
                # Not exactly current: the ledger's own codec upcasts, coerces, or refuses.
                sql.append(False)
                try:
                    ev_obj = codec.decode(str(row[1]), row[2], topic, bytes(state))
                except LedgerError as e:
                    self.b_skipped.append((pos, str(row[1]), row[2], topic, str(e)))
                    keep.append(type(d) is dict)  # a JSON object (e.g. a newer type): raw
                    continue
                d = ev_obj.model_dump(mode="json")
            elif counted and topic in SQL_TOPICS and counts[i] == len(d):
                keep.append(True)
                sql.append(True)
                if topic == "MeasurementRecorded":
                    self._sql_measurement(pos, d)
                continue
            else:
                sql.append(False)
            keep.append(True)
            h = handlers.get(topic)
            if h is not None:
                h(self, pos, d)
        self.b_kept = sum(keep)
        return self.b_kept

    @staticmethod
    def sealed_rows(rows: list[tuple[Any, ...]]) -> bytearray:
        """Per row of the batch, 1 when its save's marker (`CommandHandled`, after the
        save's events) is in the batch and carries a seal equal to `codec.seal` of the rows
        just before it: their types and payloads are exactly what the codec wrote. Anything
        else (no seal, a save across batches, rows changed or moved since) stays 0."""
        return seals.sealed_rows(rows)

    def _sql_measurement(self, pos: int, d: dict[str, Any]) -> None:
        """What Python adds to a run DuckDB projects: its dimensions, candidate key, repo
        snapshot and metrics (the check passed: a dict of floats)."""
        get = d.get
        digests = get("input_digests") or {}
        mx = self.b_mx
        mx[0].append(pos)
        mx[1].append(self._run_dims(get("task_id"), digests.get(Digest.POINT)))
        mx[2].append(candidate_key(get("candidate")))
        mx[3].append(digests.get(Digest.REPO_SNAPSHOT))
        host, dirty = _host_of(get("meta"))
        mx[4].append(host)
        mx[5].append(dirty)
        metrics = d["metrics"]
        self.b_mx_off.append(len(self.b_mx_metric))
        self.b_mx_metric.extend(metrics)
        self.b_mx_value.extend(metrics.values())

    # --- handlers -----------------------------------------------------------------------

    def _point_dims(self, point_hash: str | None) -> dict[str, Any]:
        """Dimensions of the point a task names by hash (`TaskDefined.point_hash`, pinned
        in the same save); none for a task without one (a graph node's)."""
        if point_hash and point_hash in self.points:
            return self._dims_of_point_row(self.points[point_hash])
        return dict.fromkeys(DIM_NAMES)

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
        point = d["point"]
        ph = d["point_hash"]
        try:
            row = point_dims(stored_point(point))
        except ValidationError:  # not a deployment point (the event is kept in `events`)
            row = dict.fromkeys(DIM_NAMES)
        row.pop("task_type")
        row.update(point_hash=ph, name=as_str(d.get("name")), position=pos,
                   pinned_at=d.get("occurred_at"), point=sorted_json(point))
        self._fill_engine(row)
        self.points[ph] = row
        self.b_points[ph] = row
        self._task_dims.clear()
        self._task_dims_row.clear()

    def _on_profile(self, pos: int, d: dict[str, Any]) -> None:
        prof = d["profile"]
        try:
            typed = profile_row(stored_profile(prof))
        except ValidationError:  # not a runtime profile (the event is kept in `events`)
            typed = {"engine": None, "image": None, "framework": None, "config": None}
        row = {
            "service": d["service"], "rev": d["rev"],
            "profile_hash": d["profile_hash"], "previous_hash": d.get("previous_hash"),
            **typed, "position": pos, "revised_at": d.get("occurred_at"),
            "profile": sorted_json(prof), "changes": sorted_json(d.get("changes") or {}),
        }
        key = (row["service"], row["rev"])
        self.profiles[key] = row
        self.b_profiles[key] = row
        self._task_dims.clear()
        self._task_dims_row.clear()

    def _on_task_defined(self, pos: int, d: dict[str, Any]) -> None:
        tid: Any = d.get("task_id")
        definition = d["definition"]
        ph = d.get("point_hash")
        dims = self._fill_engine(self._point_dims(ph))
        dims["point_hash"] = ph
        dims["task_type"] = as_str(d.get("task_type"))
        prior = self.tasks.get(tid) or {}
        row = {
            **dims, "task_id": tid, "title": d.get("title"), "goal": d.get("goal"),
            "definition_hash": d.get("definition_hash"),
            "defined_position": prior.get("defined_position") or pos,
            "defined_at": prior.get("defined_at") or d.get("occurred_at"),
            "last_position": pos, "exit_state": None, "exit_reason": None,
            "exit_handoff": None, "exited_at": None, "definition": sorted_json(definition),
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

    def _dims_row(self, tid: str | None) -> tuple[Any, ...]:
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
            d.get("block_id") or f"b{d.get('index')}", as_int(d.get("index")),
            d.get("sub_goal"), as_str(routing.get("model_tier")),
            as_str(routing.get("agent_topology")), as_str(routing.get("executor")),
            sorted_json(routing), ckey, ckey))

    def _on_tool(self, pos: int, d: dict[str, Any]) -> None:
        argv = d.get("argv") or []
        get = d.get
        self.b_tools.append((
            pos, get("event_id"), get("occurred_at"), get("task_id"), get("block_id"),
            get("tool"), [a if type(a) is str else str(a) for a in argv],
            as_int(get("exit_code")), as_float(get("duration_s")), get("error"),
            get("repo_digest"), get("stdout_digest"), get("stderr_digest")))

    def _run_dims(self, tid: Any, ref: Any) -> int:
        """The index (into the batch's distinct dimension tuples) of a run's dimensions: its
        task's, or those of the point `ref` (`input_digests`) it ran on when not the task's."""
        dims = self._dims_row(tid)
        if ref and ref != dims[_POINT_HASH_AT] and ref in self.points:
            pd = self._fill_engine(self._dims_of_point_row(self.points[ref]))
            pd["task_type"] = self._dims(tid).get("task_type")
            dims = tuple(pd.get(n) for n in DIM_NAMES)
        i = self.b_dims_index.get(dims)
        if i is None:
            i = self.b_dims_index[dims] = len(self.b_dims_index)
        return i

    def _on_measurement(self, pos: int, d: dict[str, Any]) -> None:
        get = d.get
        tid = get("task_id")
        digests = get("input_digests") or {}
        i = self._run_dims(tid, digests.get(Digest.POINT))
        ckey = candidate_key(get("candidate"))
        self.b_meas.append((pos, get("event_id"), get("occurred_at"), tid, get("block_id"),
                            get("run_id"), get("source"), as_int(get("repeat")),
                            bool(get("success", True)), ckey, ckey,
                            digests.get(Digest.REPO_SNAPSHOT), *_host_of(get("meta"))))
        self.b_meas_dims.append(i)
        self.b_moff.append(len(self.b_metric))
        metrics = get("metrics") or {}
        self.b_metric.extend(metrics)
        self.b_value.extend(v if type(v) is float else as_float(v) for v in metrics.values())

    def _on_invalidated(self, pos: int, d: dict[str, Any]) -> None:
        self.b_inval.append((pos, d.get("event_id"), as_str(d.get("measurement_event_id")),
                             d.get("reason")))

    def _on_verification(self, pos: int, d: dict[str, Any]) -> None:
        cand = d.get("candidate") or {}
        gates = d.get("gates") or []
        vid = d.get("event_id")
        tid, bid = d.get("task_id"), d.get("block_id")
        ckey = candidate_key(cand)
        self.b_verif.append((
            pos, vid, d.get("occurred_at"), tid, bid, d.get("verdict"), d.get("passed"),
            d.get("contract_hash"), d.get("point_hash"), ckey, ckey, sorted_json(gates),
            [str(x) for x in d.get("evidence") or []]))
        for g in gates:  # GateResult payloads (fields left at their default may be absent)
            self.b_gates.append((
                pos, vid, tid, bid, g["name"], g.get("metric"), g["verdict"], g.get("median"),
                g.get("threshold"), g.get("baseline_median"), g.get("reason", ""), sorted_json(g)))

    def _on_decision(self, pos: int, d: dict[str, Any], kind: str) -> None:
        tid = d.get("task_id")
        cand = d.get("candidate") or {}
        reason = d.get("reason") if kind == "rejected" else d.get("summary")
        ckey = candidate_key(cand)
        self.b_dec.append((
            pos, d.get("event_id"), d.get("occurred_at"), tid, d.get("block_id"), kind, ckey,
            ckey, reason, [str(x) for x in d.get("evidence") or []],
            as_str(d.get("verification_event_id")), *self._dims_row(tid)))

    def _on_handoff(self, pos: int, d: dict[str, Any]) -> None:
        self.b_hand.append((
            pos, d.get("event_id"), d.get("occurred_at"), d.get("task_id"), d.get("block_id"),
            "block", d.get("outcome"), d.get("state_reached"),
            [str(x) for x in d.get("findings") or []], d.get("next_sub_goal")))

    def _on_skills(self, pos: int, d: dict[str, Any]) -> None:
        scores = d.get("scores") or {}
        get = d.get
        for rank, name in enumerate(get("skills") or [], 1):
            self.b_skills.append((
                pos, get("event_id"), get("occurred_at"), get("task_id"), get("block_id"),
                as_str(name), rank, as_float(scores.get(name)), get("query"), get("fallback")))

    def _on_host_summary(self, pos: int, d: dict[str, Any]) -> None:
        host, start, end = d.get("host"), d.get("start"), d.get("end")
        art = d.get("samples_artifact")
        loaded = False
        if art and self.artifacts is not None:
            loaded = self._load_samples(pos, str(host), art)
        self.b_hwin.append((pos, host, start, end, as_float(d.get("interval_s")),
                            as_int(d.get("samples")), as_int(d.get("missed")),
                            as_float(d.get("cpu_pct_mean")), as_float(d.get("cpu_pct_max")),
                            as_int(d.get("mem_used_max_mib")), d.get("nvml"), art, loaded))
        for g in d.get("gpus") or []:
            self.b_gwin.append((pos, host, g.get("uuid"), start, end, as_int(g.get("samples")),
                                as_float(g.get("util_mean")), as_float(g.get("util_max")),
                                as_int(g.get("mem_used_max_mib")), as_int(g.get("busy_samples")),
                                as_int(g.get("idle_streak"))))

    def _load_samples(self, pos: int, host: str, art: str) -> bool:
        assert self.artifacts is not None
        try:
            cols = decode_samples(self.artifacts(art))
            t = [int(x * 1_000_000) for x in cols["t"]]
            n = len(t)
            hs = self.b_hsamp
            hs["position"] += [pos] * n
            hs["host"] += [host] * n
            hs["t"] += t
            hs["cpu_pct"] += list(cols["cpu"])
            hs["mem_used_mib"] += list(cols["mem"])
            gs = self.b_gsamp
            for uuid, g in (cols.get("gpus") or {}).items():
                gs["position"] += [pos] * n
                gs["host"] += [host] * n
                gs["gpu_uuid"] += [uuid] * n
                gs["t"] += t
                gs["util"] += list(g["util"])
                gs["mem_used_mib"] += list(g["mem"])
                gs["procs"] += list(g["procs"])
            return True
        except (OSError, LedgerError, ValueError, KeyError, TypeError):
            return False  # missing or unreadable artifact: the summary row says so

    def _on_gpu_change(self, pos: int, d: dict[str, Any]) -> None:
        self.b_gchg.append((pos, d.get("host"), d.get("gpu_uuid"), d.get("at"),
                            list(d.get("pids") or []), list(d.get("added") or []),
                            list(d.get("removed") or [])))

    def _on_profile_captured(self, pos: int, d: dict[str, Any]) -> None:
        get = d.get
        head = (pos, get("event_id"), get("occurred_at"), get("task_id"), get("block_id"),
                get("engine"), get("method"), get("kind"))
        for rank, op in enumerate(get("top") or [], 1):  # ProfileOp payloads, ranked
            self.b_profops.append((*head, rank, as_str(op.get("name")),
                                   as_float(op.get("total_ms")), as_float(op.get("share")),
                                   as_int(op.get("count"))))

    def _on_model_call(self, pos: int, d: dict[str, Any]) -> None:
        get = d.get
        self.b_models.append((
            pos, get("event_id"), get("occurred_at"), get("task_id"), get("block_id"),
            as_str(get("tier")), as_str(get("model")), as_str(get("family")),
            as_str(get("purpose")), as_int(get("tokens_in")), as_int(get("tokens_out")),
            as_float(get("latency_s")), as_float(get("cost_usd")), bool(get("success", True)),
            get("error")))


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
    "SkillsProvided": Projector._on_skills,
    "HostSummarized": Projector._on_host_summary,
    "GpuProcessesChanged": Projector._on_gpu_change,
    "EndpointSummarized": lambda p, pos, d: on_summary(p.b_endpoints, p.artifacts, pos, d),
    "DiagnosisRecorded": lambda p, pos, d: on_diagnosis(p.b_endpoints, pos, d),
    "ProfileCaptured": Projector._on_profile_captured,
    "ModelCalled": Projector._on_model_call,
}


def _dicts(rel: duckdb.DuckDBPyConnection) -> Iterator[dict[str, Any]]:
    names = [c[0] for c in rel.description]
    for row in rel.fetchall():
        yield dict(zip(names, row, strict=True))

PROJECTED_TYPES = frozenset(_HANDLERS)

# The fields of each projected event that no column of its tables holds under the field's own
# name: where they went instead, or that they stay in `events.payload` only (queryable as
# JSON, not as a column). A new field of a projected event is a column or is named here
# (tests/projections/test_index_fields.py, against a real catch-up).
PAYLOAD_ONLY = "in `events.payload` only"
LEFT_OUT: dict[str, dict[str, str]] = {
    "DeploymentPointPinned": {"source": PAYLOAD_ONLY},
    "TaskDefined": {"profile_hash": PAYLOAD_ONLY + " (the point's `service`, `rev` are columns)"},
    "TaskExited": {"state": "tasks.exit_state", "reason": "tasks.exit_reason",
                   "handoff": "tasks.exit_handoff (and a `handoffs` row)",
                   "evidence": PAYLOAD_ONLY},
    "TaskReopened": {"reason": PAYLOAD_ONLY + " (the task's exit columns are cleared)"},
    "LoopBlockStarted": {"index": "loop_blocks.block_index", "host": PAYLOAD_ONLY},
    "ToolInvoked": {"cwd": PAYLOAD_ONLY, "env_digest": PAYLOAD_ONLY, "sandbox": PAYLOAD_ONLY},
    "MeasurementRecorded": {"error": PAYLOAD_ONLY, "artifact_digest": PAYLOAD_ONLY,
                            "meta": PAYLOAD_ONLY + " (but its `host`: measurement_runs.host; "
                            "`contaminated`: measurement_runs.contaminated, any reason)"},
    "VerificationRecorded": {"steps": PAYLOAD_ONLY, "differs": PAYLOAD_ONLY},
    "DeliverableAccepted": {"summary": "decisions.reason"},
    "SkillsProvided": {"skills": "one skills_provided row each (`skill`, `rank`)",
                       "scores": "skills_provided.score"},
    "HostSummarized": {"start": "start_at", "end": "end_at",
                       "gpus": "one gpu_windows row each"},
    "GpuProcessesChanged": {"at": "gpu_changes.observed_at"},
    "EndpointSummarized": {"start": "endpoint_windows.start_at",
                           "end": "endpoint_windows.end_at",
                           "stats": PAYLOAD_ONLY + " (the samples in endpoint_samples)"},
    "DiagnosisRecorded": {"findings": "diagnoses.rules_fired (each finding's rule)",
                          **dict.fromkeys(("start", "end", "interval_s", "window", "log_file",
                                           "log_lines_read", "slo_ms", "rules"),
                                          PAYLOAD_ONLY)},
    "ProfileCaptured": {"top": "one profile_ops row each (`rank`, `name`, `total_ms`, ...)",
                        **dict.fromkeys(("url", "duration_s", "load", "bench", "traces",
                                         "trace_names", "unit", "samples", "phases",
                                         "options"), PAYLOAD_ONLY)},
    "ModelCalled": {"prompt_digest": PAYLOAD_ONLY + " (the prompt artifact)",
                    "response_digest": PAYLOAD_ONLY + " (the response artifact)"},
}
# The envelope (every event's common fields) is the `events` table's, but for these.
ENVELOPE_LEFT_OUT: dict[str, str] = {
    "actor": "events.actor_kind, actor_name, actor_model",
    "input_digests": PAYLOAD_ONLY + " (a run's point and repo snapshot: measurement_runs' "
                     "dimensions and `repo_snapshot`)",
}
