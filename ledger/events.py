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

Why one module past 500 lines: it is the language every stored event is written in, one class
per fact with its schema version and upcasters, in sections by stream; one file keeps a stored
type name defined exactly once (`EVENT_TYPES`) and lets a reader see the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator

from .clock import utcnow
from .errors import NonFiniteError
from .numbers import check_finite, field_path, number_problem
from .payloads import (
    Difference,
    GateResult,
    MemberState,
    StepResult,
    SyncConflict,
    gates_from_stored,
)

JSON = dict[str, Any]

def _may_hold_number(tp: Any, floats: bool = True) -> bool:
    """Whether a value of annotation `tp` can contain a number (so the check must walk it).
    With `floats` False, typed floats do not count (validation with allow_inf_nan=False has
    already refused non-finite ones), only ints and untyped (`Any`) values."""
    if tp in (str, bool, type(None), UUID, datetime):
        return False
    if tp is float:
        return floats
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return any(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
    if origin is Annotated:
        return _may_hold_number(args[0], floats)
    if origin in (Union, UnionType, list, dict, tuple, set, frozenset):
        return any(_may_hold_number(a, floats) for a in args) if args else True
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return any(_may_hold_number(f.annotation, floats) for f in tp.model_fields.values())
    return True  # int, Any, and anything unknown


_NUMBER_FIELDS: dict[tuple[type, bool], tuple[str, ...]] = {}


def number_fields(cls: type[BaseModel], floats: bool = True) -> tuple[str, ...]:
    """The fields of `cls` whose values can hold numbers: the only ones the check walks
    (`floats` False: leave out fields whose only numbers are validated floats)."""
    names = _NUMBER_FIELDS.get((cls, floats))
    if names is None:
        names = _NUMBER_FIELDS[cls, floats] = tuple(
            n for n, f in cls.model_fields.items() if _may_hold_number(f.annotation, floats))
    return names


def check_event_values(cls: type[Event], values: Mapping[str, Any], floats: bool = True) -> None:
    """check_finite over the number-holding fields of an event's values (attributes or a
    dumped payload), naming `Type.field.path`. `floats` False skips the fields validation
    has already checked (typed floats), as after construction."""
    for name in number_fields(cls, floats):
        v = values.get(name)
        if v is not None and type(v) is not str:
            check_finite(v, f"{cls.TYPE}.{name}")


class Actor(BaseModel):
    """Who or what produced an event: a human, an agent (with its model), a tool, or forge."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

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

_ACTORS: dict[tuple[tuple[str, Any], ...], Actor] = {}


def _interned_actor(value: Any, handler: Any) -> Actor:
    """Validate an actor once per distinct stored form: a ledger holds few actors and many
    events, and building the nested model is a third of decoding an event. The cache key is
    the exact (key, value) pairs, so only a form that validated before is ever reused."""
    if type(value) is dict:
        try:
            key = tuple(value.items())
            actor = _ACTORS.get(key)
        except TypeError:  # an unhashable value: not a valid actor, let pydantic say why
            return handler(value)
        if actor is None:
            actor = handler(value)
            if len(_ACTORS) < 4096:
                _ACTORS[key] = actor
        return actor
    return handler(value)


InternedActor = Annotated[Actor, WrapValidator(_interned_actor)]

EVENT_TYPES: dict[str, type[Event]] = {}
# (type name, from_version) -> function turning a stored payload of that version into the next.
UPCASTERS: dict[tuple[str, int], Callable[[JSON], JSON]] = {}


def upcaster(type_name: str, from_version: int
             ) -> Callable[[Callable[[JSON], JSON]], Callable[[JSON], JSON]]:
    """Register `fn(payload) -> payload` lifting `type_name` from `from_version` to +1."""

    def register(fn: Callable[[JSON], JSON]) -> Callable[[JSON], JSON]:
        UPCASTERS[(type_name, from_version)] = fn
        return fn

    return register


class Event(BaseModel):
    """The common envelope. Subclasses add the facts."""

    # defer_build: a class builds its validator on first use, so a command that touches a
    # few event types does not pay for all of them at import. allow_inf_nan=False: a typed
    # float field refuses NaN and infinities (also "nan" strings and NaN tokens on decode).
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True,
                              allow_inf_nan=False)

    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1

    event_id: UUID = Field(default_factory=uuid4)
    occurred_at: datetime = Field(default_factory=utcnow)
    actor: InternedActor = SYSTEM
    task_id: str | None = None
    block_id: str | None = None
    command_id: str | None = None
    causation_id: UUID | None = None
    input_digests: dict[str, str] = Field(default_factory=dict)

    def __init__(self, /, **data: Any) -> None:
        """Build an event; a number it cannot store raises NonFiniteError naming the field
        (`MeasurementRecorded.metrics.output_throughput: NaN is not a finite number`)."""
        cls = type(self)
        try:
            super().__init__(**data)
        except ValidationError as e:
            for err in e.errors():
                if err["type"] == "finite_number":
                    value = err["input"]
                    problem = number_problem(value) if isinstance(value, float) else None
                    raise NonFiniteError(
                        f"{field_path(cls.TYPE, tuple(err['loc']))}: "
                        f"{problem or f'{value!r} is not a finite number'}") from None
            raise
        check_event_values(cls, self.__dict__, floats=False)

    # Validation (decoding a stored event) does not call this __init__: pydantic calls a
    # model's own __init__ from its validator only when it is "custom", which would slow
    # every decode. Stored JSON cannot hold a non-finite number; allow_inf_nan guards the rest.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

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


class ImageResolved(Event):
    """A profile's image named by tag with `digest: resolve`, pinned at its first use: the
    digest the runtime pulled for `name` (later launches use it, whatever the tag moves to)."""

    name: str  # repository:tag, as the profile names it
    digest: str  # sha256:…
    runtime: str  # docker | podman


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
    # Where the block runs (harness.nodes.identity.local_host: FORGE_NODE or the hostname);
    # "": not recorded (blocks written before, a graph node's: its run's host says it).
    host: str = ""


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
    # The call's sandbox profile (harness/guard/sandbox.py: kind bwrap|none, writable
    # directories, network, gpus, variable names passed; never a value). {}: not recorded.
    sandbox: JSON = Field(default_factory=dict)


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


class LaunchPlanned(Event):
    """A deployment point's launch plan (harness/engines/plan.py), recorded before any of
    its processes starts: every command line, port, bootstrap port and device assignment."""

    point: str | None = None
    architecture: str
    entry_url: str
    plan: JSON
    plan_digest: str


class ProfileOp(BaseModel):
    """One entry of a profile's top list: an operator, kernel or function, its time over
    the capture (ms), its share of the ranked total and how many events or samples it had."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    total_ms: float
    share: float
    count: int


class PhaseOp(BaseModel):
    """One entry of a phase's table (harness/perf/phases.py): calls, total and mean time
    (ms), share of the phase, time per output token of the window (None: unknown) and the
    time of the calls a CUDA-graph replay launched."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    count: int
    total_ms: float
    mean_ms: float
    share: float
    per_token_ms: float | None = None
    graph_ms: float = 0.0


class ProfilePhase(BaseModel):
    """A capture's table for one phase (prefill, decode, ... ; harness/perf/phases.py)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    kind: str
    unit: str
    total_ms: float
    per_token_ms: float | None = None
    count: int
    steps: int = 0
    tokens: int = 0
    graph_replays: int = 0
    top: tuple[PhaseOp, ...] = ()


class ProfileCaptured(Event):
    """`forge perf capture`: an engine profiled under load (harness/perf/capture.py).
    `method` torch-profiler (SGLang's /start_profile, traces per rank), py-spy (the
    embedded engine's process sampled) or nsys (an Nsight Systems report's kernel summary,
    `forge perf nsys`); `traces` the trace artifacts' digests, named in `trace_names`;
    `kind`/`unit`/`total_ms`/`top` the summary (harness/perf/summary.py); `phases` the
    per-phase tables (phases.py; empty for py-spy); `options` the profiler options asked for
    (SGLang's /start_profile body, less output_dir); `load` the load run during the capture
    and `bench` its figures."""

    SCHEMA_VERSION: ClassVar[int] = 2  # 2: phases, options

    engine: str
    url: str
    method: Literal["torch-profiler", "py-spy", "nsys"]
    duration_s: float
    load: JSON = Field(default_factory=dict)
    bench: dict[str, float] = Field(default_factory=dict)
    traces: tuple[str, ...] = ()
    trace_names: tuple[str, ...] = ()
    kind: str
    unit: str
    total_ms: float
    samples: int
    top: tuple[ProfileOp, ...] = ()
    phases: tuple[ProfilePhase, ...] = ()
    options: JSON = Field(default_factory=dict)


@upcaster("ProfileCaptured", 1)
def _profile_captured_v1(payload: JSON) -> JSON:
    return {**payload, "phases": [], "options": {}}


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
    SCHEMA_VERSION: ClassVar[int] = 3  # 2: steps; 3: gates typed (GateResult)

    contract_hash: str
    point_hash: str | None = None
    candidate: JSON = Field(default_factory=dict)
    passed: bool
    verdict: Literal["pass", "fail", "inconclusive"]
    gates: list[GateResult] = Field(default_factory=list)  # one per gate, with the numbers
    steps: list[StepResult] = Field(default_factory=list)  # the verification path, in order
    evidence: list[str] = Field(default_factory=list)  # event ids / artifact digests
    # Every dimension the block's deployment differs in from the baseline's (topology, roles,
    # parallelism, engine flags, profile fields, code); [] for the baseline and for
    # verifications recorded before it was stated.
    differs: list[Difference] = Field(default_factory=list)


@upcaster("VerificationRecorded", 1)
def _verification_v1(payload: JSON) -> JSON:
    """v1 ran no steps of the verification path: none recorded."""
    return {**payload, "steps": []}


@upcaster("VerificationRecorded", 2)
def _verification_v2(payload: JSON) -> JSON:
    """v2's gates were plain mappings in two shapes (the loop's and the graph's)."""
    return {**payload, "gates": gates_from_stored(payload.get("gates", []))}


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


# --- agents (on the task stream; harness/agents/) ----------------------------------------


class ModelCalled(Event):
    """One call of a model tier: who (tier, model, family), why (`purpose`), what it cost, and
    the prompt and response as redacted artifacts. A failed call is data (`success`,
    `error`)."""

    tier: str
    model: str
    family: str = ""
    purpose: Literal["executor", "planner", "sub-agent", "reviewer"] = "executor"
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
    prompt_digest: str | None = None
    response_digest: str | None = None
    success: bool = True
    error: str | None = None


class AgentStepFailed(Event):
    """An agent's step that could not be taken, as data: malformed tool-call JSON, an unknown
    tool, a candidate outside the scope, an edit to the contract, a write outside the task's
    directories, a refusal, a timeout, an endpoint that is down."""

    tool: str | None = None
    reason: str
    arguments: JSON = Field(default_factory=dict)


class SkillsProvided(Event):
    """The skills an agent received for a block, chosen by task type and by retrieval on the
    block's sub-goal (score: the retrieval's cosine similarity; 1.0 for a type match)."""

    skills: list[str] = Field(default_factory=list)
    query: str = ""
    scores: dict[str, float] = Field(default_factory=dict)
    # Why retrieval was not used (embeddings off, the model could not load): the choice was
    # by task type only. None when the sub-goal was embedded.
    fallback: str | None = None


class ReviewRecorded(Event):
    """A cross-model adversarial review of a block's deliverable: approve, or object with
    reasons that point at evidence (an objection fails the verification)."""

    tier: str
    model: str
    family: str = ""
    verdict: Literal["approve", "object", "invalid"]
    reasons: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    response_digest: str | None = None


# --- the Safety Guard (harness/guard/) ---------------------------------------------------


class ProductionRefused(Event):
    """A call to a production endpoint that forge refused before sending it: `action` is
    `METHOD /path` (or `load` for probe traffic over the budget), `reason` says why. On the
    task's stream when a task made it, else on the `guard` stream."""

    url: str
    action: str
    reason: str


# --- the human gate (the `approvals` stream; harness/guard/approvals.py) ----------------
# An approval is bound to the digest of one exact action (kind, target, arguments: a push's
# commit range, a call's method and path, a candidate): projections/approvals.py folds them.

ApprovalKind = Literal["push", "production-call", "cleanup", "accept"]


class ApprovalRequested(Event):
    """An action that needs a person, waiting for one (`actor`: who asked). It can be granted
    or denied until `expires_at` (None: no expiry), and a grant is used at most once."""

    approval_id: str
    kind: ApprovalKind
    target: str
    action_digest: str
    arguments: JSON = Field(default_factory=dict)
    summary: str = ""
    expires_at: datetime | None = None


class ApprovalGranted(Event):
    """A person's yes to one request (`actor`: the human who decided; never an agent)."""

    approval_id: str
    action_digest: str
    reason: str


class ApprovalDenied(Event):
    approval_id: str
    reason: str


class ApprovalUsed(Event):
    """A granted approval spent on its action: once, under the approvals stream's version."""

    approval_id: str
    action_digest: str


class ApprovalRefused(Event):
    """An attempt the gate refused: an agent deciding, an approval offered for another
    action, or one used after it expired or was spent (`approval_id` None: none named)."""

    approval_id: str | None = None
    action_digest: str | None = None
    reason: str


# --- the MonoRepo (the `repos` stream; written by repos/record.py) -----------------------


class MonoRepoInitialized(Event):
    root: str
    manifest_digest: str  # artifact of the manifest as read
    members: list[str] = Field(default_factory=list)
    adopted: bool = False  # the root existed and was adopted


class RepoSnapshotted(Event):
    """A MonoRepo's exact state: the root and every member. `snapshot_id` is the digest of
    `members`, so one state is one id however often it is taken."""

    snapshot_id: str
    root: str
    members: list[MemberState] = Field(default_factory=list)
    reason: str = ""  # what took it: task definition, tool call, measurement, …


class RepoRestored(Event):
    snapshot_id: str
    root: str
    previous_snapshot_id: str  # the state replaced, snapshotted first (nothing is lost)


class PushApproved(Event):
    """Superseded by the human gate: a push's approval is now an `ApprovalGranted` of kind
    `push` on the `approvals` stream. No longer written or honoured; kept so that ledgers
    written before still decode."""

    approval_id: str
    member: str
    remote: str
    ref: str
    old: str
    new: str
    reason: str


class PushRefused(Event):
    member: str
    remote: str
    ref: str
    old: str
    new: str
    reason: str


class PushAllowed(Event):
    """A push to a protected ref that went ahead under `approval_id` (the approval is spent)."""

    member: str
    remote: str
    ref: str
    old: str
    new: str
    approval_id: str


class RepoSynced(Event):
    """One branch of a member brought onto its upstream: `fast-forward`, `rebased`,
    `up-to-date`, or `conflict` (with the files and hunks; the tree is left as it was)."""

    member: str
    branch: str
    upstream: str
    outcome: Literal["up-to-date", "fast-forward", "rebased", "conflict", "failed"]
    old: str | None = None
    new: str | None = None
    conflicts: list[SyncConflict] = Field(default_factory=list)
    error: str | None = None


# --- bookkeeping ------------------------------------------------------------------------


class CommandHandled(Event):
    """Marks a save as done, under stream `command:<id>`: a retried save with the same
    command id finds it and adds nothing. `appended` maps stream -> [first, last] version.
    `seal` (`codec.seal`) is the sha256 of the save's events as stored, their types and
    payloads in order: `forge check` finds a payload or type changed after the save, and
    the index reads a sealed payload of the current version without checking it again."""

    SCHEMA_VERSION: ClassVar[int] = 2  # 2: seal

    appended: dict[str, list[int]]
    positions: list[int] = Field(default_factory=list)
    seal: str | None = None


@upcaster("CommandHandled", 1)
def _command_handled_v1(payload: JSON) -> JSON:
    """v1 markers carry no seal: their saves are checked event by event."""
    return {**payload, "seal": None}


# --- task graph -------------------------------------------------------------------------
# Stream "graph:<graph id>". Node work (tool calls, verification) goes on the node's own task
# stream "task:<graph id>.<node id>" with the task events above; the graph stream holds what
# gates the graph: definitions, claims, verification outcomes, handoffs, rework.


class GraphDefined(Event):
    graph_id: str
    title: str = ""
    description: str = ""
    source: str | None = None  # the YAML file it came from
    graph_dir: str | None = None  # directory commands resolve {graph_dir} against
    spec_hash: str
    # The initial graph (graphspec NodeSpec / EdgeSpec dumps) in one event: folding one large
    # payload is ~10x faster than thousands of small events. Later changes: NodeAdded/EdgeAdded.
    nodes: list[JSON] = Field(default_factory=list)
    edges: list[JSON] = Field(default_factory=list)


class NodeAdded(Event):
    node: JSON  # a graphspec.NodeSpec dump
    reason: str = ""


class EdgeAdded(Event):
    edge: JSON  # a graphspec.EdgeSpec dump (by alias: from/to)
    reason: str = ""


class GraphRunStarted(Event):
    """A graph run's start; its actor is the person who started it (`forge graph run`, `--by`
    or the OS user), the node work it drives is the graph runner's on their behalf."""

    run_id: str
    jobs: int
    pid: int
    pid_start: str = ""  # /proc start time, so a reused pid is not mistaken for the runner
    host: str = ""
    resumed: bool = False
    repo_snapshot: str | None = None  # the MonoRepo's state its member repo nodes pin


class GraphRunFinished(Event):
    run_id: str
    outcome: Literal["completed", "stuck", "failed", "interrupted"]
    counts: dict[str, int] = Field(default_factory=dict)
    wall_s: float = 0.0


class NodeStarted(Event):
    """A worker's claim on a node, appended with the graph stream's expected version. The
    actor is the graph runner; `on_behalf_of` names the person who started the run (the
    actor of its GraphRunStarted), None for a run no person started."""

    SCHEMA_VERSION: ClassVar[int] = 2  # 2: on_behalf_of
    node: str
    attempt: int
    run_id: str
    worker: str
    pid: int
    on_behalf_of: str | None = None


@upcaster("NodeStarted", 1)
def _node_started_v1(payload: JSON) -> JSON:
    """v1 did not name the person a run worked for."""
    return {**payload, "on_behalf_of": None}


class NodeAbandoned(Event):
    """A claim whose worker or runner died mid-run; the node becomes runnable again."""

    node: str
    attempt: int
    reason: str


class NodeVerified(Event):
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: checks typed (GateResult)

    node: str
    attempt: int
    passed: bool
    checks: list[GateResult] = Field(default_factory=list)  # one per check, as the gates
    verification_event_id: UUID | None = None  # the VerificationRecorded on the task stream
    deliverable: dict[str, str] = Field(default_factory=dict)  # name -> artifact digest
    deliverable_digest: str | None = None


@upcaster("NodeVerified", 1)
def _node_verified_v1(payload: JSON) -> JSON:
    """v1's checks were the graph's plain {name, passed, detail, …} mappings."""
    return {**payload, "checks": gates_from_stored(payload.get("checks", []))}


class HandoffDelivered(Event):
    edge: str
    src: str
    dst: str
    attempt: int
    deliverable_digest: str | None = None
    verification_event_id: UUID | None = None


class HandoffRefused(Event):
    edge: str
    src: str
    dst: str
    reason: str


class NodeDelivered(Event):
    node: str
    attempt: int
    deliverable_digest: str | None = None
    duration_s: float = 0.0  # claim to delivery
    work_s: float = 0.0  # time inside the node's own commands


class NodeRejected(Event):
    """A direction rejected: it stays in the graph with the reason and its evidence."""

    node: str
    attempt: int = 0
    reason: str
    evidence: list[str] = Field(default_factory=list)
    duration_s: float = 0.0
    work_s: float = 0.0


class DeliverableInvalidated(Event):
    node: str
    reason: str
    evidence: list[str] = Field(default_factory=list)


class ReworkRequested(Event):
    """`node` must re-run: `origin` was reworked/invalidated and `path` carries it to `node`."""

    node: str
    origin: str
    trigger: Literal["rework", "invalidate", "control"] = "rework"
    reason: str
    path: list[str] = Field(default_factory=list)


# --- the Node Registry (`nodes` stream: harness/nodes/registry.py; `claims` stream:
# harness/nodes/claims.py). A "host" here is the registry's node: a machine with its
# accelerators; graph nodes (above) are steps of a task graph.


class GpuInfo(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    index: int
    uuid: str
    vendor: str = "nvidia"
    model: str = ""
    memory_mib: int = 0


class HostInventory(BaseModel):
    """What a host has: CPUs, memory, accelerators. `accelerator_note` says why none are
    listed when the host could not be asked (NVML absent), as opposed to having none."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    cpus: int
    memory_mib: int
    gpus: tuple[GpuInfo, ...] = ()
    accelerator_note: str = ""
    source: str = "psutil"  # psutil, psutil+nvml, ray


class HostRegistered(Event):
    """A host seen for the first time, or whose inventory changed."""

    host: str
    inventory: HostInventory


class GpuProcessesChanged(Event):
    """The set of compute processes on one GPU changed (observed at `at`)."""

    host: str
    gpu_uuid: str
    at: datetime
    pids: tuple[int, ...] = ()
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


class GpuWindow(BaseModel):
    """One GPU over one summary window. `idle_streak`: consecutive samples, ending at the
    window's end, in which the GPU had no compute process (a missed sample resets it, so a
    gap in observation never counts as idle)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    uuid: str
    samples: int
    util_mean: float = 0.0
    util_max: float = 0.0
    mem_used_max_mib: int = 0
    busy_samples: int = 0
    idle_streak: int = 0
    last_pids: tuple[int, ...] = ()


class HostSummarized(Event):
    """A window of a host's samples: CPU and memory, each GPU's utilisation, memory and
    compute processes. The samples themselves are the artifact `samples_artifact` (loaded
    into the index); the ledger keeps this summary."""

    host: str
    start: datetime
    end: datetime
    interval_s: float
    samples: int
    missed: int = 0  # samples due in the window but not taken
    cpu_pct_mean: float = 0.0
    cpu_pct_max: float = 0.0
    mem_used_max_mib: int = 0
    gpus: tuple[GpuWindow, ...] = ()
    nvml: str = "ok"  # "ok", or why GPUs could not be observed
    samples_artifact: str | None = None


class ResourceRef(BaseModel):
    """A claimable resource: a GPU (by UUID), a port, or a whole host."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    host: str
    kind: Literal["gpu", "port", "host"]
    id: str = ""

    def __str__(self) -> str:
        return f"{self.host}" if self.kind == "host" else f"{self.host}/{self.kind}:{self.id}"


class ClaimHolder(BaseModel):
    """Who holds a claim: a process on a host (pid with its start time), and what for."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    host: str
    pid: int
    pid_start: str = ""
    task: str | None = None
    graph: str | None = None
    node: str | None = None
    run_id: str | None = None


class ResourceClaimed(Event):
    """A lease on resources; the holder renews it with heartbeats every `heartbeat_s`."""

    claim_id: str
    resources: tuple[ResourceRef, ...]
    holder: ClaimHolder
    heartbeat_s: float
    purpose: str = ""


class ClaimHeartbeat(Event):
    claim_id: str


class ClaimReleased(Event):
    claim_id: str
    reason: str = ""


class GpuIdleSignal(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    uuid: str
    idle_streak: int | None  # None: no fresh observation of this GPU
    observed_at: datetime | None = None
    pids: tuple[int, ...] = ()


class StaleSignals(BaseModel):
    """The signals the stale-claim rule weighed. `eligible` only when all agree: the holder
    process is gone, the heartbeat is older than k intervals, and every claimed GPU showed no
    compute process for N consecutive fresh observations."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    holder_gone: bool | None  # None: cannot be checked from here (another host)
    holder_detail: str = ""
    heartbeat_age_s: float
    heartbeat_limit_s: float
    gpus: tuple[GpuIdleSignal, ...] = ()
    gpu_idle_needed: int = 0
    eligible: bool = False
    reasons: tuple[str, ...] = ()  # why not, when not eligible


class ClaimCleanedUp(Event):
    """A stale claim freed by the rule, with the signals that justified it, the processes it
    killed (only through the human gate) and the approval that allowed it."""

    claim_id: str
    signals: StaleSignals
    killed: tuple[int, ...] = ()
    approval_id: str | None = None


# --- diagnoses and endpoint monitoring (harness/diagnose/) --------------------------------


class LogEvidence(BaseModel):
    """One log line a rule matched: its 1-based number in the file, and its text."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    line: int
    text: str


class DiagnosisFinding(BaseModel):
    """A rule that fired: its name, what it says, and the evidence (the metric values over
    the window that made it fire, in scrape order; the matching log lines)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    rule: str
    summary: str
    metrics: dict[str, tuple[float | None, ...]] = Field(default_factory=dict)
    log_lines: tuple[LogEvidence, ...] = ()


class DiagnosisRecorded(Event):
    """`forge diagnose` of an endpoint: `samples` scrapes of its /metrics over
    [`start`, `end`], the log's tail read (`log_file`, `log_lines_read`), the rules applied
    and those that fired (`findings`; none: healthy). `window` holds the key metrics' values
    per scrape; `slo_ms` the SLO judged against (`ttft_ms.p99` -> milliseconds)."""

    url: str
    start: datetime
    end: datetime
    interval_s: float
    samples: int
    window: dict[str, tuple[float | None, ...]] = Field(default_factory=dict)
    log_file: str | None = None
    log_lines_read: int = 0
    slo_ms: dict[str, float] = Field(default_factory=dict)
    rules: tuple[str, ...] = ()
    findings: tuple[DiagnosisFinding, ...] = ()
    healthy: bool = True


class EndpointSummarized(Event):
    """A window of `forge monitor`'s scrapes of an endpoint's /metrics: per metric its last,
    minimum, maximum and mean over the window (`stats[metric] = (last, min, max, mean)`).
    The samples themselves are the artifact `samples_artifact` (loaded into the index's
    `endpoint_samples`); `errors` counts scrapes that failed (not in the samples)."""

    url: str
    start: datetime
    end: datetime
    interval_s: float
    samples: int
    missed: int = 0
    errors: int = 0
    last_error: str = ""
    stats: dict[str, tuple[float, float, float, float]] = Field(default_factory=dict)
    slo_ms: dict[str, float] = Field(default_factory=dict)  # `ttft_ms.p99` -> ms, if given
    samples_artifact: str | None = None


class ReproductionRecorded(Event):
    """`forge reproduce` of a recorded block (harness/loop/reproduce.py): its point
    (`point_hash`, `profile` "service@rev" with `profile_hash`, `model_digest`,
    `repo_snapshot`) re-deployed, the same workload (`traffic`, prompt seed) run `repeats`
    times, judged per metric against the recorded runs (`recorded_runs`: their event ids).
    `figures`: one per judged metric, primary first: {metric, recorded, new (medians),
    ratio, band, reproduced, recorded_runs, new_runs (values)}; `band_rule` says how the
    bands were set. On the `reproductions` stream; `task_id`/`block_id` name what was
    reproduced."""

    target: str  # the ID as given (an event id, or TASK:BLOCK)
    point_hash: str
    profile: str
    profile_hash: str | None = None
    model_digest: str | None = None
    repo_snapshot: str | None = None
    candidate: JSON = Field(default_factory=dict)
    traffic: JSON = Field(default_factory=dict)
    seed: int | None = None
    repeats: int
    recorded_runs: list[str] = Field(default_factory=list)
    figures: list[JSON] = Field(default_factory=list)
    band_rule: str = ""
    errors: list[str] = Field(default_factory=list)  # new runs that failed, with why
    reproduced: bool
    # The recorded runs' host state vs the re-run's (harness/nodes/host_state.py `compare`):
    # `not comparable: recorded at load 5.1 on 2 cores, now 0.4 ...`, or None.
    not_comparable: str | None = None
    wall_s: float = 0.0
