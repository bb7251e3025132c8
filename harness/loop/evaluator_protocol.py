"""Evaluating a candidate: the one interface between the task loop and whatever measures.

Contract:
- An `Evaluator` runs one candidate (a mapping of scope keys to values, e.g.
  `{"engine.dtype": "bfloat16"}`; `{}` is the baseline: the profile's own configuration)
  `repeats` times and returns one `RunResult` per run. Failures are data: a run that could not
  be measured is a `RunResult(success=False, error=...)`, never an exception. Exceptions are
  reserved for a broken setup (`HarnessError`: missing executable, bad configuration).
- Metric names follow `sglang.bench_serving` (output_throughput, request_throughput,
  median_ttft_ms, p99_ttft_ms, mean_tpot_ms, median_itl_ms, median_e2e_latency_ms, completed,
  failed, …) plus `token_match` when correctness was measured against the baseline.
- The evaluators: `CommandEvaluator` (command_evaluator.py: a configured argv, metrics from its last
  stdout line) and `EngineEvaluator` (engine_evaluator.py: launch, check outputs, benchmark);
  `command_evaluator.make_evaluator` chooses one for a task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ...ledger.specs import DeploymentPoint, RuntimeProfile
from ...ledger.task import Block
from ...ledger.workspace import Workspace

if TYPE_CHECKING:
    from ...projections.memory import TaskMemory


@dataclass(frozen=True)
class RunResult:
    """One repeated run of one candidate (failures as data)."""

    metrics: dict[str, float]
    success: bool = True
    error: str | None = None
    artifact_digest: str | None = None  # per-request records (JSONL) in the artifact store
    meta: dict[str, Any] = field(default_factory=dict)  # engine command, server info digest, …


def _no_progress(_: str) -> None:
    return None


@dataclass(frozen=True)
class BaselineRun:
    """One recorded run of the baseline block, as an evaluator compares against it."""

    metrics: Mapping[str, float]
    success: bool
    meta: Mapping[str, Any]
    artifact_digest: str | None


@dataclass(frozen=True)
class Baseline:
    """The baseline block's runs handed to a candidate block's evaluator: every measurement
    it recorded (invalidated ones too: their outputs are still what the baseline served)."""

    block_id: str
    runs: tuple[BaselineRun, ...]

    @classmethod
    def of(cls, block: Block) -> Baseline:
        return cls(block.block_id, tuple(
            BaselineRun(m["metrics"], m["success"], m.get("meta", {}), m.get("artifact_digest"))
            for m in block.measurements))

    def to_json(self) -> dict[str, Any]:
        """Its JSON form, as a command evaluator reads it (`FORGE_BASELINE`)."""
        return {"block_id": self.block_id,
                "runs": [{"metrics": r.metrics, "success": r.success, "meta": r.meta,
                          "artifact_digest": r.artifact_digest} for r in self.runs]}


def baseline_of(mem: TaskMemory) -> Baseline | None:
    """The task's latest measured baseline block as a candidate block's evaluator gets it."""
    base = mem.baseline_block()
    return None if base is None else Baseline.of(base)


@dataclass(frozen=True)
class EvalContext:
    """What an evaluator may use besides the candidate. `point` and `profile` already have the
    candidate applied (`ledger.specs.apply_candidate`): launch exactly what they say. For a
    candidate block, `baseline` is the baseline block's recorded runs (`Baseline`; None for
    the baseline itself): token match compares against what a baseline run kept in its
    `meta`/artifacts."""

    workspace: Workspace | None
    task_id: str
    block_id: str
    point: DeploymentPoint | None
    profile: RuntimeProfile | None
    baseline: Baseline | None = None
    progress: Callable[[str], None] = _no_progress
    # Extra environment for what the evaluator runs: the task's worktrees of the members it
    # changes (FORGE_WORKTREE_<MEMBER>, FORGE_WORKTREES), harness/loop/code.py.
    env: dict[str, str] = field(default_factory=dict)
    # The block's deployable builds of the members it changes (member -> commit_build's
    # `Deployable`): the engine evaluator launches the engine from them.
    builds: Mapping[str, Any] = field(default_factory=dict)


class Evaluator(Protocol):
    def evaluate(
        self, candidate: dict[str, Any], *, repeats: int, ctx: EvalContext
    ) -> list[RunResult]: ...
