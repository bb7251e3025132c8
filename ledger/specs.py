"""Specs: deployment points, runtime profiles and task definitions, loaded from YAML.

Contracts:
- Every spec is a frozen pydantic model that forbids unknown fields. `spec_hash(spec)` is the
  sha256 of its canonical JSON (sorted keys, defaults filled, file locations excluded), so key
  order, comments and formatting never change a hash.
- `load_*` read YAML (the bounded reader in `yamlio`) and raise `SpecError` whose message
  has one line per problem: `FILE:LINE: field.path: what is wrong` (YAML syntax errors,
  duplicate keys and validation errors alike). Nothing is recorded by loading.
- A task references its deployment point (and optionally its runtime profile) by a path
  relative to the task file; a point names its profile by service + revision and may give
  `runtime_profile.file`, also relative to itself.
- `diff_specs(a, b)` names the changed dimensions as dotted paths.

Why one module past 500 lines: the three spec kinds (point, profile, task) are one vocabulary
sharing the `Spec` base, its validators and `SPEC_KINDS`; parsing, hashing, diffing and
applying a candidate work on all three alike. Reading YAML lives in `yamlio`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from .candidate_keys import (
    ARCHITECTURE_ROLES,
    apply_point_keys,
    canonical_value,
    dimension_of,
    same_value,
)
from .clock import digest
from .correctness import with_default_correctness
from .errors import SpecError
from .ids import LEDGER_CONTEXT, InvalidIdError, check_id, from_ledger, shown
from .numbers import bad_number, field_path

if TYPE_CHECKING:
    import yaml


class Spec(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    # Fields added after specs of this kind were first hashed, with the value that means
    # "not used": left out of the stored shape while they hold it, so a spec that does not
    # use them keeps the hash (and the stored shape) it had before they existed.
    OMIT_WHEN: ClassVar[dict[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _omit_unused_new_fields(self, handler: Any) -> Any:
        data = handler(self)
        if self.OMIT_WHEN and isinstance(data, dict):
            for k, unused in self.OMIT_WHEN.items():
                if k in data and data[k] == unused:
                    del data[k]
        return data

    @model_validator(mode="before")
    @classmethod
    def _storable_numbers(cls, data: Any) -> Any:
        """Free-form parts (a profile's `config`, scope values) take any value: refuse NaN,
        infinities and integers over 64 bits there too, before they can reach an event."""
        if isinstance(data, dict):
            bad = bad_number(data)
            if bad is not None:
                raise ValueError(f"{field_path('', bad[0])}: {bad[1]}")
        return data


# --- deployment point -------------------------------------------------------------------


Modality = Literal["text", "image", "video", "audio"]


def _text_only() -> list[Modality]:
    return ["text"]


class ModelRef(Spec):
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"experts": None}
    name: str
    source: str  # local path, hub id, or forge:<generated-model>
    revision: str = "main"
    modalities: list[Modality] = Field(default_factory=_text_only)
    # Routed experts of a MoE model, when known: the plan refuses an EP size that does not
    # divide them (plus EPLB's redundant experts).
    experts: int | None = Field(None, ge=1)

    @field_validator("revision", mode="before")
    @classmethod
    def _rev_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) else v


class Distribution(Spec):
    """A length distribution: fixed (`mean` only) or uniform in [min, max]."""

    kind: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    mean: float
    min: float | None = None
    max: float | None = None
    std: float | None = None


class Traffic(Spec):
    input_len: int | Distribution = 128
    output_len: int | Distribution = 64
    range_ratio: float = Field(1.0, gt=0, le=1)
    concurrency: int | None = Field(None, ge=1)
    request_rate: float | None = Field(None, gt=0)  # requests/s; None with concurrency = closed
    num_prompts: int = Field(64, ge=1)
    media_count: int = Field(0, ge=0)
    resolution: str | None = None  # e.g. "1024x1024" for image traffic
    prefix_reuse: float = Field(0.0, ge=0, le=1)  # share of the prompt reused across requests
    dataset: str = "random"

    @model_validator(mode="after")
    def _load_shape(self) -> Traffic:
        if self.concurrency is None and self.request_rate is None:
            raise ValueError("give concurrency or request_rate")
        return self


Percentiles = dict[Literal["p50", "p90", "p95", "p99", "mean"], float]


class SLO(Spec):
    ttft_ms: Percentiles = Field(default_factory=dict)
    tpot_ms: Percentiles = Field(default_factory=dict)
    e2e_ms: Percentiles = Field(default_factory=dict)
    throughput_floor: float | None = Field(None, ge=0)  # output tokens/s


class Scenario(Spec):
    modality: Literal["text", "image", "video", "audio", "multimodal"] = "text"
    traffic: Traffic
    slo: SLO = Field(default_factory=SLO)


class Parallelism(Spec):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)


class Role(Spec):
    role: Literal["prefill", "decode", "encode", "colocated"]
    count: int = Field(1, ge=1)
    parallelism: Parallelism = Field(default_factory=Parallelism)


class Topology(Spec):
    architecture: Literal["colocated", "pd", "epd"] = "colocated"
    parallelism: Parallelism = Field(default_factory=Parallelism)
    roles: list[Role] = Field(default_factory=list)

    @model_validator(mode="after")
    def _roles_fit(self, info: ValidationInfo) -> Topology:
        if from_ledger(info):  # checked when it entered the ledger
            return self
        arch, roles = self.architecture, ARCHITECTURE_ROLES[self.architecture]
        have = {r.role for r in self.roles}
        if other := list(dict.fromkeys(r.role for r in self.roles if r.role not in roles)):
            raise ValueError(f"architecture {arch} has no {', '.join(other)} role "
                             f"(its roles: {', '.join(roles)})")
        if arch != "colocated" and (missing := [r for r in roles if r not in have]):
            raise ValueError(f"architecture {arch} needs roles {', '.join(roles)} "
                             f"(missing: {', '.join(missing)})")
        return self


class ProfileRef(Spec):
    service: str
    rev: int = Field(ge=1)
    file: str | None = None  # where to load it from, relative to the point file (not hashed)


class Accelerator(Spec):
    """`count` devices on each of `nodes` hosts (one host unless said)."""

    OMIT_WHEN: ClassVar[dict[str, Any]] = {"nodes": 1}
    vendor: Literal["nvidia", "amd", "intel", "cpu", "other"]
    model: str
    count: int = Field(1, ge=1)
    nodes: int = Field(1, ge=1)
    memory_gb: float | None = Field(None, gt=0)
    driver: str | None = None
    runtime: str | None = None  # e.g. "cuda 12.9", "rocm 7.0"


class DeploymentPoint(Spec):
    name: str | None = None
    model: ModelRef
    scenario: Scenario
    topology: Topology = Field(default_factory=Topology)
    runtime_profile: ProfileRef
    accelerator: Accelerator


# --- runtime profile --------------------------------------------------------------------


IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


RESOLVE_DIGEST = "resolve"  # image.digest: pinned at first use (harness/engines/image_resolve.py)


class Image(Spec):
    name: str
    # sha256:… ; `resolve`: the digest the runtime pulls for the tag at the first launch,
    # recorded (ImageResolved) and used from then on; None only for a local profile.
    digest: str | None = None

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or from_ledger(info) or IMAGE_DIGEST.fullmatch(v) or v == RESOLVE_DIGEST:
            return v
        raise ValueError(f"must be sha256: and 64 lowercase hex digits (as `docker inspect` "
                         f"shows it), or `{RESOLVE_DIGEST}` (pinned at first use), got "
                         f"{shown(v, 100)}")


class VersionedPart(Spec):
    kind: str
    version: str | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _v_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) else v


class RuntimeProfile(Spec):
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"image_fallback": "refuse", "weights": "real"}
    service: str
    rev: int = Field(ge=1)
    engine: Literal["sglang", "hf", "external"]
    config: dict[str, Any] = Field(default_factory=dict)  # the server flags, as a mapping
    image: Image | None = None
    # With an image and no container runtime on the host (docker, podman): `refuse` the
    # deploy, or run the `local` install instead (harness/engines/image.py).
    image_fallback: Literal["local", "refuse"] = "refuse"
    framework: VersionedPart | None = None  # e.g. {kind: sglang, version: 0.5.23}
    device_runtime: VersionedPart = Field(
        default_factory=lambda: VersionedPart(kind="cpu"))  # cuda | rocm | cpu
    collectives: VersionedPart | None = None  # e.g. {kind: nccl, version: 2.27}
    endpoint: str | None = None  # engine: external only
    notes: str = ""
    # `dummy`: perf-only sweeps skip real weights (SGLang's `--load-format dummy`: random
    # weights, real shapes); refused where a gate needs real outputs (models/dummy_weights.py).
    weights: Literal["real", "dummy"] = "real"

    @model_validator(mode="after")
    def _engine_fields(self) -> RuntimeProfile:
        if self.engine == "external" and not self.endpoint:
            raise ValueError("engine external needs endpoint")
        if self.weights == "dummy":
            if self.engine != "sglang":
                raise ValueError(f"weights: dummy: engine {self.engine} has no dummy-weights "
                                 "load (only sglang: --load-format dummy)")
            fmt = self.config.get("load_format")
            if fmt not in (None, "dummy"):
                raise ValueError(f"weights: dummy contradicts config.load_format: {fmt}")
        return self


# --- task definition --------------------------------------------------------------------

TASK_TYPES = (
    "kernel", "communication", "engine-integration", "deployment-tuning", "evaluation",
    "diagnosis", "upstream-sync", "scheduler", "profiling",
    # the kinds of numeric change whose default correctness gate is accuracy, and routing
    # (ledger/correctness.py: the table of defaults per type)
    "quantization", "moe-backend", "attention-backend", "speculative-decoding", "routing",
)


# A scope is enumerated (grid sweeps list every candidate): bound its size.
MAX_SCOPE_VALUES = 100_000


class Range(Spec):
    """A numeric range a scope dimension may take: min..max by step (step None: continuous)."""

    min: float
    max: float
    step: float | None = Field(None, gt=0)
    integer: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        if self.step is not None and (self.max - self.min) / self.step >= MAX_SCOPE_VALUES:
            raise ValueError(f"min..max by step {self.step} has more than {MAX_SCOPE_VALUES} "
                             "values (raise the step)")
        return self

    def count(self) -> int | None:
        if self.step is None:
            return None
        return int(math.floor((self.max - self.min) / self.step + 1e-9)) + 1

    def values(self) -> list[float | int] | None:
        n, step = self.count(), self.step
        if n is None or step is None:  # count() is None exactly when step is
            return None
        vals = [self.min + i * step for i in range(n)]
        return [int(round(v)) for v in vals] if self.integer else [round(v, 9) for v in vals]

    def contains(self, v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) \
            and self.min <= v <= self.max and (not self.integer or float(v).is_integer())


class Gate(Spec):
    """One gate. Shapes: {metric, vs_baseline: ratio, at_least|at_most} (relative),
    {metric, at_least|at_most} (absolute, e.g. an SLO or token_match), stability
    {repeats, max_cv, max_failed_requests[, metric]}, and accuracy {kind: accuracy, task[,
    margin, limit, endpoint]}: lm_eval's `task` on the candidate's engine, non-inferior to the
    baseline's within `margin` (harness/bench/accuracy.py; `kind` is not stored: `task` says
    it)."""

    # The accuracy fields came after gates were first hashed.
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"task": None, "margin": None, "limit": None,
                                           "endpoint": None}
    name: str
    metric: str | None = None
    vs_baseline: Literal["ratio"] | None = None
    at_least: float | None = None
    at_most: float | None = None
    repeats: int | None = Field(None, ge=1)
    max_cv: float | None = Field(None, ge=0)
    max_failed_requests: int | None = Field(None, ge=0)
    task: str | None = Field(None, min_length=1)
    margin: float | None = Field(None, ge=0, le=1)
    limit: int | None = Field(None, ge=1)
    endpoint: Literal["completions", "chat"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _accuracy_kind(cls, data: Any) -> Any:
        """`kind: accuracy` is accepted on input and implied by `task` once stored."""
        if isinstance(data, dict) and "kind" in data:
            data = dict(data)
            kind = data.pop("kind")
            if kind != "accuracy":
                raise ValueError(f"kind: {kind!r}: only accuracy is given as a kind (the "
                                 "other gate kinds follow from their fields)")
            if data.get("task") is None:
                raise ValueError(f"gate {data.get('name')}: task: an accuracy gate needs "
                                 "an lm_eval task")
        return data

    @property
    def margin_or_default(self) -> float:
        return 0.02 if self.margin is None else self.margin

    @property
    def kind(self) -> str:
        if self.task is not None:
            return "accuracy"
        if self.max_cv is not None or self.max_failed_requests is not None \
                or (self.repeats is not None and self.metric is None):
            return "stability"
        return "relative" if self.vs_baseline else "absolute"

    @model_validator(mode="after")
    def _shape(self) -> Gate:
        if self.kind == "accuracy":
            other = [k for k in ("metric", "vs_baseline", "at_least", "at_most", "repeats",
                                 "max_cv", "max_failed_requests") if getattr(self, k) is not None]
            if other:
                raise ValueError(f"gate {self.name}: {other[0]}: not a field of an accuracy gate")
            return self
        extra = [k for k in ("margin", "limit", "endpoint") if getattr(self, k) is not None]
        if extra:
            raise ValueError(f"gate {self.name}: {extra[0]}: only an accuracy gate (task) has it")
        if self.kind == "stability":
            return self
        if self.metric is None:
            raise ValueError(f"gate {self.name}: needs metric")
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"gate {self.name}: give exactly one of at_least, at_most")
        return self


class ReviewSpec(Spec):
    """Cross-model adversarial review, a gate of the contract: the model of `tier`
    ([models.<tier>] in forge.toml, of another family than the executor's) approves each
    candidate's deliverable or objects with reasons pointing at evidence; `timeout_s` bounds
    its call (harness/loop/review.py)."""

    tier: str = Field(min_length=1)
    timeout_s: float = Field(300, gt=0)


class HostLimits(Spec):
    """When a run's host state (harness/nodes/host_state.py) contaminates it: load per core
    and other processes' CPU (cores' share) above these bounds, a foreign compute process on
    the GPUs, a throttled GPU. `refuse`: the gates leave such runs out; `flag`: kept, said."""

    max_load_per_core: float = Field(1.5, gt=0)
    max_foreign_cpu: float = Field(0.5, gt=0)
    foreign_gpu: Literal["refuse", "flag"] = "refuse"
    throttle: Literal["refuse", "flag"] = "refuse"


class Contract(Spec):
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"review": None, "human": None, "noise": None,
                                           "host": None, "more_runs": 0, "correctness": None}
    gates: list[Gate] = Field(min_length=1)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    bootstrap: int = Field(2000, ge=100)
    seed: int = 0
    review: ReviewSpec | None = None
    # `required`: the loop's acceptance waits for a person's approval (forge approve; the
    # human gate, harness/guard/approvals.py).
    human: Literal["required"] | None = None
    # `learned`: relative gates also need the gain to exceed the point's noise band learned
    # from history, and quote it; inconclusive gates say how many runs would decide
    # (harness/loop/gates.py, projections/noise.py). None: gates judge as before.
    noise: Literal["learned"] | None = None
    # The host-state limits the gates and `forge reproduce` apply (HostLimits); None: runs
    # record their host state, nothing is judged on it.
    host: HostLimits | None = None
    # Up to this many more runs per block, one at a time after the repeats, while one more
    # could decide a gate (unstable, trending, inconclusive: gates.py `more_runs_reason`).
    more_runs: int = Field(0, ge=0, le=50)
    # `default`: the task type's default correctness gate (ledger/correctness.py) joins the
    # gates when none of them checks correctness; the task's definition stores it expanded.
    # A new engine-judged definition that says nothing gets `default`; `none` opts out.
    correctness: Literal["default", "none"] | None = None

    @model_validator(mode="after")
    def _unique(self) -> Contract:
        names = [g.name for g in self.gates]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate gate names {dup}")
        if self.review is not None and "review" in names:
            raise ValueError("gate name 'review' is the review's own verdict; rename the gate")
        return self

    @property
    def repeats(self) -> int:
        return max([g.repeats for g in self.gates if g.repeats] or [3])

    @property
    def primary(self) -> Gate | None:
        """The gate whose metric measures progress: first relative gate, else first absolute."""
        for kind in ("relative", "absolute"):
            for g in self.gates:
                if g.kind == kind:
                    return g
        return None


class StartFrom(Spec):
    """The handoff a successor task starts from (`forge task new --from TASK`): the prior
    task's exit and its last block's handoff, as they stood when the successor was defined."""

    task_id: str
    exit_state: str | None = None
    exit_reason: str = ""
    handoff: str | None = None  # the exit's handoff text
    state_reached: str = ""
    findings: list[str] = Field(default_factory=list)
    next_sub_goal: str | None = None


class Context(Spec):
    """What a task starts from. `repos`: MonoRepo members at a ref (`member@ref`; the commit
    it names is recorded); `prior_tasks`: defined tasks whose exits, handoffs and best results
    reach the agent; `start_from`: the handoff of the task it follows up."""

    OMIT_WHEN: ClassVar[dict[str, Any]] = {"start_from": None}
    repos: list[str] = Field(default_factory=list)  # snapshot refs, e.g. sglang@<sha>
    prior_tasks: list[str] = Field(default_factory=list)
    notes: str = ""
    start_from: StartFrom | None = None


class ExitCriteria(Spec):
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"max_tokens": None, "max_cost_usd": None}
    when: Literal["all_gates_pass", "best_in_scope"] = "all_gates_pass"
    max_blocks: int = Field(8, ge=1)
    max_wall_s: float = Field(3600, gt=0)
    no_progress_blocks: int = Field(3, ge=1)
    # Model budgets, summed over the task's ModelCalled events: over either, failed-budget.
    max_tokens: int | None = Field(None, ge=1)
    max_cost_usd: float | None = Field(None, gt=0)



AGENT_MAX_STEPS = 12  # an agent executor's tool-calling turns per decision, by default


class ExecutorSpec(Spec):
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"tier": None, "max_steps": AGENT_MAX_STEPS}
    kind: Literal["manual", "sweep", "command", "agent"] = "sweep"
    # halving: successive halving over the scope's axes (harness/loop/search.py)
    strategy: Literal["grid", "random", "halving"] = "grid"
    seed: int = 0
    samples: int | None = Field(None, ge=1)  # random: how many candidates to draw
    argv: list[str] = Field(default_factory=list)  # command: the policy executable
    timeout_s: float = Field(600, gt=0)  # command: its run; agent: one whole decision
    # agent: the model tier ([models.<tier>]; None: from routing) and its turns per decision
    tier: str | None = Field(None, min_length=1)
    max_steps: int = Field(AGENT_MAX_STEPS, ge=1, le=200)

    @model_validator(mode="after")
    def _argv(self) -> ExecutorSpec:
        if self.kind == "command" and not self.argv:
            raise ValueError("executor kind command needs argv")
        return self



class EvaluatorSpec(Spec):
    kind: Literal["engine", "command"] = "engine"
    argv: list[str] = Field(default_factory=list)
    timeout_s: float = Field(600, gt=0)

    @model_validator(mode="after")
    def _argv(self) -> EvaluatorSpec:
        if self.kind == "command" and not self.argv:
            raise ValueError("evaluator kind command needs argv")
        return self


CODE_PREFIX = "code."  # a candidate's key `code.<member>`: a commit of that MonoRepo member


class CodeSpec(Spec):
    """The MonoRepo members a task may change. A block's candidate then names a commit of each
    (`code.<member>`: a commit id or ref, `worktree` for the task worktree's current state,
    `patch:<file>` relative to the task file, or `upstream`: onto the member's upstream);
    the loop builds it in the task's worktree and measures it. Without `code.<member>` a
    block runs the member at its pinned commit: the commit `base` names for it (a ref or
    commit, resolved to a commit when the task is defined), else the member's commit when
    the task was defined."""

    OMIT_WHEN: ClassVar[dict[str, Any]] = {"base": {}}
    members: list[str] = Field(min_length=1)
    build: bool = True  # run each member's manifest build command before measuring
    keep_worktrees: bool = False  # leave the task's worktrees when it exits
    base: dict[str, str] = Field(default_factory=dict)  # member -> the baseline's commit

    @field_validator("members")
    @classmethod
    def _members(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if from_ledger(info):
            return v
        if len(set(v)) != len(v):
            raise ValueError("members listed twice")
        for m in v:
            try:
                check_id(m, "member name")
            except InvalidIdError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _base(self) -> CodeSpec:
        for m, ref in self.base.items():
            if m not in self.members:
                raise ValueError(f"base names member {shown(m)}, not one of code.members "
                                 f"{self.members}")
            if not ref.strip():
                raise ValueError(f"base.{m}: empty ref")
        return self


class RoutingSpec(Spec):
    model_tier: Literal["none", "small", "large", "human"] | None = None
    agent_topology: Literal["single", "planner-executor", "executor-reviewer"] | None = None
    escalate_after: int | None = Field(None, ge=1)  # no-progress blocks before tier goes up


# The loop's own phases, as a task's `verification:` path names them (the default path).
VERIFICATION_PHASES = ("baseline", "measure", "gates", "decide")


_DIAGNOSE_SLO = ("ttft_ms", "tpot_ms")
_DIAGNOSE_STATS = ("p50", "p90", "p95", "p99", "mean")


class DiagnoseCheck(Spec):
    """A `diagnose` verification step's check (harness/diagnose/collect.py): `samples`
    scrapes of `url`'s /metrics `interval_s` apart, the tail of `log` (relative to the task
    file's directory) when given, against `slo` (milliseconds by `ttft_ms.p99` and such; a
    bare `ttft_ms` means its p99)."""

    url: str
    samples: int = Field(3, ge=1, le=10_000)
    interval_s: float = Field(0.5, ge=0.01, le=3600)
    log: str | None = None
    slo: dict[str, float] = Field(default_factory=dict)

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, ms in v.items():
            metric, _, stat = key.partition(".")
            if metric not in _DIAGNOSE_SLO or (stat or "p99") not in _DIAGNOSE_STATS:
                raise ValueError(f"slo {key!r}: expected {' or '.join(_DIAGNOSE_SLO)} "
                                 f"(optionally .{'/.'.join(_DIAGNOSE_STATS)})")
            if not ms > 0:
                raise ValueError(f"slo {key!r}: {ms!r} is not a positive number of ms")
            out[f"{metric}.{stat or 'p99'}"] = float(ms)
        return out


class VerificationStep(Spec):
    """A command step of a task's verification path: `argv`, or `bash -c sh`, run after the
    block's measurements in the task file's directory; it passes when it exits 0 within
    `timeout_s`. Placeholders in argv/sh: {python} (forge's interpreter), {task_dir}.
    Or a `diagnose` step: the endpoint diagnosed (`forge diagnose`'s rules), passing when no
    rule fired."""

    OMIT_WHEN: ClassVar[dict[str, Any]] = {"diagnose": None}

    name: str
    argv: list[str] | None = None
    sh: str | None = None
    timeout_s: float = Field(300, gt=0)
    diagnose: DiagnoseCheck | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str, info: ValidationInfo) -> str:
        if from_ledger(info):
            return v
        if v in VERIFICATION_PHASES:
            raise ValueError(f"step name {v!r} is a loop phase; give the command step "
                             "another name")
        try:
            return check_id(v, "verification step name", part=True)
        except InvalidIdError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _one_command(self) -> VerificationStep:
        given = [self.argv is not None, self.sh is not None, self.diagnose is not None]
        if sum(given) != 1:
            raise ValueError(f"verification step {self.name!r}: give exactly one of argv, sh, "
                             "diagnose")
        if self.argv is not None and not self.argv:
            raise ValueError(f"verification step {self.name!r}: argv is empty")
        return self


def _step_kind(v: Any) -> str:
    return "phase" if isinstance(v, str) else "command"


# A step of a verification path: a phase name, or a command step (a mapping).
VerificationEntry = Annotated[
    Annotated[str, Tag("phase")] | Annotated[VerificationStep, Tag("command")],
    Discriminator(_step_kind),
]


def _loop_phases() -> list[VerificationEntry]:
    return list(VERIFICATION_PHASES)


def step_name(step: str | VerificationStep) -> str:
    return step if isinstance(step, str) else step.name


def _scope_kind(v: Any) -> str:
    return "range-values" if isinstance(v, dict | Range) else "list-values"


ScopeValue = Annotated[
    Annotated[list[Any], Tag("list-values")] | Annotated[Range, Tag("range-values")],
    Discriminator(_scope_kind),
]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SandboxSpec(Spec):
    """What a task's recorded tool calls may reach (harness/guard/sandbox.py): `secret_env`,
    the names of secret variables passed from forge's environment (values never recorded;
    not `secrets:`, a name whose values redaction would hide); `env`, other variables passed
    through by name; `network`; `gpus`, the claimed devices (CUDA_VISIBLE_DEVICES);
    `writable`, absolute directories its calls may write besides the task's own (a graph's
    loop task: `{workdir}`, filled in by the graph runner); `endpoints`, servers on this
    host's loopback (`http[s]://host:port`, host `localhost`, `127.x.x.x` or `[::1]`) its
    calls reach with the network otherwise off (harness/guard/endpoint_relay.py), each
    as `scheme://host:port` (the host in lower case, the port filled in)."""

    OMIT_WHEN: ClassVar[dict[str, Any]] = {"endpoints": []}
    secret_env: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    network: bool = False
    gpus: list[str] = Field(default_factory=list)
    writable: list[str] = Field(default_factory=list)
    endpoints: list[str] = Field(default_factory=list)

    @field_validator("secret_env", "env")
    @classmethod
    def _names(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if from_ledger(info):
            return v
        for name in v:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{shown(name)} is not an environment variable name")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if from_ledger(info):
            return v
        for g in v:  # an index or a UUID, as CUDA_VISIBLE_DEVICES takes them
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9:/_-]*", g):
                raise ValueError(f"gpu {shown(g)} is not a device index or UUID")
        return v

    @field_validator("writable")
    @classmethod
    def _writable(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if from_ledger(info):
            return v
        for d in v:
            if not Path(d).expanduser().is_absolute():
                raise ValueError(f"writable {shown(d)}: give an absolute directory")
        return v

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if from_ledger(info):
            return v
        return list(dict.fromkeys(loopback_endpoint(e) for e in v))


_DEFAULT_PORT = {"http": 80, "https": 443}


def loopback_endpoint(text: str) -> str:
    """`scheme://host:port` of a sandbox endpoint (SandboxSpec.endpoints): http or https, a
    host on this machine's loopback, no path, query or user; ValueError saying which part
    is wrong (one line)."""
    try:
        u = urlsplit(str(text).strip())
        port = u.port
    except ValueError as e:
        raise ValueError(f"endpoint {shown(text)}: {e}") from None
    if u.scheme not in _DEFAULT_PORT:
        raise ValueError(f"endpoint {shown(text)}: scheme must be http or https "
                         "(http://127.0.0.1:30000)")
    host = (u.hostname or "").lower()
    if not host:
        raise ValueError(f"endpoint {shown(text)}: no host (http://127.0.0.1:30000)")
    if u.username or u.password or u.path not in ("", "/") or u.query or u.fragment:
        raise ValueError(f"endpoint {shown(text)}: give scheme://host:port only (no user, "
                         "path or query): the call may use any path of that server")
    if not _loopback(host):
        raise ValueError(f"endpoint {shown(text)}: {host} is not this host's loopback "
                         "(localhost, 127.x.x.x, [::1]); a call reaches another host only "
                         "with sandbox.network: true")
    shown_host = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{shown_host}:{port or _DEFAULT_PORT[u.scheme]}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TaskDefinition(Spec):
    OMIT_WHEN: ClassVar[dict[str, Any]] = {"code": None, "sandbox": None}
    id: str | None = None  # the one id rule (ledger.ids); else the file name, checked alike
    title: str | None = None
    type: Literal[TASK_TYPES]  # type: ignore[valid-type]
    goal: str = Field(min_length=1)
    point: str  # path of the deployment point file, relative to the task file
    profile: str | None = None  # path of the runtime profile file (else point's reference)
    scope: dict[str, ScopeValue] = Field(default_factory=dict)
    context: Context = Field(default_factory=Context)
    contract: Contract
    # The verification path, run in order at each block's verification: the loop's phases
    # (VERIFICATION_PHASES) and command steps; the contract's gates are judged at `gates`.
    verification: list[VerificationEntry] = Field(default_factory=_loop_phases)
    exit: ExitCriteria = Field(default_factory=ExitCriteria)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    code: CodeSpec | None = None  # members of the MonoRepo the task changes
    sandbox: SandboxSpec | None = None  # what its tool calls may reach (default: nothing)

    @model_validator(mode="before")
    @classmethod
    def _default_correctness(cls, data: Any, info: ValidationInfo) -> Any:
        """The type's correctness gate, unless one is given: asked for (`correctness:
        default`), or a new engine-judged definition that says nothing."""
        return with_default_correctness(data, new=not from_ledger(info))

    @field_validator("id")
    @classmethod
    def _id(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or from_ledger(info):  # checked when it entered the ledger
            return v
        try:
            return check_id(v, "task id")
        except InvalidIdError as e:
            raise ValueError(str(e)) from None

    @field_validator("verification")
    @classmethod
    def _verification(cls, v: list[str | VerificationStep], info: ValidationInfo
                      ) -> list[str | VerificationStep]:
        if from_ledger(info):  # a ledger may hold any text: the loop records it as not runnable
            return v
        for s in v:
            if isinstance(s, str) and s not in VERIFICATION_PHASES:
                raise ValueError(f"step {shown(s)} is not a loop phase "
                                 f"({', '.join(VERIFICATION_PHASES)}); a command step is a "
                                 "mapping {name, argv} or {name, sh}")
        names = [step_name(s) for s in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate verification steps {dup}")
        if "gates" not in names:
            raise ValueError("the path must name `gates`: where the contract's gates judge "
                             "the block")
        return v

    @field_validator("scope")
    @classmethod
    def _scope(cls, v: dict[str, ScopeValue]) -> dict[str, ScopeValue]:
        for key, allowed in v.items():
            if "." not in key:
                raise ValueError(f"scope key {key!r} must name a dimension like engine.<flag>")
            if isinstance(allowed, list) and not allowed:
                raise ValueError(f"scope {key}: empty list of allowed values")
        sizes = [a.count() if isinstance(a, Range) else len(a) for a in v.values()]
        if math.prod(n for n in sizes if n) > MAX_SCOPE_VALUES:
            raise ValueError(f"scope has more than {MAX_SCOPE_VALUES} combinations")
        return v


SPEC_KINDS: dict[str, type[Spec]] = {
    "point": DeploymentPoint, "profile": RuntimeProfile, "task": TaskDefinition}
# Fields that say where something is, not what it is: never part of a hash.
_LOCATION_FIELDS = {"file"}


def canonical(spec: Spec) -> dict[str, Any]:
    """The spec's one stored shape (what events carry: `DeploymentPointPinned.point`,
    `RuntimeProfileRevised.profile`, `TaskDefined.definition`); read back with `stored_*`."""
    data = spec.model_dump(mode="json")
    if isinstance(spec, DeploymentPoint):
        data["runtime_profile"] = {k: v for k, v in data["runtime_profile"].items()
                                   if k not in _LOCATION_FIELDS}
    return data


def stored_point(data: Any) -> DeploymentPoint:
    """A deployment point as the ledger stores it (`canonical`), read back: checks of input
    only (an id's form, a topology's roles) are not applied again (pydantic's
    ValidationError for a mapping that is not a point)."""
    return DeploymentPoint.model_validate(data, context=LEDGER_CONTEXT)


def stored_profile(data: Any) -> RuntimeProfile:
    """A runtime profile as the ledger stores it (`canonical`), read back as `stored_point`."""
    return RuntimeProfile.model_validate(data, context=LEDGER_CONTEXT)


def spec_hash(spec: Spec) -> str:
    return digest(canonical(spec))


def scope_allows(scope: dict[str, ScopeValue], key: str, value: Any) -> bool:
    """Whether `value`, spelled as the scope's own value (candidate_keys.canonical_value), is
    one the scope allows for `key`: compared by kind too (`1` is not `True` unless the
    canonical spelling made it so)."""
    allowed = scope.get(key)
    if allowed is None:
        return False
    value = canonical_value(allowed, value)
    if isinstance(allowed, Range):
        return allowed.contains(value)
    return any(same_value(value, a) for a in allowed)


# --- parse and load ---------------------------------------------------------------------


def parse_spec(kind: str, data: Any, *, path: str | Path = "<spec>",
               node: yaml.Node | None = None) -> Spec:
    """Validate `data` as a spec of `kind`; problems carry the YAML line when `node` is given."""
    # For start-up time: the YAML reader loads for a spec file, not for a spec read back from
    # the ledger (Task Memory's contract: `forge task memory`).
    from .secrets.spec_check import secret_problems
    from .yamlio import dotted_path, line_of, number_problems

    cls = SPEC_KINDS[kind]
    if not isinstance(data, dict):
        raise SpecError([f"{path}:1: (top): expected a mapping for a {kind} spec"])
    bad = number_problems(path, data, node) or secret_problems(path, data, node)
    if bad:
        raise SpecError(bad)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        problems = []
        seen = set()
        for err in e.errors():
            loc = tuple(err["loc"])
            fp = dotted_path(loc)
            msg = err["msg"].removeprefix("Value error, ")
            line = f"{path}:{line_of(node, loc)}: {fp}: {msg}"
            if line not in seen:
                seen.add(line)
                problems.append(line)
        raise SpecError(problems) from None


def detect_kind(data: Any) -> str:
    if isinstance(data, dict):
        if "kind" in data and data["kind"] in SPEC_KINDS:
            return data["kind"]
        if "goal" in data or "contract" in data:
            return "task"
        if "engine" in data or "service" in data:
            return "profile"
    return "point"


def load_spec(path: str | Path, kind: str | None = None) -> Spec:
    from .yamlio import load_yaml  # for start-up time, as in parse_spec

    data, node = load_yaml(path)
    if isinstance(data, dict) and "kind" in data:
        data = {k: v for k, v in data.items() if k != "kind"}
    return parse_spec(kind or detect_kind(data), data, path=path, node=node)


def load_point(path: str | Path) -> DeploymentPoint:
    spec = load_spec(path, "point")
    assert isinstance(spec, DeploymentPoint)
    return spec


def load_profile(path: str | Path) -> RuntimeProfile:
    spec = load_spec(path, "profile")
    assert isinstance(spec, RuntimeProfile)
    return spec


def load_task(path: str | Path) -> TaskDefinition:
    spec = load_spec(path, "task")
    assert isinstance(spec, TaskDefinition)
    return spec


# --- diff -------------------------------------------------------------------------------


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def diff_values(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    fa, fb = flatten(a), flatten(b)
    return [{"path": k, "dimension": k.split(".")[0], "a": fa.get(k), "b": fb.get(k)}
            for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def diff_specs(a: Spec, b: Spec) -> list[dict[str, Any]]:
    """Changed leaves as {path, dimension, a, b}; an empty list means same content hash."""
    return diff_values(canonical(a), canonical(b))


# --- candidates -------------------------------------------------------------------------


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        nxt = data.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            data[part] = nxt
        data = nxt
    data[path[-1]] = value


def apply_candidate(point: DeploymentPoint | None, profile: RuntimeProfile | None,
                    candidate: dict[str, Any]) -> tuple[DeploymentPoint | None,
                                                        RuntimeProfile | None]:
    """The point and profile a candidate asks for (pure). Keys: `engine.<flag>` sets a server
    flag in the profile's config, `profile.<field…>` a profile field, `<role>.<field>` a
    role's count or parallelism (`prefill.tp`, `decode.count`; ledger/candidate_keys.py, which
    also reshapes the roles when `topology.architecture` switches), anything else a dotted
    path into the deployment point (e.g. `topology.parallelism.tp`). An impossible
    combination is a SpecError naming the dimension."""
    pdata = point.model_dump(mode="json") if point is not None else None
    rdata = profile.model_dump(mode="json") if profile is not None else None
    for key, value in sorted(candidate.items()):
        head, _, rest = key.partition(".")
        if key.startswith(CODE_PREFIX):
            continue  # a member's commit: built and measured, not a spec field
        if head == "engine" and rdata is not None:
            rdata.setdefault("config", {})[rest] = value
        elif head == "profile" and rdata is not None:
            _set_path(rdata, rest.split("."), value)
    if pdata is not None:  # topology keys, role keys (`prefill.tp`), other point paths
        pdata = apply_point_keys(pdata, candidate, _set_path)
    try:
        new_point = DeploymentPoint.model_validate(pdata) if pdata is not None else None
        new_profile = RuntimeProfile.model_validate(rdata) if rdata is not None else None
    except ValidationError as e:
        from .yamlio import dotted_path  # for start-up time, as in parse_spec

        first = e.errors()[0]
        loc = tuple(first["loc"])
        dim = dimension_of(loc, pdata) if e.title == "DeploymentPoint" else None
        raise SpecError([f"candidate {candidate}: {dotted_path(loc)}"
                         + (f" ({dim})" if dim else "") + f": {first['msg']}"]) from None
    return new_point, new_profile


def effective_digest(point: DeploymentPoint | None, profile: RuntimeProfile | None,
                     candidate: dict[str, Any]) -> str:
    """Hash of what a candidate actually runs: equal digests are the same experiment."""
    p, r = apply_candidate(point, profile, candidate)
    runs: dict[str, Any] = {"point": canonical(p) if p else None,
                            "profile": canonical(r) if r else None}
    code = {k: v for k, v in candidate.items() if k.startswith(CODE_PREFIX)}
    if code:  # another commit is another experiment (no code: the digest as before)
        runs["code"] = code
    return digest(runs)
