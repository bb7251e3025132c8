"""Typed payloads that cross layers: what the harness writes into an event and the read
side (Task Memory, the index, the wiki) reads back, one type each.

- `GateResult`: one judged gate or check of a verification. The loop's contract gates
  (`harness.loop.gates`) and a graph node's checks (`harness.graph.work`) both produce it;
  `VerificationRecorded.gates` and `NodeVerified.checks` carry it. Events stored before it
  had two shapes (the loop's `{name, kind, verdict, reason, …}` and the graph's
  `{name, passed, detail, …}`); `gate_from_stored` lifts both (the events' upcasters).
- `StepResult`: one step of a task's verification path with its outcome
  (`VerificationRecorded.steps`; harness/loop/verify.py runs the path).
- `MemberState`: one repository's state in a MonoRepo snapshot (`RepoSnapshotted.members`),
  `UntrackedFile` one of its untracked files, `SyncConflict` one conflicted file of a sync
  (`RepoSynced.conflicts`).
- `Digest`: the named keys of an event's `input_digests`. Writers and readers use these
  names; nothing reads a digest by guessing among keys.
- Specs (deployment points, runtime profiles, task definitions) are stored as their
  canonical dump (`specs.canonical`) and read back with `specs.stored_point` /
  `specs.stored_profile`: one stored shape each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

Verdict = Literal["pass", "fail", "inconclusive"]
# Contract gates (`specs.Gate.kind`): absolute, relative, stability. A graph node's checks:
# `command` (a verify command), `metric` (a bound on the work's metrics line), `work` (the
# node's work command itself), `deliverables` (its files exist), `task-loop` (a loop task).
# `review`: a contract's cross-model review (harness/loop/review.py).
# `accuracy`: task accuracy non-inferior to the baseline's (harness/bench/accuracy.py).
GateKind = Literal["absolute", "relative", "stability", "accuracy", "command", "metric", "work",
                   "deliverables", "task-loop", "review"]
Direction = Literal["at_least", "at_most", "equals"]


class GateResult(BaseModel):
    """One gate's (or check's) verdict with its numbers and a one-line reason.

    `passed` is `verdict == "pass"` (build it with `GateResult.judged`). The numbers are
    those of the judged metric: `median` over `n` samples (a graph metric check: its one
    value, n=1), compared with `threshold` in `direction`; a relative gate adds the
    baseline's median and their `ratio` with its confidence interval `ci`; a stability gate
    its coefficient of variation `cv` and failure counts. `task`: the loop task whose
    outcome a `task-loop` check is."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    kind: GateKind
    verdict: Verdict
    passed: bool
    reason: str = ""
    metric: str | None = None
    threshold: float | None = None
    direction: Direction | None = None
    n: int = 0
    median: float | None = None
    baseline_median: float | None = None
    ratio: float | None = None
    ci: list[float] | None = None
    cv: float | None = None
    failed_runs: int = 0
    failed_requests: float = 0.0
    samples: list[float] = Field(default_factory=list)
    task: str | None = None
    # A contract with `noise: learned` (harness/loop/gates.py): the point's noise band of
    # the metric (`band`: run-to-run CV, over `band_groups` groups of `band_runs` runs) and,
    # when inconclusive, `runs_needed`: runs per side likely to decide. Left out of the
    # stored shape while None, so results judged without them keep the shape they had.
    band: float | None = None
    band_groups: int | None = None
    band_runs: int | None = None
    runs_needed: int | None = None

    @model_serializer(mode="wrap")
    def _omit_unused_new_fields(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for k in ("band", "band_groups", "band_runs", "runs_needed"):
                if k in data and data[k] is None:
                    del data[k]
        return data

    @classmethod
    def judged(cls, verdict: Verdict, **fields: Any) -> GateResult:
        """A result whose `passed` agrees with its verdict."""
        return cls(verdict=verdict, passed=verdict == "pass", **fields)

    @classmethod
    def check(cls, passed: bool, **fields: Any) -> GateResult:
        """A pass/fail check (a graph node's): verdict from `passed`."""
        return cls(verdict="pass" if passed else "fail", passed=passed, **fields)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form without its empty fields (what `forge block verify --json` shows)."""
        return self.model_dump(mode="json", exclude_none=True)


_GATE_FIELDS = frozenset(GateResult.model_fields)
_OLD_GRAPH_KINDS = {"work": "work", "deliverables": "deliverables"}


def gate_from_stored(g: Any) -> list[dict[str, Any]]:
    """A gate as stored before `GateResult` (either shape), as GateResult payloads (a graph
    metric check with several bounds becomes one result per bound). Raises ValueError for
    anything else: the codec reports it as a corrupt event, naming stream and version."""
    if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
        raise ValueError(f"a gate result must be an object with a name, got {g!r:.80}")
    if "verdict" in g:  # the loop's GateResult.to_dict (its None fields left out)
        verdict = g["verdict"]
        return [{**{k: v for k, v in g.items() if k in _GATE_FIELDS},
                 "passed": verdict == "pass"}]
    # The graph's {name, passed, detail} with a metric check's metric, value and bounds, or
    # a loop task's task and blocks.
    passed = bool(g.get("passed"))
    out: dict[str, Any] = {"name": g["name"], "verdict": "pass" if passed else "fail",
                           "passed": passed, "reason": str(g.get("detail") or "")}
    if "task" in g:
        out.update(kind="task-loop", task=g["task"])
        if isinstance(g.get("blocks"), int) and not isinstance(g.get("blocks"), bool):
            out["n"] = g["blocks"]
        return [out]
    if "metric" in g:
        out.update(kind="metric", metric=g["metric"])
        value = g.get("value")
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.update(median=float(value), n=1, samples=[float(value)])
        bounds = [(d, g[d]) for d in ("at_least", "at_most", "equals") if g.get(d) is not None]
        if not bounds:
            return [out]
        return [{**out, "threshold": b, "direction": d} for d, b in bounds]
    out["kind"] = _OLD_GRAPH_KINDS.get(g["name"], "command")
    return [out]


def gates_from_stored(gates: Any) -> list[dict[str, Any]]:
    """`gate_from_stored` over a stored list of gates."""
    if not isinstance(gates, list):
        raise ValueError(f"gates must be a list, got {type(gates).__name__}")
    return [x for g in gates for x in gate_from_stored(g)]


class StepResult(BaseModel):
    """One step of a task's verification path and its outcome: `pass` / `fail`,
    `inconclusive` (the gates: too noisy to tell), `not-run` (a step before it did not pass),
    `deferred` (`decide`: it acts on this verification's verdict, after it). A command step
    names its recorded tool call; a `diagnose` step's DiagnosisRecorded is in the
    verification's evidence."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    name: str
    kind: Literal["phase", "command", "diagnose"]
    outcome: Literal["pass", "fail", "inconclusive", "not-run", "deferred"]
    detail: str = ""
    exit_code: int | None = None
    duration_s: float | None = None
    tool_event_id: str | None = None  # the ToolInvoked event of a command step
    output_tail: str = ""  # the last lines of its output, redacted


class Difference(BaseModel):
    """One dimension in which a candidate's deployment differs from the baseline's
    (ledger/candidates.py `differences`): its path (`topology.architecture`,
    `topology.roles.prefill.parallelism.tp`, `engine.<flag>`, `profile.<field>`,
    `code.<member>`) and both values (None: that side does not have it)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    path: str
    baseline: Any = None
    candidate: Any = None


class UntrackedFile(BaseModel):
    """An untracked (not ignored) file of a snapshot: its path, mode and content digest (a
    symbolic link: the digest of its target)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")
    path: str
    digest: str  # artifact, stored verbatim
    executable: bool = False
    symlink: bool = False


class MemberState(BaseModel):
    """One repository of a MonoRepo snapshot: where it comes from, where it stands, and what
    is uncommitted. `name` is the member's name ("." for the root itself); `diff_digest` is
    the artifact of `git diff --binary HEAD` (None when the tree is clean)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")
    name: str
    path: str  # relative to the root ("." for the root)
    url: str | None = None  # the origin remote's URL
    branch: str | None = None  # None: detached HEAD
    commit: str | None = None  # None: no commit yet
    diff_digest: str | None = None
    untracked: list[UntrackedFile] = Field(default_factory=list)

    @property
    def dirty(self) -> bool:
        return self.diff_digest is not None or bool(self.untracked)


class SyncConflict(BaseModel):
    """One file a sync could not rebase cleanly: the path and its conflict hunks, as text."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")
    path: str
    hunks: list[str] = Field(default_factory=list)


class Digest:
    """The named keys of an event's `input_digests` (`Event.input_digests[Digest.POINT]`)."""

    DEFINITION: Final = "definition"  # the task definition's hash
    POINT: Final = "point"  # the deployment point's spec hash (the point it ran on)
    PROFILE: Final = "profile"  # the runtime profile's spec hash
    CONTRACT: Final = "contract"  # the task contract's digest
    CONFIG: Final = "config"  # the block's effective configuration (point+profile+candidate)
    REPO_SNAPSHOT: Final = "repo_snapshot"  # the MonoRepo snapshot an event ran on
    BUILD: Final = "build"  # a build's cache key (snapshot + command + environment)
    BENCH_SERVING_FILE: Final = "bench_serving_file"  # an imported bench_serving file
    BASELINE_OUTPUTS: Final = "baseline_outputs"  # a correctness check's baseline outputs
