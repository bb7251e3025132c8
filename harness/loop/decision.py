"""What an executor answers, and the rule its candidates answer to.

- `Decision`: try a candidate (with its sub-goal), stop (with a reason, a handoff, or a typed
  exit), or wait; with the events deciding recorded (saved with the block it starts).
- `Executor`: the one interface, `decide(memory, task, point, profile) -> Decision`
  (executors.py's policies and the agent executor, agent_executor.py).
- `out_of_scope(task, point, profile, candidate)`: why a candidate may not run (outside the
  task's scope, not a commit for a `code.<member>` key, an invalid spec, a point that cannot
  be placed), or None. The loop, the agent executor and the MCP tools judge by it alone.
- `describe(candidate)`: a candidate in one line (`baseline` for none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ...ledger import events as E
from ...ledger.candidates import canonical_candidate
from ...ledger.specs import (
    CODE_PREFIX,
    DeploymentPoint,
    RuntimeProfile,
    SpecError,
    TaskDefinition,
    apply_candidate,
    effective_digest,
    scope_allows,
)
from ...projections.memory import TaskMemory
from ..engines.whole import placement_problem


@dataclass(frozen=True)
class Decision:
    action: Literal["try", "stop", "wait"]
    candidate: dict[str, Any] = field(default_factory=dict)
    sub_goal: str = ""
    reason: str = ""
    handoff: str | None = None
    tool_event: E.ToolInvoked | None = None  # the policy's own call, recorded in the block
    actor: E.Actor | None = None
    # What deciding recorded (an agent's model calls, tool calls, failed steps, skills):
    # saved with the block the decision starts, or task-level with the exit it makes.
    events: list[E.Event] = field(default_factory=list)
    # A stop that exits typed (an agent whose endpoint is down: failed-blocked; over its
    # model budget: failed-budget); None: the executor has nothing left (a handoff).
    exit_state: E.TerminalState | None = None


class Executor(Protocol):
    kind: str

    def decide(self, memory: TaskMemory, task: TaskDefinition, point: DeploymentPoint | None,
               profile: RuntimeProfile | None) -> Decision: ...


def describe(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(candidate.items())) or "baseline"


def out_of_scope(task: TaskDefinition, point: DeploymentPoint | None,
                 profile: RuntimeProfile | None, candidate: dict[str, Any]) -> str | None:
    """Why a candidate may not run (outside the task's scope or an invalid spec), or None.
    A `code.<member>` key is in scope for a member of the task's `code.members`; by the
    time a block starts its value is the resolved commit (harness/loop/code.py). Values
    are judged as spelled in the scope (ledger/candidates.py `canonical_candidate`)."""
    candidate = canonical_candidate(task.scope, candidate)
    for k, v in sorted(candidate.items()):
        if k.startswith(CODE_PREFIX):
            members = task.code.members if task.code else []
            if k[len(CODE_PREFIX):] not in members:
                return (f"{k}: the task changes no member {k[len(CODE_PREFIX):]!r} "
                        f"(code.members: {', '.join(members) or 'none'})")
            if not (isinstance(v, str) and len(v) == 40
                    and all(c in "0123456789abcdef" for c in v)):
                return f"{k}={json.dumps(v)} is not a commit id"
            continue
        if k not in task.scope:
            return f"{k} is not in the task's scope ({', '.join(task.scope) or 'empty'})"
        if not scope_allows(task.scope, k, v):
            return f"{k}={json.dumps(v)} is not an allowed value"
    try:
        effective_digest(point, profile, candidate)
        return placement_problem(*apply_candidate(point, profile, candidate))
    except SpecError as e:
        return str(e)
