"""Execution routing: per loop block, a model tier and an agent topology, chosen independently
and recorded on `LoopBlockStarted` even when the executor is not a model.

Rules (pure): the task's `routing:` wins; otherwise by executor kind — sweep runs without a
model (tier none, single), manual is a person (tier human, single), a command policy starts on
the small tier. With `escalate_after: K`, K no-progress blocks in a row move the tier up one
step (none/small → large) and the topology to executor-reviewer.
"""

from __future__ import annotations

from typing import Any

from ...ledger.specs import TaskDefinition

_DEFAULT_TIER = {"sweep": "none", "manual": "human", "command": "small"}


def route(task: TaskDefinition, no_progress_streak: int = 0,
          model_tiers: dict[str, str] | None = None) -> dict[str, Any]:
    kind = task.executor.kind
    tier = task.routing.model_tier or _DEFAULT_TIER[kind]
    topology = task.routing.agent_topology or "single"
    escalated = False
    k = task.routing.escalate_after
    if k and no_progress_streak >= k and tier in ("none", "small"):
        tier, topology, escalated = "large", "executor-reviewer", True
    out: dict[str, Any] = {"executor": kind, "model_tier": tier, "agent_topology": topology}
    model = (model_tiers or {}).get(tier)
    if model:
        out["model"] = model
    if escalated:
        out["escalated_after"] = no_progress_streak
    return out
