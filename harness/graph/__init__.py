"""Running a task graph: define it, evolve it, and execute its ready nodes in parallel workers.

Contracts:
- Definition and evolution are events on stream `graph:<id>`: `define_graph` writes one
  GraphDefined carrying the initial nodes and edges; `add_node` / `add_edge` append NodeAdded /
  EdgeAdded, checked against the current graph (dangling, cycle) and written with the stream's
  expected version, so two concurrent edits cannot both pass a stale check.
- `run_graph` starts `jobs` worker processes (`python -m infer_forge.harness.graph.worker`)
  sharing one ledger. A worker claims a ready node by appending NodeStarted with the graph
  stream's expected version: a ConflictError means the stream moved (maybe another claim), so it
  re-reads and tries again; no node is claimed twice. Workers pick up nodes as they become
  ready and exit when nothing is ready or in flight. Workers (and their commands) die with
  the runner (PR_SET_PDEATHSIG), so a kill -9 of the runner leaves no orphan at work.
- `run_graph(resume=True)` after a crash marks the dead run's in-flight nodes NodeAbandoned
  (their partial events stay on the task stream) and runs them again as a new attempt; a
  delivered node is never run again. Without `resume`, such leftovers are an error.
- Verification before handoff: a node's outbound handoffs are decided by `handoff_events`
  from the projected state: delivered only if the source's current attempt passed
  verification, else HandoffRefused is recorded. The same gate serves `hand_off`, the manual
  API, which records the refusal and raises.
- Rework: `request_rework` / `invalidate` append one ReworkRequested per node of
  `projections.graph.rework_plan` (reason + path), atomically.
- Node work: `command` (argv or `bash -c`, then verification steps) is recorded on the node's
  task stream `task:<graph>.<node>` as TaskDefined, LoopBlockStarted (one block per attempt),
  ToolInvoked per command, VerificationRecorded, then DeliverableAccepted or DirectionRejected
  and TaskExited. `loop` work runs a task YAML through the task loop (`harness.loop`) as its own
  task `<graph>.<node>.a<attempt>`; the node passes when that loop exits delivered.
- A node's verification and its NodeVerified are one atomic save; its handoffs, delivery (or
  refusals, rejection) and task-stream ending are another, written with the graph stream's
  expected version so the decision is made on current state.
Command ids are deterministic (graph, node, attempt, step), so a retried append never doubles.

Modules: `commands` (define, evolve, rework, reject, hand off), `work` (a claimed node's
work: command or task loop, its verification and conclusion), `worker` (the worker process:
claims ready nodes; `claim_node`, the one claim), `run_record` (a run's start, end, summary
and progress lines, for both backends), `run` (`run_graph`: starts workers, watches them;
`backend="ray"` hands the run to `ray_backend`), `ray_backend` (ready nodes as Ray tasks
with the GPUs of their deployment point, claiming through `claim_node`; retried without a
duplicated event).
"""
