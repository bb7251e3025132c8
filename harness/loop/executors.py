"""Executors: the policies that choose each loop block's candidate, behind one small interface.

`Executor.decide(memory, task, point, profile) -> Decision`. The loop owns everything else
(recording, evaluation, gates, exit), so an agent plugs in without touching the loop.

- `sweep`: grid (scope order, then value order) or seeded random draws over the task's scope;
  candidates whose effective configuration was already tried (or equals the baseline) are
  skipped; when none is left it answers `stop`. `halving`: successive halving over the
  scope's axes (harness/loop/search.py), one block per evaluation (the block's median of the
  contract's primary metric; a block with no successful run ranks last), early stops past
  the point's noise band (projections/noise.py, given by `make_executor`); it may measure a
  candidate again, and stops when the search is done, naming its best.
- `command`: any executable; gets Task Memory (plus the task's scope) as JSON on stdin and
  answers one JSON object on stdout's last line:
  `{"action": "try", "candidate": {...}, "sub_goal": "..."}` or
  `{"action": "stop", "reason": "...", "handoff": "..."}`; optional `"model"` names the model
  that decided. Its call is recorded as a tool call of the block it starts.
- `manual`: a person or an outside agent drives through the CLI; the loop answers `wait`.
- `agent`: a tool-calling loop over a model tier's chat endpoint (agent_executor.py).

What an executor answers (`Decision`) and the scope rule candidates answer to
(`out_of_scope`) are decision.py's.

Decisions must depend only on Task Memory (and the specs), so a resumed loop asks again and
gets the same answer from deterministic policies.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.candidates import applicable
from ...ledger.specs import (
    DeploymentPoint,
    Range,
    RuntimeProfile,
    SpecError,
    TaskDefinition,
    apply_candidate,
    effective_digest,
)
from ...ledger.workspace import Workspace
from ...projections.memory import TaskMemory
from ...projections.noise import point_band
from ..engines.whole import placement_problem
from ..errors import HarnessError
from ..jsonl import last_json_line
from ..proc import last_line
from ..tool_calls.calls import run_tool
from .decision import Decision, Executor, describe
from .search import Halving
from .search import key as candidate_key


def grid(scope: dict[str, Any]) -> list[dict[str, Any]]:
    axes = _axes(scope)
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]


class SweepExecutor:
    kind = "sweep"

    def __init__(self, strategy: str = "grid", seed: int = 0, samples: int | None = None,
                 band: Callable[[TaskMemory], float] | None = None):
        self.strategy, self.seed, self.samples = strategy, seed, samples
        self.band = band  # halving: the point's noise band of the primary metric

    def candidates(self, task: TaskDefinition) -> list[dict[str, Any]]:
        scope = task.scope
        if self.strategy in ("grid", "halving"):
            return grid(scope)
        rng = random.Random(self.seed)
        if all(not isinstance(v, Range) or v.step is not None for v in scope.values()):
            pool = grid(scope)
            rng.shuffle(pool)
            return pool[: self.samples or len(pool)]
        out = []
        for _ in range(self.samples or 8):
            cand = {}
            for k, v in scope.items():
                if isinstance(v, Range):
                    x = rng.uniform(v.min, v.max)
                    cand[k] = int(round(x)) if v.integer else round(x, 6)
                else:
                    cand[k] = rng.choice(list(v))
            out.append(cand)
        return out

    def decide(self, memory: TaskMemory, task: TaskDefinition, point: DeploymentPoint | None,
               profile: RuntimeProfile | None) -> Decision:
        if self.strategy == "halving":
            return self._halving(memory, task)
        tried = set(memory.tried)
        impossible: list[str] = []
        for raw in self.candidates(task):
            # Role keys of roles the candidate's architecture lacks do not apply to it (a
            # colocated candidate is tried once, whatever `prefill.tp` says).
            cand = applicable(raw, point)
            try:
                if effective_digest(point, profile, cand) in tried:
                    continue
                placed = placement_problem(*apply_candidate(point, profile, cand))
            except SpecError as e:  # an impossible combination: skipped, said at the stop
                impossible.append(str(e))
                continue
            if placed is not None:  # it does not fit the point's accelerator
                impossible.append(f"candidate {describe(cand)}: {placed}")
                continue
            return Decision("try", cand, sub_goal=f"try {describe(cand)}")
        skipped = f"; {len(set(impossible))} impossible combinations skipped (first: " \
            f"{impossible[0]})" if impossible else ""
        return Decision("stop", reason=f"scope exhausted: {len(tried)} distinct configurations "
                        f"tried{skipped}")


    def _halving(self, memory: TaskMemory, task: TaskDefinition) -> Decision:
        metric, direction = memory.primary_metric, memory.primary_direction or "at_least"
        if metric is None:
            return Decision("stop", reason="halving needs a contract gate with a metric")
        axes = _axes(task.scope)
        worst = float("-inf") if direction == "at_least" else float("inf")
        observed: dict[str, list[float]] = {}
        for b in memory.execution_record:
            if b.is_baseline or set(b.candidate) != set(axes):
                continue
            m = b.median(metric)
            observed.setdefault(candidate_key(b.candidate), []).append(
                worst if m is None else float(m))
        band = self.band(memory) if self.band is not None else 0.0
        h = Halving(axes, direction=direction, band=band)
        nxt = h.next_candidate(observed)
        if nxt is None:
            n = sum(len(v) for v in observed.values())
            return Decision("stop", reason=f"halving done: best {describe(h.best(observed) or {})}"
                            f" after {n} evaluations ({len(observed)} of "
                            f"{len(grid(task.scope))} grid candidates)")
        return Decision("try", nxt, sub_goal=f"try {describe(nxt)} (halving)")


def _axes(scope: dict[str, Any]) -> dict[str, list[Any]]:
    """Each scope key's values in order (a range needs a step)."""
    out = {}
    for k, allowed in scope.items():
        if isinstance(allowed, Range):
            vals = allowed.values()
            if vals is None:
                raise HarnessError(f"scope {k}: a continuous range needs strategy random "
                                   "(or a step)")
            out[k] = list(vals)
        else:
            out[k] = list(allowed)
    return out


class ManualExecutor:
    kind = "manual"

    def decide(self, memory: TaskMemory, task: TaskDefinition, point: DeploymentPoint | None,
               profile: RuntimeProfile | None) -> Decision:
        return Decision("wait", reason="manual task: drive it with forge block start, forge run "
                        "-- CMD, forge measure, forge block verify, forge block handoff")


class CommandExecutor:
    kind = "command"

    def __init__(self, argv: list[str], *, cwd: str | Path | None = None, timeout_s: float = 600,
                 ws: Workspace | None = None):
        self.argv, self.cwd, self.timeout_s, self.ws = list(argv), cwd, timeout_s, ws
        # Extra environment the loop sets before each decision: the task's worktrees
        # (FORGE_WORKTREE_<MEMBER>) when it changes MonoRepo members.
        self.env: dict[str, str] = {}

    def decide(self, memory: TaskMemory, task: TaskDefinition, point: DeploymentPoint | None,
               profile: RuntimeProfile | None) -> Decision:
        payload = {"memory": memory.model_dump(mode="json"),
                   "scope": {k: (v.model_dump() if isinstance(v, Range) else v)
                             for k, v in task.scope.items()},
                   "goal": task.goal,
                   "profile_config": profile.config if profile else {}}
        run = run_tool(self.ws, self.argv, tool="executor", cwd=self.cwd,
                       input=json.dumps(payload, sort_keys=True, default=str),
                       env=self.env, timeout=self.timeout_s, task=memory.task_id,
                       sandbox=getattr(task, "sandbox", None))
        ev = run.event
        if run.returncode != 0:
            last = last_line(run.stderr, 300)
            return Decision("stop", reason=f"executor {self.argv[0]} failed "
                            f"(exit {run.returncode}): {last}", tool_event=ev)
        try:
            answer = last_json_line(run.stdout)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("action") not in ("try", "stop"):
            return Decision("stop", reason=f"executor {self.argv[0]} answered no valid action "
                            "(expected JSON with action try|stop on its last stdout line)",
                            tool_event=ev)
        actor = E.Actor.agent(Path(self.argv[0]).name, answer["model"]) \
            if answer.get("model") else E.Actor.tool(Path(self.argv[0]).name)
        if answer["action"] == "stop":
            return Decision("stop", reason=str(answer.get("reason") or "executor stopped"),
                            handoff=answer.get("handoff"), tool_event=ev, actor=actor)
        cand = answer.get("candidate") or {}
        if not isinstance(cand, dict):
            return Decision("stop", reason="executor answered a candidate that is not a mapping",
                            tool_event=ev, actor=actor)
        return Decision("try", cand, sub_goal=str(answer.get("sub_goal") or
                                                  f"try {describe(cand)}"),
                        tool_event=ev, actor=actor)


def _point_band(ws: Workspace | None) -> Callable[[TaskMemory], float] | None:
    """The noise band of the task's primary metric at its point (0 when none is learned)."""
    if ws is None:
        return None

    def band(mem: TaskMemory) -> float:
        if not mem.point_hash or not mem.primary_metric:
            return 0.0
        b = point_band(ws.ledger, mem.point_hash, mem.primary_metric)
        return b.cv if b is not None else 0.0

    return band


def make_executor(task: TaskDefinition, *, ws: Workspace | None = None,
                  base_dir: str | Path | None = None) -> Executor:
    spec = task.executor
    if spec.kind == "sweep":
        return SweepExecutor(spec.strategy, spec.seed, spec.samples,
                             band=_point_band(ws) if spec.strategy == "halving" else None)
    if spec.kind == "manual":
        return ManualExecutor()
    if spec.kind == "agent":
        if ws is None:
            raise HarnessError("an agent executor needs the workspace (its model tiers)")
        # In the function for start-up time: the model client loads with it.
        from .agent_executor import AgentExecutor

        return AgentExecutor(ws, task)
    return CommandExecutor(spec.argv, cwd=base_dir, timeout_s=spec.timeout_s, ws=ws)
