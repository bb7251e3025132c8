"""The language of the system: one immutable event class per fact, named in the past tense.

Contract:
- Every event is a frozen pydantic model with the common envelope (`Event`): id, time, actor,
  task and loop-block ids where they apply, the command id that produced it (idempotency),
  the event it was caused by, and digests of the inputs it depended on.
- `TYPE` is the stable name stored with the event; `SCHEMA_VERSION` is its schema version.
  A class that changes its schema bumps `SCHEMA_VERSION` and registers an upcaster from the
  previous version in `UPCASTERS`; old stored events are upcast on read, never rewritten.
- `EVENT_TYPES` maps stored type names to classes. An unknown name is an error, not a skip.

Payloads that are specs (deployment points, task definitions, profiles) are carried as plain
mappings plus their content hash, so the ledger stays readable even when spec models evolve.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Literal
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field

from .clock import utcnow

JSON = dict[str, Any]


class Actor(BaseModel):
    """Who or what produced an event: a human, an agent (with its model), a tool, or forge."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["human", "agent", "tool", "system"] = "system"
    name: str = "forge"
    model: str | None = None

    @classmethod
    def human(cls, name: str) -> Actor:
        return cls(kind="human", name=name)

    @classmethod
    def agent(cls, name: str, model: str) -> Actor:
        return cls(kind="agent", name=name, model=model)

    @classmethod
    def tool(cls, name: str) -> Actor:
        return cls(kind="tool", name=name)


SYSTEM = Actor()

EVENT_TYPES: dict[str, type[Event]] = {}
# (type name, from_version) -> function turning a stored payload of that version into the next.
UPCASTERS: dict[tuple[str, int], Callable[[JSON], JSON]] = {}


def upcaster(type_name: str, from_version: int):
    """Register `fn(payload) -> payload` lifting `type_name` from `from_version` to +1."""

    def register(fn: Callable[[JSON], JSON]) -> Callable[[JSON], JSON]:
        UPCASTERS[(type_name, from_version)] = fn
        return fn

    return register


class Event(BaseModel):
    """The common envelope. Subclasses add the facts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1

    event_id: UUID = Field(default_factory=uuid4)
    occurred_at: datetime = Field(default_factory=utcnow)
    actor: Actor = SYSTEM
    task_id: str | None = None
    block_id: str | None = None
    command_id: str | None = None
    causation_id: UUID | None = None
    input_digests: dict[str, str] = Field(default_factory=dict)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("TYPE") or cls.__name__
        cls.TYPE = name
        if name in EVENT_TYPES and EVENT_TYPES[name] is not cls:
            raise TypeError(f"event type {name!r} defined twice")
        EVENT_TYPES[name] = cls


# --- workspace stream -------------------------------------------------------------------


class WorkspaceInitialized(Event):
    home: str
    forge_version: str
    ledger_backend: str


class DeploymentPointPinned(Event):
    name: str
    point_hash: str
    point: JSON
    source: str | None = None


class RuntimeProfileRevised(Event):
    service: str
    rev: int
    profile_hash: str
    profile: JSON
    previous_hash: str | None = None
    changes: JSON = Field(default_factory=dict)


class ModelPulled(Event):
    name: str
    digest: str
    path: str
    recipe: JSON = Field(default_factory=dict)


# --- task stream ------------------------------------------------------------------------


class TaskDefined(Event):
    title: str
    task_type: str
    goal: str
    definition: JSON
    definition_hash: str
    point_hash: str | None = None
    profile_hash: str | None = None


class LoopBlockStarted(Event):
    index: int
    sub_goal: str
    routing: JSON = Field(default_factory=dict)  # {model_tier, agent_topology, executor}
    candidate: JSON = Field(default_factory=dict)  # the change this block tries, if any


class ToolInvoked(Event):
    tool: str
    argv: list[str]
    cwd: str | None = None
    env_digest: str | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    stdout_digest: str | None = None
    stderr_digest: str | None = None
    repo_digest: str | None = None
    error: str | None = None


class EngineLaunched(Event):
    engine: str
    command: list[str]
    url: str
    pid: int | None = None
    server_info: JSON = Field(default_factory=dict)
    log_digest: str | None = None


class EngineStopped(Event):
    engine: str
    url: str
    exit_code: int | None = None
    reason: str = "teardown"
    log_digest: str | None = None


class MeasurementRecorded(Event):
    run_id: str
    source: str  # e.g. "forge-bench", "sglang.bench_serving", "manual"
    metrics: dict[str, float]
    candidate: JSON = Field(default_factory=dict)
    repeat: int | None = None
    success: bool = True
    error: str | None = None
    artifact_digest: str | None = None
    meta: JSON = Field(default_factory=dict)


class MeasurementInvalidated(Event):
    measurement_event_id: UUID
    reason: str


class VerificationRecorded(Event):
    contract_hash: str
    point_hash: str | None = None
    candidate: JSON = Field(default_factory=dict)
    passed: bool
    verdict: Literal["pass", "fail", "inconclusive"]
    gates: list[JSON] = Field(default_factory=list)  # one verdict per gate, with the numbers
    evidence: list[str] = Field(default_factory=list)  # event ids / artifact digests


class LoopBlockHandedOff(Event):
    outcome: Literal["progress", "no-progress", "failed", "delivered"] = "progress"
    state_reached: str = ""
    findings: list[str] = Field(default_factory=list)
    next_sub_goal: str | None = None


class DeliverableAccepted(Event):
    candidate: JSON = Field(default_factory=dict)
    summary: str = ""
    verification_event_id: UUID | None = None
    evidence: list[str] = Field(default_factory=list)


class DirectionRejected(Event):
    candidate: JSON = Field(default_factory=dict)
    reason: str
    evidence: list[str] = Field(default_factory=list)


TerminalState = Literal[
    "delivered",
    "follow-up-handoff",
    "failed-budget",
    "failed-unverifiable",
    "failed-blocked",
    "failed-no-progress",
    "aborted-by-human",
]


class TaskExited(Event):
    state: TerminalState
    reason: str
    evidence: list[str] = Field(default_factory=list)
    handoff: str | None = None


class TaskReopened(Event):
    reason: str


# --- bookkeeping ------------------------------------------------------------------------


class CommandHandled(Event):
    """Marks a save as done, under stream `command:<id>`: a retried save with the same
    command id finds it and adds nothing. `appended` maps stream -> [first, last] version."""

    appended: dict[str, list[int]]
    positions: list[int] = Field(default_factory=list)
