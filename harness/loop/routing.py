"""Execution routing: per loop block, a model tier and an agent topology, chosen independently
and recorded on `LoopBlockStarted` even when the executor is not a model.

Rules (pure): the tier is the agent executor's own `tier`, else the task's `routing:`, else by
executor kind — sweep runs without a model (tier none, single), manual is a person (tier
human, single), a command policy and an agent start on the small tier. With
`escalate_after: K`, every K no-progress blocks in a row move the tier one step up the
escalation ladder and the topology to executor-reviewer; the block's routing then says
`escalated_after` (the streak) and `escalated_from` (the tier it left).

The escalation ladder is the tiers configured in forge.toml (`[models.<tier>]`) in this order:
the well-known names `small`, `medium`, `large` first, then any other tier by its price
(input + output USD per million tokens), then by name; with no `[models]` it is
`small → large`. The tier `none` escalates as `small` does; `human` and a tier off the ladder
never move. An agent executor reads the same routing: for a configured tier the record names
its `model` and `family`; planner-executor names a `planner_tier` and executor-reviewer a
`reviewer_tier` (the next tier up the ladder, else the one below, else the same), with their
models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...ledger.config import ModelSettings
from ...ledger.specs import TaskDefinition

_DEFAULT_TIER = {"sweep": "none", "manual": "human", "command": "small", "agent": "small"}
_KNOWN_ORDER = ("small", "medium", "large")
_DEFAULT_LADDER = ["small", "large"]


def ladder(models: Mapping[str, ModelSettings] | None) -> list[str]:
    """The escalation order of the configured tiers (module contract)."""
    if not models:
        return list(_DEFAULT_LADDER)

    def key(t: str) -> tuple[int, float, str]:
        s = models[t]
        rank = _KNOWN_ORDER.index(t) if t in _KNOWN_ORDER else len(_KNOWN_ORDER)
        return rank, s.price_in_per_mtok + s.price_out_per_mtok, t

    return sorted(models, key=key)


def _neighbour(tier: str, order: list[str]) -> str:
    """The tier that plans or reviews for `tier`: the next one up, else the one below."""
    if tier not in order:
        return tier
    i = order.index(tier)
    if i + 1 < len(order):
        return order[i + 1]
    return order[i - 1] if i > 0 else tier


def route(task: TaskDefinition, no_progress_streak: int = 0,
          model_tiers: Mapping[str, str] | None = None,
          models: Mapping[str, ModelSettings] | None = None) -> dict[str, Any]:
    """The routing of the next block (module contract). `model_tiers`: forge.toml's
    `[model_tiers]` names; `models`: its `[models.<tier>]` endpoints (they win)."""
    kind = task.executor.kind
    tier = (task.executor.tier if kind == "agent" else None) or task.routing.model_tier \
        or _DEFAULT_TIER[kind]
    topology = task.routing.agent_topology or "single"
    order = ladder(models)
    out: dict[str, Any] = {"executor": kind, "model_tier": tier, "agent_topology": topology}
    k = task.routing.escalate_after
    pos = order.index("small") if tier == "none" and "small" in order else \
        order.index(tier) if tier in order else None
    if k and no_progress_streak >= k and pos is not None:
        to = min(pos + no_progress_streak // k, len(order) - 1)
        if order[to] != tier:
            out.update(model_tier=order[to], agent_topology="executor-reviewer",
                       escalated_after=no_progress_streak, escalated_from=tier)
    _name(out, "", out["model_tier"], model_tiers, models)
    helper = {"planner-executor": "planner", "executor-reviewer": "reviewer"}.get(
        out["agent_topology"])
    if helper and kind == "agent":
        _name(out, f"{helper}_", _neighbour(out["model_tier"], order), model_tiers, models)
    return out


def _name(out: dict[str, Any], prefix: str, tier: str, model_tiers: Mapping[str, str] | None,
          models: Mapping[str, ModelSettings] | None) -> None:
    """Put `tier`'s model (and family) on the routing record under `prefix`."""
    if prefix:
        out[f"{prefix}tier"] = tier
    s = (models or {}).get(tier)
    model = s.model if s is not None else (model_tiers or {}).get(tier)
    if model:
        out[f"{prefix}model"] = model
    if s is not None:
        out[f"{prefix}family"] = s.family
