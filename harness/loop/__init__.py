"""The Task Loop: Task Definition → Main Loop of Loop Blocks → "task goal met?" → exit.

A block: start (sub-goal, routing, candidate) → measure (the evaluator's repeated runs, each a
tool call and a measurement) → verify (the task's verification path in order: its phases,
the contract's gates vs the baseline, its command steps) → decide and hand
off (accept or reject with the gate numbers; the handoff note). Block 1 is the baseline: the
runtime profile's own configuration. Between blocks the exit criteria are checked.

Contracts:
- One atomic `ledger.save` per step, with the deterministic command id
  `<task>:<block>:<step>` and the stream version it was computed from: a step is recorded
  whole or not at all, a retried step adds nothing, and a second writer gets a conflict.
- Everything the loop needs is derived from the ledger (Task Memory) at every step, so a
  process killed at any point resumes with `run_task` from the ledger alone, without
  repeating a finished step or losing a recorded measurement.
- Anti-spin: budget caps (blocks, wall time); a candidate whose effective configuration was
  already tried is not run again; K blocks in a row without measurable progress end the loop.
- Exit is typed (`TaskExited.state`) and carries evidence; a human exit must meet its state's
  criteria (delivered needs an accepted deliverable, follow-up-handoff a handoff note, …).
- The manual path (`start_block`, `run_command`, `record_measurement`, `verify_block`,
  `handoff_block`, `accept`, `reject`, `exit_task`) enforces the same state machine: no tool
  call or measurement outside an open block; acceptance needs a passing verification of the
  task's contract on the task's deployment point.

Modules: `task` (a task loaded from the ledger), `define` (spec registration), `steps`
(each step's events and the stepper that saves them), `run` (the automatic loop), `manual`
(the manual path and the task lifecycle commands: exit, reopen), `verify` (a block's
verification path), `evaluator_protocol` (the interface), `command_evaluator` and
`engine_evaluator` (measuring a candidate), `executors` (choosing the next candidate),
`gates` (judging runs against the contract), `routing` (executor, model tier, topology).
The task's state and the read queries (task list, show, memory) live in
`projections.memory`.
"""
