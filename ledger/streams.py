"""Stream names: the one place that says what the ledger's streams are called.

- `task:<task id>`: one task's history (TaskDefined, blocks, tool calls, measurements,
  verifications, decisions, exit and reopen). Written through `harness.record` only.
- `graph:<graph id>`: a task graph's definition, claims and outcomes (the graph commands).
- `workspace`: the workspace's own facts (init, pinned points, profile revisions, models,
  images resolved at first use: `harness/engines/image_resolve.py`).
- `measurements`: measurements that belong to no task (`forge bench --record` or
  `forge bench import` without `--task`).
- `engines`: engine launches and stops outside any task (`forge engine up`).
- `profiles`: `forge perf capture`'s profiles (`ProfileCaptured`) that name no task; with
  `--task` the capture goes to that task's stream (naming its block when given), so two
  blocks' profiles sit in their task's history. Written by `harness/perf/capture.py`.
- `repos`: the MonoRepo's facts (init, snapshots, restores, push approvals and refusals,
  syncs). Written by `repos/record.py`, and by the push guard (`repos/push_guard.py`) in
  the save of its approvals.
- `agents`: agent steps that name no task (`AgentStepFailed` of an MCP call without a
  task). Written by `harness/agents/tool_registry.py`.
- `guard`: the Safety Guard's facts that name no task (`ProductionRefused` of a call made
  outside any task). Written by `harness/guard/`.
- `approvals`: the human gate: requests, grants, denials, uses and refusals of approvals
  (`Approval*`). Written by `harness/guard/approvals.py`, and by the push guard
  (`repos/push_guard.py`: a refused push's request, a push's use) in the save of its own facts.
- `nodes`: the Node Registry's observations: hosts registered (inventory), GPU compute
  process changes, periodic summaries. Written by `harness/nodes/registry.py`.
- `claims`: leases on resources (GPUs, ports, whole hosts), their releases and cleanups.
  `claim:<claim id>`: that lease's heartbeats (one stream each, so the `claims` stream stays
  short and a lease's age is one row read). Both written by `harness/nodes/claims.py`; a
  claim is appended under the `claims` stream's version (racing claims cannot both win). A
  graph node's claim and its releases are saved by `harness/graph/` with the graph's own
  events (built in `harness/graph/lease.py`).
- `diagnoses`: `forge diagnose`'s results (`DiagnosisRecorded`) that name no task; with
  `--task` the diagnosis goes to that task's stream instead (in its open block), so a
  `diagnosis` task's history holds its evidence. Written by `harness/diagnose/collect.py`.
- `endpoints`: `forge monitor`'s window summaries of an endpoint's /metrics
  (`EndpointSummarized`, naming the samples artifact the index loads). Written by
  `harness/diagnose/monitor.py`.
- `reproductions`: `forge reproduce`'s verdicts (`ReproductionRecorded`, naming the task and
  block reproduced): not the task's stream, whose task has usually exited and whose history
  is the loop's. Written by `harness/loop/reproduce.py`.
- `command:<command id>`: the store's bookkeeping marker of a save (`CommandHandled`).
  Written by `ledger/store.py` alone.
"""

from __future__ import annotations

TASK_PREFIX = "task:"
GRAPH_PREFIX = "graph:"
COMMAND_PREFIX = "command:"
WORKSPACE_STREAM = "workspace"
MEASUREMENTS_STREAM = "measurements"
ENGINES_STREAM = "engines"
PROFILES_STREAM = "profiles"
REPOS_STREAM = "repos"
AGENTS_STREAM = "agents"
APPROVALS_STREAM = "approvals"
GUARD_STREAM = "guard"
NODES_STREAM = "nodes"
CLAIMS_STREAM = "claims"
CLAIM_PREFIX = "claim:"
DIAGNOSES_STREAM = "diagnoses"
ENDPOINTS_STREAM = "endpoints"
REPRODUCTIONS_STREAM = "reproductions"


def task_stream(task_id: str) -> str:
    return TASK_PREFIX + task_id


def graph_stream(graph_id: str) -> str:
    return GRAPH_PREFIX + graph_id


def command_stream(command_id: str) -> str:
    return COMMAND_PREFIX + command_id


def task_of(stream: str) -> str | None:
    """The task id of a task stream's name; None for any other stream."""
    return stream[len(TASK_PREFIX):] if stream.startswith(TASK_PREFIX) else None


def graph_of(stream: str) -> str | None:
    """The graph id of a graph stream's name; None for any other stream."""
    return stream[len(GRAPH_PREFIX):] if stream.startswith(GRAPH_PREFIX) else None


def is_task_stream(stream: str) -> bool:
    return stream.startswith(TASK_PREFIX)


def claim_stream(claim_id: str) -> str:
    return CLAIM_PREFIX + claim_id
