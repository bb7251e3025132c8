"""The index's tables and views (DuckDB), the deployment-point dimensions every fact table
carries, the tracking row (the projected position, the schema version) and a fingerprint of
every row."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ledger.clock import digest

if TYPE_CHECKING:
    import duckdb

PROJECTION = "index"
# Bump when tables or their meaning change: an index of another version is rebuilt.
# 3: table `skipped` (undecodable events); 4: gates, points and profiles read typed;
# 5: table `skills_provided` (the skills each block received); 6: the Node Registry's
# observations (host_windows, gpu_windows, gpu_changes, host_samples, gpu_samples);
# 7: endpoints monitored and diagnosed (endpoint_windows, endpoint_samples, diagnoses);
# 8: the top operators of `forge perf capture`'s profiles (profile_ops); 9: each run's host
# state (measurement_runs.host, .contaminated); 10: model calls with their tokens and cost
# (model_calls)
INDEX_SCHEMA_VERSION = 10
SCHEMA_KEY = "index-schema"

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
  host JSON, contaminated BOOLEAN,
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
-- One row per skill a block received (SkillsProvided): `rank` is its place in the list
-- (1 = the most relevant), `score` 1.0 for a task-type match else the retrieval's cosine
-- similarity; `fallback` says why retrieval was not used (NULL: it was).
CREATE TABLE IF NOT EXISTS skills_provided(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, skill VARCHAR, rank BIGINT, score DOUBLE, query VARCHAR,
  fallback VARCHAR);
-- The Node Registry (harness/nodes/): one row per host summary window and per GPU in it,
-- each change of a GPU's compute processes, and the samples themselves (loaded from the
-- summary's artifact; `samples_loaded` false when the artifact was not there).
CREATE TABLE IF NOT EXISTS host_windows(
  position BIGINT, host VARCHAR, start_at TIMESTAMPTZ, end_at TIMESTAMPTZ,
  interval_s DOUBLE, samples BIGINT, missed BIGINT, cpu_pct_mean DOUBLE, cpu_pct_max DOUBLE,
  mem_used_max_mib BIGINT, nvml VARCHAR, samples_artifact VARCHAR, samples_loaded BOOLEAN);
CREATE TABLE IF NOT EXISTS gpu_windows(
  position BIGINT, host VARCHAR, gpu_uuid VARCHAR, start_at TIMESTAMPTZ, end_at TIMESTAMPTZ,
  samples BIGINT, util_mean DOUBLE, util_max DOUBLE, mem_used_max_mib BIGINT,
  busy_samples BIGINT, idle_streak BIGINT);
CREATE TABLE IF NOT EXISTS gpu_changes(
  position BIGINT, host VARCHAR, gpu_uuid VARCHAR, observed_at TIMESTAMPTZ, pids BIGINT[],
  added BIGINT[], removed BIGINT[]);
CREATE TABLE IF NOT EXISTS host_samples(
  position BIGINT, host VARCHAR, t TIMESTAMPTZ, cpu_pct DOUBLE, mem_used_mib BIGINT);
CREATE TABLE IF NOT EXISTS gpu_samples(
  position BIGINT, host VARCHAR, gpu_uuid VARCHAR, t TIMESTAMPTZ, util DOUBLE,
  mem_used_mib BIGINT, procs BIGINT);
-- `forge monitor` (harness/diagnose/monitor.py): one row per endpoint summary window and
-- one per (scrape, metric) loaded from the window's samples artifact; `forge diagnose`: one
-- row per diagnosis with the rules that fired (empty: healthy). `slo_ms`: the SLO given to
-- monitor, as a JSON object of milliseconds by "ttft_ms.p99" and such (NULL: none).
CREATE TABLE IF NOT EXISTS endpoint_windows(
  position BIGINT, url VARCHAR, start_at TIMESTAMPTZ, end_at TIMESTAMPTZ, interval_s DOUBLE,
  samples BIGINT, missed BIGINT, errors BIGINT, last_error VARCHAR, slo_ms VARCHAR,
  samples_artifact VARCHAR, samples_loaded BOOLEAN);
CREATE TABLE IF NOT EXISTS endpoint_samples(
  position BIGINT, url VARCHAR, t TIMESTAMPTZ, metric VARCHAR, value DOUBLE);
CREATE TABLE IF NOT EXISTS diagnoses(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, url VARCHAR, samples BIGINT, healthy BOOLEAN, rules_fired VARCHAR[]);
-- `forge perf capture` (harness/perf/): one row per operator of a profile's top list
-- (ProfileCaptured.top), `rank` its place (1 = the most time), `share` of the ranked total.
CREATE TABLE IF NOT EXISTS profile_ops(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, engine VARCHAR, method VARCHAR, kind VARCHAR, rank BIGINT, name VARCHAR,
  total_ms DOUBLE, share DOUBLE, count BIGINT);
-- One row per model call (ModelCalled): which tier and model, why (`purpose`), its tokens,
-- latency and cost in USD (priced by forge.toml's [models.<tier>] when it was called); a
-- failed call is a row too (`success` false, `error`). Sum `cost_usd` per task or tier.
CREATE TABLE IF NOT EXISTS model_calls(
  position BIGINT, event_id VARCHAR, occurred_at TIMESTAMPTZ, task_id VARCHAR,
  block_id VARCHAR, tier VARCHAR, model VARCHAR, family VARCHAR, purpose VARCHAR,
  tokens_in BIGINT, tokens_out BIGINT, latency_s DOUBLE, cost_usd DOUBLE,
  success BOOLEAN, error VARCHAR);
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
          "handoffs", "skills_provided", "skipped", "host_windows", "gpu_windows",
          "gpu_changes", "host_samples", "gpu_samples", "endpoint_windows",
          "endpoint_samples", "diagnoses", "profile_ops", "model_calls"]


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(SCHEMA)
    con.execute(VIEWS)
    con.execute("INSERT INTO tracking VALUES (?, ?) ON CONFLICT DO NOTHING",
                [SCHEMA_KEY, INDEX_SCHEMA_VERSION])


def tracked_position(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT position FROM tracking WHERE projection = ?",
                      [PROJECTION]).fetchone()
    return int(row[0]) if row else 0


def fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """A digest of every projected row, independent of row order and batch boundaries."""
    parts = []
    for t in ["tracking", *TABLES]:
        row = con.execute(f"SELECT count(*), coalesce(sum(hash(x)), 0) FROM {t} x").fetchone()
        assert row is not None  # an aggregate returns one row
        parts.append([t, int(row[0]), str(row[1])])
    return digest(parts)
