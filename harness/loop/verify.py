"""A block's verification: the task's verification path (`TaskDefinition.verification`) run
in order, each step recorded with its outcome in the one `VerificationRecorded`.

Steps:
- The loop's phases. `baseline`: a measured baseline to compare against (the baseline block
  is its own); `measure`: the block has runs and at least one succeeded; `gates`: the
  contract's gates (plus the point's SLO gates when the contract has no latency gate of its
  own, bench/slo.py) judged on the block's runs against the baseline (`gates.judge`): pass,
  fail or inconclusive as their verdict (with `contract.noise: learned`, against the point's
  noise bands learned from history, projections/noise.py); with `contract.review`, a
  non-baseline block whose gates pass is then reviewed by another model family
  (harness/loop/review.py): its gate (kind `review`) joins them, its ModelCalled and
  ReviewRecorded are saved with the verification; `decide`: always `deferred` (accept or
  reject acts on this verification's verdict, after it). The contract's gates are judged only at
  `gates`, which every path names (checked on input; a path from an older ledger that
  lacks it gets it at its end).
- Command steps `{name, argv | sh, timeout_s}`: run as a recorded tool call (`run_tool`: its
  output redacted, kept as artifacts) in the task file's directory, in their own process
  group, killed whole on timeout; exit 0 passes. Environment: FORGE_HOME, FORGE_TASK_ID,
  FORGE_BLOCK_ID, FORGE_CANDIDATE (JSON), FORGE_RUNS (JSON: the block's runs, metrics and
  success). Placeholders: {python} {task_dir}.
- Diagnose steps `{name, diagnose: {url, samples, interval_s, log, slo}}`: the endpoint
  diagnosed as `forge diagnose` does (harness/diagnose/collect.py); it passes when no rule
  fired, its result quoting the rules that did; its DiagnosisRecorded is saved with the
  verification (in its evidence). An endpoint that cannot be read fails the step.
- Text that is no step forge knows (only an older ledger can hold it: input refuses it)
  fails, saying so: a check that cannot be run is not passed.

The first step that does not pass stops the path: the steps after it are recorded
`not-run`. The verdict is that step's outcome (`fail`, or `inconclusive` from the gates),
else `pass`. The steps' tool calls and the verification are one save
(`<task>:<block>:verify`): a crash while steps run records nothing, and the resumed loop
runs the path again from its first step; a step whose result was recorded is never run
again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.candidates import differences
from ...ledger.errors import SpecError
from ...ledger.payloads import Difference, StepResult
from ...ledger.specs import (
    CODE_PREFIX,
    VERIFICATION_PHASES,
    TaskDefinition,
    VerificationStep,
    step_name,
)
from ...ledger.workspace import Workspace
from ...projections.memory import BlockRecord, TaskMemory
from ...projections.noise import point_bands
from ..bench.slo import with_slo_gates
from ..errors import HarnessError
from ..task import LoadedTask
from ..tool_calls.calls import run_tool
from . import code
from .gates import Verdict, judge

TAIL_LINES = 5  # the last lines of a command step's output kept in its result
TAIL_CHARS = 500

Say = Callable[[str], None]


@dataclass(frozen=True)
class BlockVerification:
    """A block's verification, not yet saved: the steps' tool calls, then the event."""

    tools: list[E.ToolInvoked]
    event: E.VerificationRecorded
    gates: Verdict | None  # None when the path stopped before `gates`
    review: list[E.Event] = field(default_factory=list)  # ModelCalled, ReviewRecorded
    diagnoses: list[E.Event] = field(default_factory=list)  # the diagnose steps' events

    @property
    def events(self) -> list[E.Event]:
        return [*self.tools, *self.review, *self.diagnoses, self.event]

    @property
    def verdict(self) -> str:
        return self.event.verdict

    def reason(self) -> str:
        """One line: each step that did not pass (the gates' own reasons for `gates`)."""
        parts = []
        for s in self.event.steps:
            if s.outcome in ("fail", "inconclusive"):
                why = self.gates.reason() if s.name == "gates" and self.gates else s.detail
                parts.append(f"{s.name} {s.outcome}: {why}")
        return "; ".join(parts) or "every step passed"


def path_of(task: TaskDefinition) -> list[str | VerificationStep]:
    """The task's verification path; `gates` at its end when an older definition left it
    out (the contract's gates always judge a block)."""
    path = list(task.verification)
    if "gates" not in path:
        path.append("gates")
    return path


def _tail(text: str) -> str:
    lines = text.strip().splitlines()[-TAIL_LINES:]
    out = "\n".join(lines)
    return out if len(out) <= TAIL_CHARS else "…" + out[-TAIL_CHARS:]


def _bands(ws: Workspace, lt: LoadedTask) -> dict[str, Any] | None:
    """The point's noise bands of the gates' metrics when the contract uses them."""
    c = lt.task.contract
    if c.noise != "learned" or not lt.point_hash:
        return None

    return dict(point_bands(ws.ledger, lt.point_hash, [g.metric for g in c.gates if g.metric]))


def _phase(name: str, blk: BlockRecord, mem: TaskMemory, lt: LoadedTask,
           bands: dict[str, Any] | None = None) -> tuple[StepResult, Verdict | None]:
    base = mem.baseline_block()
    if name == "baseline":
        if blk.is_baseline:
            return StepResult(name=name, kind="phase", outcome="pass",
                                detail=f"block {blk.block_id} measures the baseline"), None
        if base is None:
            return StepResult(name=name, kind="phase", outcome="fail",
                                detail="no baseline measured to compare against"), None
        ok = sum(1 for r in base.runs() if r.success)
        return StepResult(name=name, kind="phase", outcome="pass" if ok else "fail",
                            detail=f"baseline {base.block_id}: {ok} of {len(base.runs())} "
                                   "runs succeeded"), None
    if name == "measure":
        runs = blk.runs()
        ok = sum(1 for r in runs if r.success)
        if ok:
            return StepResult(name=name, kind="phase", outcome="pass",
                                detail=f"{ok} of {len(runs)} runs succeeded"), None
        errors = sorted({m["error"] or "?" for m in blk.measurements
                         if not m.get("invalidated") and not m["success"]})
        detail = (f"every run failed ({len(runs)}): " + "; ".join(errors))[:300] if runs \
            else "no measurements"
        return StepResult(name=name, kind="phase", outcome="fail", detail=detail), None
    if name == "gates":
        runs, base_runs = blk.runs(), base.runs() if base else None
        # The point's SLO gates the contract leaves to it (bench/slo.py: with_slo_gates).
        contract = with_slo_gates(lt.task.contract, lt.point, runs, base_runs)
        verdict = judge(contract, runs, base_runs, skip_relative=blk.is_baseline, bands=bands)
        bad = [g for g in verdict.gates if g.verdict != "pass"]
        detail = (", ".join(f"{g.name} {g.verdict}" for g in bad) if bad
                  else f"{len(verdict.gates)} gates pass")
        return StepResult(name=name, kind="phase", outcome=verdict.verdict,
                            detail=detail), verdict
    if name == "decide":
        return StepResult(name=name, kind="phase", outcome="deferred",
                            detail="accept or reject on this verification's verdict"), None
    return StepResult(name=name[:80], kind="phase", outcome="fail",
                        detail=f"forge cannot run this step: not a loop phase "
                               f"({', '.join(VERIFICATION_PHASES)}) nor a command step"), None


def _command(ws: Workspace, lt: LoadedTask, blk: BlockRecord, step: VerificationStep,
             fields: dict[str, Any], say: Say) -> tuple[StepResult, E.ToolInvoked]:
    cwd = Path(lt.base_dir) if lt.base_dir else Path.cwd()
    values = {"python": sys.executable, "task_dir": str(cwd)}

    def subst(text: str) -> str:
        for k, v in values.items():
            text = text.replace("{" + k + "}", v)
        return text

    argv = [subst(a) for a in step.argv] if step.argv is not None \
        else ["bash", "-c", subst(step.sh or "")]
    # Without the accuracy gates' per-item results: thousands of items could pass the size
    # one environment variable may have.
    runs = [{"metrics": r.metrics, "success": r.success} for r in blk.runs()]
    env = {"FORGE_HOME": str(ws.home), "FORGE_TASK_ID": lt.task_id,
           "FORGE_BLOCK_ID": blk.block_id,
           "FORGE_CANDIDATE": json.dumps(blk.candidate, sort_keys=True),
           "FORGE_RUNS": json.dumps(runs, sort_keys=True)}
    say(f"verify {blk.block_id}: step {step.name}")
    run = run_tool(ws, argv, tool=f"verify:{step.name}", cwd=cwd, env=env,
                   timeout=step.timeout_s, own_session=True, event_fields=fields,
                   task=lt.task_id, sandbox=lt.task.sandbox)
    ev = run.event
    ok = ev.error is None and run.returncode == 0
    detail = ev.error or f"exit {run.returncode}"
    return StepResult(name=step.name, kind="command", outcome="pass" if ok else "fail",
                        detail=detail, exit_code=run.returncode,
                        duration_s=round(ev.duration_s or 0.0, 3),
                        tool_event_id=str(ev.event_id),
                        output_tail=_tail(run.stderr if not ok and run.stderr.strip()
                                          else run.stdout)), ev


def _diagnose(ws: Workspace, lt: LoadedTask, blk: BlockRecord, step: VerificationStep,
              fields: dict[str, Any], say: Say) -> tuple[StepResult, E.Event | None]:
    # In the function for start-up time: diagnose (~20 ms), on a failure only.
    from ..diagnose.collect import diagnosis

    check = step.diagnose
    assert check is not None
    log = None
    if check.log is not None:
        log = Path(check.log)
        if not log.is_absolute() and lt.base_dir:
            log = Path(lt.base_dir) / log
    say(f"verify {blk.block_id}: step {step.name} (diagnose {check.url})")
    try:
        ev = diagnosis(ws, check.url, samples=check.samples, interval_s=check.interval_s,
                       log=log, slo=check.slo, task_id=lt.task_id, envelope=fields)
    except HarnessError as e:  # unreachable endpoint, unreadable log: not healthy
        return StepResult(name=step.name, kind="diagnose", outcome="fail",
                          detail=f"diagnosis failed: {e}"[:300]), None
    fired = [f.rule for f in ev.findings]
    detail = (f"healthy: no rule fired over {ev.samples} samples" if ev.healthy
              else "rules fired: " + ", ".join(fired))
    tail = "\n".join(f"{f.rule}: {f.summary}" for f in ev.findings)
    return StepResult(name=step.name, kind="diagnose",
                      outcome="pass" if ev.healthy else "fail", detail=detail[:300],
                      output_tail=_tail(tail)), ev


def verify(ws: Workspace, lt: LoadedTask, blk: BlockRecord, mem: TaskMemory,
           common: dict[str, Any], say: Say = lambda _s: None) -> BlockVerification:
    """Run the task's verification path on block `blk` (its measurements recorded).
    `common`: the envelope fields of every event (task, block, actor, input digests)."""
    results: list[StepResult] = []
    tools: list[E.ToolInvoked] = []
    review: list[E.Event] = []
    diagnoses: list[E.Event] = []  # the diagnose steps' DiagnosisRecorded
    gates: Verdict | None = None
    bands: dict[str, Any] | None = None  # the point's noise bands (contract noise: learned)
    stopped: StepResult | None = None
    for step in path_of(lt.task):
        name = step_name(step)
        if stopped is not None and step != "decide":
            results.append(StepResult(
                name=name, kind="phase" if isinstance(step, str)
                else "diagnose" if step.diagnose is not None else "command",
                outcome="not-run", detail=f"not run: step {stopped.name} {stopped.outcome}"))
            continue
        if isinstance(step, VerificationStep) and step.diagnose is not None:
            res, diag = _diagnose(ws, lt, blk, step, common, say)
            if diag is not None:
                diagnoses.append(diag)
        elif isinstance(step, VerificationStep):
            res, tool = _command(ws, lt, blk, step, common, say)
            tools.append(tool)
        else:
            if step == "gates" and bands is None:
                bands = _bands(ws, lt)
            res, judged = _phase(step, blk, mem, lt, bands)
            if judged is not None and lt.task.contract.review is not None:
                # The contract's cross-model review joins the gates (a ModelCalled call).
                # In the function for start-up time: review loads the model client.
                from .review import with_review

                res, judged, review = with_review(ws, lt, blk, mem, res, judged, common)
            gates = judged or gates
        results.append(res)
        if res.outcome in ("fail", "inconclusive"):
            stopped = res
    verdict = stopped.outcome if stopped is not None else "pass"
    base = mem.baseline_block()
    ev = E.VerificationRecorded(
        contract_hash=lt.contract_hash, point_hash=lt.point_hash, candidate=blk.candidate,
        passed=verdict == "pass", verdict=verdict,
        gates=list(gates.gates) if gates else [], steps=results,
        differs=_differs(ws, lt, blk),
        evidence=[m["event_id"] for m in blk.measurements] +
                 ([m["event_id"] for m in base.measurements] if base and base is not blk
                  else []) + [str(t.event_id) for t in tools]
                 + [str(r.event_id) for r in review if isinstance(r, E.ReviewRecorded)]
                 + [str(d.event_id) for d in diagnoses],
        **common)
    return BlockVerification(tools, ev, gates, review, diagnoses)


def _differs(ws: Workspace, lt: LoadedTask, blk: BlockRecord) -> list[Difference]:
    """What the block's deployment changed from the baseline's, dimension by dimension (a
    candidate the specs refuse was never measured: nothing to state); a `code.<member>`
    from the member's pinned commit (the baseline's) to the block's."""
    if blk.is_baseline:
        return []
    pins: dict[str, str] = {}
    if any(k.startswith(CODE_PREFIX) for k in blk.candidate):
        try:
            pins = code.pinned(ws, lt, code.task_monorepo(ws, lt))
        except HarnessError:
            pins = {}  # the MonoRepo is gone: the candidate's commit is still stated
    try:
        return [Difference(**d) for d in differences(lt.point, lt.profile, blk.candidate,
                                                     code_base=pins)]
    except SpecError:
        return []


