"""Cross-model adversarial review, a gate of the contract (`contract.review: {tier}`).

Contract:
- `review_block(ws, lt, blk, mem, gate_results, handoff)` asks the model of the review's
  tier ([models.<tier>]) to judge a block's deliverable: the candidate (for a code candidate
  `code.<member>`, the diff of its commit against the member's pinned commit), the block's
  measurements and the baseline's (medians per metric, the measurement event ids), the
  gate verdicts with their numbers, and the last handoff. The reviewer answers ONE JSON
  object `{"verdict": "approve"|"object", "reasons": [{"text", "evidence": [...]}]}` where
  each evidence item is an event id, a metric name, a gate name or a part of the deliverable
  the prompt lists (`Evidence you may cite`).
- The answer is read strictly: `approve` → the review gate passes; `object` with at least one
  reason, every reason citing evidence of the deliverable → the gate fails with those
  reasons. Anything else is an `invalid` review → the gate is `inconclusive` with a one-line
  reason: prose or text around the object, a shape that is not the verdict object, an
  objection without reasons or whose reason cites nothing of the deliverable, an endpoint
  that is down or answers an error, a timeout (`review.timeout_s`), a tier no longer
  configured. An unverifiable review does not pass.
- The call is a `ModelCalled` event (purpose reviewer) and the verdict a `ReviewRecorded`
  (tier, model, family, verdict, reasons, evidence, response digest); nothing is saved here:
  the verification path saves both with its `VerificationRecorded` (one save).
- `with_review` is the verification path's use: run on a non-baseline block whose contract
  gates pass (a block the gates already fail or cannot tell is no deliverable; a review
  would cost a call without changing the verdict); the review's `GateResult` (kind
  `review`) joins the gates and the overall verdict follows `gates.judge`'s rule.
- `check_reviewer(ws, task, source)` at definition: the review's tier is configured and its
  model family differs from that of every model tier the executor may use (as routing
  chooses them: its tier, the tiers escalation can move it to, an agent's planner); else
  HarnessError in one line naming both tiers, models and the family.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...ledger import events as E
from ...ledger.config import ModelSettings
from ...ledger.payloads import GateResult, StepResult
from ...ledger.specs import CODE_PREFIX, TaskDefinition
from ...ledger.workspace import Workspace
from ...projections.memory import BlockRecord, TaskMemory
from ...repos.errors import RepoError
from ...repos.git import out
from ..agents.models import call_model, tier_settings
from ..errors import HarnessError
from .code import pinned, task_monorepo
from .routing import route

GATE_NAME = "review"
MAX_DIFF_CHARS = 40_000  # the diff shown to the reviewer (all members together)
MAX_REASONS = 20
MAX_REASON_CHARS = 1000
MAX_GATE_REASON = 600  # the review gate's one-line reason (DirectionRejected carries it)

SYSTEM_PROMPT = """\
You are an adversarial reviewer of one block of a performance-engineering task. Another \
model (of another family) proposed the candidate; the harness measured it and judged the \
contract's gates. Look for what the numbers and the change do not support: a gain that is \
noise, a gate that passes for the wrong reason, a change that breaks correctness or does \
something other than its sub-goal says, measurements that do not match the candidate.

Answer with ONE JSON object and nothing else (no prose, no code fence):
{"verdict": "approve" | "object",
 "reasons": [{"text": "<one finding>", "evidence": ["<event id, metric name, gate name or \
part listed under Evidence you may cite>", ...]}]}
Approve when nothing is wrong. Object only with reasons, each citing at least one item of \
"Evidence you may cite"; an objection citing nothing listed there is discarded."""


class _Reason(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(min_length=1)
    evidence: list[str] = Field(default_factory=list)


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    verdict: Literal["approve", "object"]
    reasons: list[_Reason] = Field(default_factory=list)


@dataclass(frozen=True)
class Review:
    """A block's review, not yet saved: the gate result, the verdict event and the call."""

    gate: GateResult
    recorded: E.ReviewRecorded
    called: E.ModelCalled | None  # None: no call was made (the tier is not configured)

    @property
    def events(self) -> list[E.Event]:
        return [e for e in (self.called, self.recorded) if e is not None]


@dataclass
class Deliverable:
    """The reviewer's prompt and the evidence it may cite (lowercased key -> as shown)."""

    text: str
    evidence: dict[str, str] = field(default_factory=dict)

    def cite(self, *items: str) -> None:
        for i in items:
            if i:
                self.evidence.setdefault(i.strip().lower(), i)


# --- definition: the reviewer must be of another family -----------------------------------


def executor_tiers(task: TaskDefinition, models: Mapping[str, ModelSettings]) -> list[str]:
    """The model tiers the task's executor may call, as the loop's routing chooses them
    (harness/loop/routing.route): its first tier and every tier escalation can move it to
    (routing.escalate_after), and an agent's planner tier. An agent calls a model; a command
    policy is taken to when its routing names a tier; a sweep or a person calls none."""
    ex, routing = task.executor, task.routing
    if ex.kind not in ("agent", "command") or (ex.kind == "command"
                                               and not routing.model_tier):
        return []
    k = routing.escalate_after or 0
    tiers: list[str] = []
    for i in range(len(models) + 2 if k else 1):  # each step of the ladder, then past its top
        r = route(task, i * k, models=models)
        for t in (r.get("model_tier"), r.get("planner_tier")):
            if t and t not in ("none", "human") and t not in tiers:
                tiers.append(t)
    return tiers


def check_reviewer(ws: Workspace, task: TaskDefinition, source: str) -> None:
    """Refuse a review whose tier is not configured or whose model family is the executor's
    (module contract). Nothing is recorded either way."""
    review = task.contract.review
    if review is None:
        return
    try:
        rs = tier_settings(ws, review.tier)
    except HarnessError as e:
        raise HarnessError(f"{source}: contract.review.tier: {e}") from None
    models = ws.config.settings.models
    for tier in executor_tiers(task, models):
        es = models.get(tier)
        if es is None:  # not configured: the executor's own check says so
            continue
        if es.family.strip().lower() == rs.family.strip().lower():
            raise HarnessError(
                f"{source}: contract.review.tier {review.tier} (model {rs.model}) is of the "
                f"same family {rs.family!r} as the executor's tier {tier} (model {es.model}): "
                "a reviewer must be of another model family")


# --- the deliverable ---------------------------------------------------------------------


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    return json.dumps(x) if not isinstance(x, str) else x


def _medians(blk: BlockRecord) -> dict[str, tuple[float, int]]:
    by: dict[str, list[float]] = {}
    for r in blk.runs():
        if r.success:
            for k, v in r.metrics.items():
                by.setdefault(k, []).append(float(v))
    return {k: (statistics.median(v), len(v)) for k, v in sorted(by.items())}


def _measure_lines(d: Deliverable, label: str, blk: BlockRecord) -> list[str]:
    runs = blk.runs()
    ok = sum(1 for r in runs if r.success)
    ids = [m["event_id"] for m in blk.measurements if not m.get("invalidated")]
    d.cite(blk.block_id, *ids)
    lines = [f"{label} (block {blk.block_id}): {ok} of {len(runs)} runs succeeded; "
             f"measurement events: {', '.join(ids) or 'none'}"]
    errors = sorted({m["error"] or "" for m in blk.measurements
                     if not m.get("invalidated") and not m["success"] and m["error"]})
    if errors:
        lines.append(f"  failed runs: {'; '.join(errors)[:500]}")
    for metric, (med, n) in _medians(blk).items():
        d.cite(metric)
        lines.append(f"  {metric}: median {_fmt(med)} (n={n})")
    return lines


def _gate_line(g: GateResult) -> str:
    nums = []
    if g.median is not None:
        nums.append(f"median {_fmt(g.median)}")
    if g.baseline_median is not None:
        nums.append(f"baseline median {_fmt(g.baseline_median)}")
    if g.ratio is not None:
        nums.append(f"ratio {_fmt(g.ratio)}")
    if g.ci:
        nums.append(f"ci [{', '.join(_fmt(x) for x in g.ci)}]")
    if g.cv is not None:
        nums.append(f"cv {_fmt(g.cv)}")
    if g.threshold is not None and g.direction:
        nums.append(f"{g.direction} {_fmt(g.threshold)}")
    if g.n:
        nums.append(f"n={g.n}")
    metric = f" on {g.metric}" if g.metric else ""
    return (f"- {g.name} ({g.kind}{metric}): {g.verdict.upper()}"
            + (f"; {', '.join(nums)}" if nums else "") + (f" — {g.reason}" if g.reason else ""))


def _diffs(ws: Workspace, lt: Any, candidate: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """member -> (pinned commit, candidate commit, diff text) for each code.<member>."""
    code = {k[len(CODE_PREFIX):]: v for k, v in candidate.items()
            if k.startswith(CODE_PREFIX) and isinstance(v, str)}
    if not code:
        return {}
    mono = task_monorepo(ws, lt)
    pins = pinned(ws, lt, mono)
    diffs: dict[str, tuple[str, str, str]] = {}
    for m, sha in sorted(code.items()):
        base = pins.get(m)
        if base is None:
            continue
        try:
            text = out(["diff", "--stat", "--patch", "--no-color", "--no-ext-diff",
                        f"{base}..{sha}"], mono.member_dir(m))
        except RepoError as e:
            text = f"(no diff: {' '.join(str(e).split())[:300]})"
        diffs[m] = (base, sha, text)
    return diffs


def deliverable(ws: Workspace, lt: Any, blk: BlockRecord, mem: TaskMemory,
                gate_results: list[GateResult], handoff: dict[str, Any] | None = None
                ) -> Deliverable:
    """The reviewer's prompt for block `blk` (module contract) and the evidence it lists."""
    d = Deliverable("")
    task = lt.task
    parts = [f"# Task {lt.task_id} ({task.type})", f"Goal: {task.goal}"]
    if task.scope:
        parts.append("Scope: " + json.dumps(
            {k: v if isinstance(v, list) else v.model_dump(mode="json")
             for k, v in task.scope.items()}, sort_keys=True))
    parts += ["", f"# Candidate (block {blk.block_id}, sub-goal: {blk.sub_goal})",
              json.dumps(blk.candidate, sort_keys=True)]
    d.cite("candidate")
    budget = MAX_DIFF_CHARS
    for m, (base, sha, text) in _diffs(ws, lt, blk.candidate).items():
        d.cite(f"diff:{m}")
        shown = text if len(text) <= budget else text[:max(budget, 0)] + \
            f"\n… (diff cut at {MAX_DIFF_CHARS} characters)"
        budget -= len(shown)
        parts += ["", f"# Diff of code.{m} (diff:{m}): pinned {base} .. candidate {sha}",
                  shown or "(no change)"]
    parts += ["", "# Measurements (medians of the successful runs)"]
    parts += _measure_lines(d, "candidate", blk)
    base_blk = mem.baseline_block()
    if base_blk is not None and base_blk is not blk:
        parts += _measure_lines(d, "baseline", base_blk)
    tools = [t for t in blk.tool_calls if t.get("event_id")]
    if tools:
        parts += ["", "# Tool calls of the block"]
        for t in tools:
            d.cite(t["event_id"])
            parts.append(f"- {t['event_id']}: {t['tool']} exit {t.get('exit_code')}")
    parts += ["", "# Gate verdicts (the contract's gates on these measurements)"]
    for g in gate_results:
        d.cite(g.name)
        if g.metric:
            d.cite(g.metric)
        parts.append(_gate_line(g))
    hand = handoff if handoff is not None else mem.last_handoff
    if hand:
        d.cite("handoff")
        parts += ["", f"# Last handoff (handoff, block {hand.get('block_id')}, "
                      f"{hand.get('outcome')})", str(hand.get("state_reached") or "")]
        parts += [f"- finding: {f}" for f in hand.get("findings") or []]
        if hand.get("next_sub_goal"):
            parts.append(f"- next sub-goal: {hand['next_sub_goal']}")
    parts += ["", "# Evidence you may cite", ", ".join(sorted(d.evidence.values()))]
    d.text = "\n".join(parts)
    return d


# --- the answer ----------------------------------------------------------------------------

_FENCE = re.compile(r"\A```(?:json)?\s*\n(.*)\n```\Z", re.S)


def _clean(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """One line of the reviewer's text: control characters and runs of space folded."""
    one = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return one if len(one) <= limit else one[:limit - 1] + "…"


def parse_answer(content: str, evidence: dict[str, str]
                 ) -> tuple[str, list[tuple[str, list[str]]], str | None]:
    """(verdict, [(reason text, cited evidence)], why invalid or None), read strictly."""
    text = content.strip()
    fenced = _FENCE.match(text)  # one fenced object is still one object
    if fenced:
        text = fenced.group(1).strip()
    if not text:
        return "invalid", [], "the reviewer answered nothing"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return "invalid", [], (f"the answer is not one JSON object ({e.msg} at character "
                               f"{e.pos}): {_clean(text, 80)!r}")
    try:
        ans = _Answer.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top)"
        return "invalid", [], f"the answer is not the verdict object: {where}: {err['msg']}"
    reasons: list[tuple[str, list[str]]] = []
    for i, r in enumerate(ans.reasons[:MAX_REASONS], 1):
        cited = list(dict.fromkeys(evidence[e.strip().lower()] for e in r.evidence
                                   if e.strip().lower() in evidence))
        if ans.verdict == "object" and not cited:
            given = ", ".join(_clean(e, 60) for e in r.evidence) or "none"
            return "invalid", [], (f"objection reason {i} cites no evidence of the "
                                   f"deliverable (cited: {given})")
        reasons.append((_clean(r.text), cited))
    if ans.verdict == "object" and not reasons:
        return "invalid", [], "an objection without reasons"
    return ans.verdict, reasons, None


def _reason_line(text: str, cited: list[str]) -> str:
    return f"{text} (evidence: {', '.join(cited)})" if cited else text


def review_block(ws: Workspace, lt: Any, blk: BlockRecord, mem: TaskMemory,
                 gate_results: list[GateResult], handoff: dict[str, Any] | None = None, *,
                 event_fields: dict[str, Any] | None = None) -> Review:
    """Review block `blk` on the contract's review tier (module contract). `lt` is the
    task as the loop loaded it (harness.task.LoadedTask); `event_fields` the events'
    envelope (task, block, actor, input digests)."""
    spec = lt.task.contract.review
    if spec is None:
        raise HarnessError(f"task {lt.task_id}: the contract has no review")
    fields = dict(event_fields or {})
    tier = spec.tier
    try:
        s: ModelSettings | None = tier_settings(ws, tier)
    except HarnessError as e:  # configured when defined, gone since: recorded, not raised
        s, missing = None, str(e)
    called: E.ModelCalled | None = None
    response_digest: str | None = None
    cited_all: list[str] = []
    reasons: list[tuple[str, list[str]]] = []
    why = ""
    if s is None:
        verdict, why = "invalid", missing
    else:
        d = deliverable(ws, lt, blk, mem, gate_results, handoff)
        settings = s.model_copy(update={"timeout_s": spec.timeout_s})
        reply = call_model(ws, tier, [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": d.text}],
                           purpose="reviewer", event_fields=fields, settings=settings)
        called = reply.event
        response_digest = called.response_digest if called is not None else None
        if not reply.success:
            verdict, why = "invalid", reply.error or "the call failed"
        elif reply.tool_calls and not reply.content.strip():
            verdict, why = "invalid", (f"the reviewer called tools "
                                       f"({', '.join(c.name for c in reply.tool_calls)[:80]}) "
                                       "instead of answering")
        else:
            verdict, reasons, invalid = parse_answer(reply.content, d.evidence)
            why = invalid or ""
        cited_all = list(dict.fromkeys(e for _, c in reasons for e in c))
    who = f"{tier} ({s.model}, family {s.family})" if s else tier
    lines = [_reason_line(t, c) for t, c in reasons]
    if verdict == "approve":
        gate_reason = f"review by {who} approves" + (f": {'; '.join(lines)}" if lines else "")
        gate_verdict = "pass"
    elif verdict == "object":
        gate_reason = f"review by {who} objects: {'; '.join(lines)}"
        gate_verdict = "fail"
    else:
        lines = [_clean(why, 300)]
        gate_reason = (f"review by {who} is invalid: {lines[0]} (an unverifiable review "
                       "does not pass)")
        gate_verdict = "inconclusive"
    if len(gate_reason) > MAX_GATE_REASON:
        gate_reason = gate_reason[:MAX_GATE_REASON - 1] + "…"
    gate = GateResult.judged(gate_verdict, name=GATE_NAME, kind="review",  # type: ignore[arg-type]
                             reason=gate_reason)
    recorded = E.ReviewRecorded(
        tier=tier, model=s.model if s else "", family=s.family if s else "",
        verdict=verdict, reasons=lines, evidence=cited_all,
        response_digest=response_digest,
        causation_id=called.event_id if called is not None else None,
        # The verdict is the reviewer's: its actor is the reviewing model.
        **{**fields, **({"actor": E.Actor.agent(f"reviewer:{tier}", s.model)} if s else {})})
    return Review(gate, recorded, called)


# --- the verification path's use ----------------------------------------------------------


_ORDER = {"pass": 0, "inconclusive": 1, "fail": 2}


def with_review(ws: Workspace, lt: Any, blk: BlockRecord, mem: TaskMemory, res: StepResult,
                judged: Any, event_fields: dict[str, Any]) -> tuple[StepResult, Any,
                                                                    list[E.Event]]:
    """The `gates` step with the review (module contract): (its StepResult, the Verdict with
    the review's gate, the events to save with the verification). `judged` is the
    contract's `gates.Verdict`; unchanged (no events) when no review is due."""
    if lt.task.contract.review is None or blk.is_baseline or judged.verdict != "pass":
        return res, judged, []
    review = review_block(ws, lt, blk, mem, list(judged.gates), event_fields=event_fields)
    gates = [*judged.gates, review.gate]
    verdict = max((g.verdict for g in gates), key=lambda v: _ORDER[v])
    new = type(judged)(verdict, gates)
    detail = f"{len(judged.gates)} gates pass; review {review.recorded.verdict}" \
        if verdict == "pass" else f"{GATE_NAME} {review.gate.verdict}"
    return res.model_copy(update={"outcome": verdict, "detail": detail}), new, review.events
