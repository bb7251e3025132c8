"""`forge ab`: is a commit of an engine member faster than another at one deployment point?

Contract:
- `ab_task(...)` writes a normal task (`FORGE_HOME/ab/<id>.yaml`) and `run_ab` defines and
  runs it through the loop: `code.members: [member]`, `code.base: {member: <base commit>}`
  (the baseline block runs the base's build), scope `code.<member>: [<candidate commit>]`
  (the one candidate block runs the candidate's build), the engine evaluator (both builds
  deployed at the same point, same workload and seeds; the start check refuses a server
  that is not the block's build), a grid sweep that stops after that block. Base and
  candidate are resolved to commits first (a ref that names none is a one-line error).
- The gates: `faster`, the metric's candidate/base ratio (a bootstrap confidence interval
  of the ratio of medians, harness/loop/gates.py) at least `min_ratio`; `correctness`: with
  `correctness` a number, token match of greedy outputs against the base at least that;
  `"default"`, the task type's default correctness gate (ledger/correctness.py: token match
  >= 0.99 for the default `engine-integration`, an accuracy gate for a `kernel`,
  `quantization`, … A/B: `task_type`); left out when None; `stability`, `repeats` runs
  with no failed request; plus the point's SLO gates (verify.py adds them).
- `ABResult` is read back from the ledger (Task Memory): the verdict of the candidate's
  block (`accepted` when every gate passed, else the loop's `rejected` with its reason, or
  `not measured` when a build or the start check failed), each gate's numbers and interval,
  what differed, and each side's build (commit, version the server reported, key, cached).
  The task is in the ledger, the index and the wiki like any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...ledger.correctness import default_correctness
from ...ledger.ids import check_id
from ...ledger.specs import TASK_TYPES
from ...ledger.streams import task_stream
from ...ledger.workspace import Workspace
from ...projections.memory import read_memory
from ...repos.commands import open_monorepo
from ..errors import HarnessError
from .code import member_commit

Progress = Callable[[str], None]
AB_DIR = "ab"
DEFAULT_METRIC = "output_throughput"
# Both sides' builds, weight loads and runs: a DeepSeek-class checkpoint loads for many
# minutes a side.
DEFAULT_MAX_WALL_S = 4 * 3600.0
AB_MORE_RUNS = 3  # contract.more_runs of the A/B task (harness/loop/more_runs.py)
AB_TYPE = "engine-integration"  # the A/B task's type unless --type says what the change is
# Metrics where less is better: the gate asks for a ratio at most 1/min_ratio.
LOWER_IS_BETTER = re.compile(r"(ttft|tpot|itl|e2e|latency)")


@dataclass(frozen=True)
class ABSide:
    ref: str
    commit: str
    build: dict[str, Any] = field(default_factory=dict)  # the runs' meta.builds[member]


@dataclass(frozen=True)
class ABResult:
    task_id: str
    member: str
    point: str
    base: ABSide
    candidate: ABSide
    verdict: str  # accepted | rejected | not measured
    reason: str
    gates: list[dict[str, Any]]
    differs: list[dict[str, Any]]
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "member": self.member, "point": self.point,
                "base": vars(self.base), "candidate": vars(self.candidate),
                "verdict": self.verdict, "reason": self.reason, "gates": self.gates,
                "differs": self.differs, "status": self.status}


def deploy_member(ws: Workspace, member: str | None) -> str:
    """The member to compare: the one named, else the MonoRepo's only member with a
    `deploy:` recipe."""
    mono = open_monorepo(ws)
    if member is not None:
        m = mono.member(member)
        if m.deploy is None:
            raise HarnessError(f"member {member} has no deploy recipe in the manifest (add "
                               "`deploy: {install: …, module: …}` to its entry)")
        return member
    with_deploy = [m.name for m in mono.manifest.members if m.deploy is not None]
    if len(with_deploy) != 1:
        raise HarnessError("give --member: " + (
            f"members with a deploy recipe: {', '.join(with_deploy)}" if with_deploy
            else "no member has a deploy recipe in the manifest"))
    return with_deploy[0]


def resolve_ref(ws: Workspace, member: str, ref: str, flag: str) -> str:
    """The commit `ref` names in the member (code.member_commit), or a one-line error."""
    return member_commit(open_monorepo(ws), member, ref, f"{flag} {ref!r}")


def ab_task(ws: Workspace, *, point: Path, member: str, base: str, candidate: str,
            profile: Path | None = None, metric: str = DEFAULT_METRIC,
            min_ratio: float = 1.0, correctness: float | str | None = "default",
            repeats: int = 3, task_id: str | None = None,
            max_wall_s: float = DEFAULT_MAX_WALL_S, task_type: str = AB_TYPE
            ) -> tuple[str, Path, dict[str, Any]]:
    """(task id, task file, its content) for comparing `candidate` against `base`."""
    if task_type not in TASK_TYPES:
        raise HarnessError(f"--type {task_type!r}: not a task type ({', '.join(TASK_TYPES)})")
    point = point.resolve()
    if not point.is_file():
        raise HarnessError(f"--point {point}: no such file")
    if profile is not None and not profile.resolve().is_file():
        raise HarnessError(f"--profile {profile}: no such file")
    if not min_ratio > 0:
        raise HarnessError(f"--min-ratio {min_ratio}: must be above 0")
    if not max_wall_s > 0:
        raise HarnessError(f"--max-wall-s {max_wall_s}: must be above 0")
    if repeats < 2:
        raise HarnessError(f"--repeats {repeats}: at least 2 runs per side (an interval "
                           "needs them)")
    base_sha = resolve_ref(ws, member, base, "--base")
    cand_sha = resolve_ref(ws, member, candidate, "--candidate")
    if base_sha == cand_sha:
        raise HarnessError(f"--base {base} and --candidate {candidate} are the same commit "
                           f"{base_sha[:12]}")
    tid = check_id(task_id, "task id") if task_id else _free_id(
        ws, f"ab-{member}-{base_sha[:8]}-{cand_sha[:8]}")
    lower = bool(LOWER_IS_BETTER.search(metric))
    faster = {"name": "faster", "metric": metric, "vs_baseline": "ratio",
              **({"at_most": round(1 / min_ratio, 6)} if lower else {"at_least": min_ratio})}
    gates: list[dict[str, Any]] = [faster]
    if correctness == "default":
        default = default_correctness(task_type)
        if default is not None:
            gates.append(dict(default.gate))
    elif correctness is not None:
        gates.append({"name": "correctness", "metric": "token_match",
                      "at_least": float(correctness)})
    gates.append({"name": "stability", "repeats": repeats, "max_failed_requests": 0})
    content: dict[str, Any] = {
        "id": tid, "type": task_type,
        "title": f"A/B {member} {candidate} vs {base}",
        "goal": f"Is {member}@{candidate} ({cand_sha[:12]}) better than {base} "
                f"({base_sha[:12]}) on {metric} at {point.name}?",
        "point": str(point),
        **({"profile": str(profile.resolve())} if profile is not None else {}),
        "scope": {f"code.{member}": [cand_sha]},
        "code": {"members": [member], "base": {member: base_sha}},
        # A side whose runs are noisy or still trending gets extra runs, not a shrug.
        "contract": {"gates": gates, "more_runs": AB_MORE_RUNS,
                     # --no-correctness: said in the file, or the type's default joins
                     **({"correctness": "none"} if correctness is None else {})},
        "exit": {"when": "all_gates_pass", "max_blocks": 2, "no_progress_blocks": 1,
                 "max_wall_s": max_wall_s},
        "executor": {"kind": "sweep", "strategy": "grid"},
        "evaluator": {"kind": "engine"},
    }
    d = ws.home / AB_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{tid}.yaml"
    path.write_text(f"# forge ab --base {base} --candidate {candidate} --member {member}\n"
                    + yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return tid, path, content


def _free_id(ws: Workspace, stem: str) -> str:
    """`stem`, or `stem-2`, `-3`, …: an A/B run again is a new task (new measurements)."""
    n = 1
    while True:
        tid = stem if n == 1 else f"{stem}-{n}"
        if not ws.ledger.stream(task_stream(tid), until_version=1):
            return tid
        n += 1


def run_ab(ws: Workspace, *, point: Path, base: str, candidate: str,
           member: str | None = None, profile: Path | None = None,
           metric: str = DEFAULT_METRIC, min_ratio: float = 1.0,
           correctness: float | str | None = "default", repeats: int = 3,
           task_id: str | None = None, max_wall_s: float = DEFAULT_MAX_WALL_S,
           progress: Progress | None = None, task_type: str = "engine-integration"
           ) -> ABResult:
    """Define and run the A/B task, then read its verdict (module contract)."""
    # In the function for start-up time: the loop and its evaluators.
    from .define import define_task
    from .run import run_task

    say = progress or (lambda _m: None)
    m = deploy_member(ws, member)
    tid, path, _ = ab_task(ws, point=point, member=m, base=base, candidate=candidate,
                           profile=profile, metric=metric, min_ratio=min_ratio,
                           correctness=correctness, repeats=repeats, task_id=task_id,
                           max_wall_s=max_wall_s, task_type=task_type)
    say(f"A/B task {tid} ({path})")
    define_task(ws, path)
    run_task(ws, tid, progress=say)
    return ab_result(ws, tid, base, candidate)


def ab_result(ws: Workspace, task_id: str, base_ref: str | None = None,
              cand_ref: str | None = None) -> ABResult:
    """An A/B task's outcome as recorded (module contract)."""
    mem, _ = read_memory(ws.ledger, task_id)
    d = mem.definition or {}
    code = d.get("code") or {}
    member = (code.get("members") or ["?"])[0]
    base_sha = (code.get("base") or {}).get(member, "")
    cand_sha = ((d.get("scope") or {}).get(f"code.{member}") or [""])[0]
    blocks = list(mem.execution_record)
    base_blk = next((b for b in blocks if not b.candidate), None)
    cand_blk = next((b for b in blocks if b.candidate), None)

    def build_of(blk: Any) -> dict[str, Any]:
        for run in (blk.measurements if blk is not None else []):
            b = (run.get("meta") or {}).get("builds", {}).get(member)
            if b:
                return dict(b)
        return {}

    def first_error(blk: Any) -> str | None:
        for run in (blk.measurements if blk is not None else []):
            if not run.get("success") and run.get("error"):
                return str(run["error"])
        return None

    gates: list[dict[str, Any]] = []
    differs: list[dict[str, Any]] = []
    if cand_blk is not None and cand_blk.verification:
        gates = [dict(g) for g in cand_blk.verification.get("gates", [])]
        differs = list(cand_blk.verification.get("differs", []))
    err = first_error(base_blk) or first_error(cand_blk)
    if cand_blk is not None and cand_blk.decision == "accepted":
        verdict, reason = "accepted", "every gate passed"
    elif err is not None and not any(g.get("passed") for g in gates):
        verdict, reason = "not measured", err
    else:
        verdict = "rejected"
        failing = [g for g in gates if not g.get("passed")]
        reason = "; ".join(f"{g['name']}: {g.get('reason', g.get('verdict'))}"
                           for g in failing) or (mem.exit_reason or "no verdict")
    return ABResult(task_id=task_id, member=member, point=str(d.get("point", "")),
                    base=ABSide(base_ref or base_sha[:12], base_sha, build_of(base_blk)),
                    candidate=ABSide(cand_ref or cand_sha[:12], cand_sha, build_of(cand_blk)),
                    verdict=verdict, reason=reason, gates=gates, differs=differs,
                    status=mem.status + (f" ({mem.exit_state})" if mem.exit_state else ""))
