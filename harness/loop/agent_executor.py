"""The agent executor (`executor: {kind: agent}`): a tool-calling loop over the chat endpoint of
the model tier routing chooses for the block, deciding each loop block's candidate.

Contract:
- `AgentExecutor(ws, task).decide(memory, task, point, profile) -> Decision` (the loop's
  Executor protocol). The tier and topology are `harness.loop.routing.route(...)` for the
  next block, as the loop records them on `LoopBlockStarted.routing`: an escalated block's
  calls go to the escalated tier's endpoint.
- The model gets a system prompt with the task (goal, scope, contract, exit criteria), a
  summary of Task Memory, its prior tasks' exits, handoffs and best results
  (`context.prior_tasks`) and the skills chosen for the block (`skills.select` on the
  sub-goal the last handoff proposed, else the goal; once per query in one run), and the
  tools: the read tools of `TOOLS` (`task_memory`, `task_show`, `artifact_read`,
  `skills_list`, `skills_get`), `write_file`, a `run_command` that runs in the task's scratch
  directory or worktrees before the block exists (its answer the MCP run_command's, less the
  block; `artifact_read` reads its output, not saved yet, too), and two decision tools:
  `propose {candidate, sub_goal}` and `stop {reason, handoff}`. It has `executor.max_steps`
  turns (model calls) and `executor.timeout_s` seconds for one decision.
- Topologies: `single`; `planner-executor`: the planner tier (routing's `planner_tier`)
  writes the block's plan in one call, then the executor tier executes it with the tools
  (its calls are `sub-agent` calls); `executor-reviewer`: a proposal is critiqued once by the
  reviewer tier (`verdict {verdict, reasons}`); an objection goes back to the executor, which
  revises once (its next proposal stands). A planner or reviewer call that fails is a
  failed step: the executor goes on without the plan, the proposal stands without review.
- Nothing is saved here (no block is open while deciding): every model call
  (`ModelCalled`), tool call (`ToolInvoked`), failed step (`AgentStepFailed`) and skills
  choice (`SkillsProvided`) is returned on `Decision.events`; the loop saves them with the
  block the decision starts, or task-level with the exit a stop makes. A killed loop asks
  again: nothing recorded is lost, nothing is recorded twice.
- Bad output is data, never an exception: malformed tool-call JSON, an unknown tool,
  arguments that do not validate, a candidate outside the scope (`decision.out_of_scope`)
  or already tried, prose (or a refusal) instead of a tool call, an HTTP error, a body that
  is not a chat completion, a timeout: each is an `AgentStepFailed` with a one-line reason,
  the model is told, and the loop goes on. Typed exits: the endpoint down (no connection)
  → `failed-blocked`; `max_steps` or `timeout_s` spent without a decision →
  `failed-blocked` (the executor cannot decide: a person or a stronger tier must);
  the task's model budget (`exit.max_tokens`, `exit.max_cost_usd`, counted over every
  `ModelCalled` of the task) spent mid-decision → `failed-budget`; a `stop` call → the
  loop's ordinary stop (a handoff, or the best passing candidate of a best_in_scope task).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...ledger import events as E
from ...ledger.candidates import canonical_candidate
from ...ledger.clock import utcnow
from ...ledger.sizes import capped
from ...ledger.specs import (
    CODE_PREFIX,
    DeploymentPoint,
    RuntimeProfile,
    TaskDefinition,
    effective_digest,
)
from ...ledger.text import one_line
from ...ledger.workspace import Workspace
from ...projections.memory import TaskMemory, prior_brief
from ..agents import approval_tool, task_tools
from ..agents import skills as S
from ..agents import tool_registry as T
from ..agents.context import (
    PLAN_PROMPT,
    REVIEW_PROMPT,
    SYSTEM_PROMPT,
    memory_view,
    prior_view,
    task_view,
)
from ..agents.models import ModelReply, call_model, put_json
from ..errors import HarnessError
from ..guard.task_dirs import dir_in_task
from ..tool_calls.calls import output_tail, run_tool
from .decision import Decision, describe, out_of_scope
from .routing import route

AGENT_NAME = "forge-agent"
# The registry tools a decision's calls may name (the loop's own steps are not among them:
# no block is open while deciding); it offers the read ones and write_file, and adds its own.
TOOLS = T.registry(task_tools.TOOLS, approval_tool.TOOLS, S.TOOLS)
MAX_COMMAND_S = 120.0  # one run_command while deciding

class ProposeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidate: dict[str, Any] = Field(description="scope key -> value (code.<member> -> a "
                                      "commit, `worktree`, `patch:<file>` or `upstream`)")
    sub_goal: str = Field(min_length=1, max_length=2000, description="what the block tries")
    task_id: str | None = Field(None, description="optional: this task's id")


class StopArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=2000)
    handoff: str | None = Field(None, max_length=8000, description="what a successor should "
                                "know: best so far, what failed and why, what to try next")
    task_id: str | None = Field(None, description="optional: this task's id")


class VerdictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verdict: Literal["approve", "object"]
    reasons: list[str] = Field(default_factory=list, max_length=20)


@dataclass
class DecisionStats:
    """What one decision cost (the benchmark reads it): wall time, the model's own latency."""

    wall_s: float = 0.0
    model_s: float = 0.0
    calls: int = 0
    steps: int = 0


@dataclass
class _Session:
    """One decision's state: the events it collects, the messages so far, the outcome."""

    task: TaskDefinition
    memory: TaskMemory
    point: DeploymentPoint | None
    profile: RuntimeProfile | None
    routing: dict[str, Any]
    deadline: float
    events: list[E.Event] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    proposal: tuple[dict[str, Any], str] | None = None
    stopped: tuple[str, str | None] | None = None
    reviewed: bool = False
    objection: str | None = None  # told after the turn's tool results (protocol order)
    tokens: int = 0
    cost: float = 0.0
    failures: list[str] = field(default_factory=list)


class AgentExecutor:
    kind = "agent"

    def __init__(self, ws: Workspace, task: TaskDefinition):
        self.ws, self.task = ws, task
        self.models = ws.config.settings.models
        self.model_tiers = {k: v for k, v in ws.config.settings.model_tiers.model_dump().items()
                            if v}
        tier = route(task, 0, self.model_tiers, self.models)["model_tier"]
        if tier not in self.models:
            # Before anything is recorded: a task whose agent has no model records nothing.
            raise HarnessError(
                f"executor kind agent: no model for tier {tier!r}: add [models.{tier}] (url, "
                f"model, family) to {ws.home / 'forge.toml'} (tiers configured: "
                f"{', '.join(sorted(self.models)) or 'none'})")
        self.last = DecisionStats()
        # Skills chosen per (task type, query), read once per executor (one `forge task
        # run`): a skill edited meanwhile is read by the next run.
        self._skills_cache: dict[tuple[str, str], tuple[Any, E.Event]] = {}

    # --- the decision ----------------------------------------------------------------

    def decide(self, memory: TaskMemory, task: TaskDefinition, point: DeploymentPoint | None,
               profile: RuntimeProfile | None) -> Decision:
        t0 = time.monotonic()
        self.last = DecisionStats()
        routing = route(task, memory.no_progress_streak, self.model_tiers, self.models)
        s = _Session(task, memory, point, profile, routing,
                     deadline=t0 + task.executor.timeout_s)
        try:
            return self._decide(s)
        finally:
            self.last.wall_s = time.monotonic() - t0

    def _decide(self, s: _Session) -> Decision:
        tier, topology = s.routing["model_tier"], s.routing["agent_topology"]
        settings = self.models[tier]
        actor = E.Actor.agent(AGENT_NAME, settings.model)
        task_id = str(s.memory.task_id)
        ctx = T.ToolContext(self.ws, actor, task_id, collect=s.events,
                            extra=self._decision_tools(s, actor), tools=TOOLS)
        schemas = T.openai_schemas(ctx, names=self._offered(ctx))
        context = "\n\n".join(x for x in (
            f"Your task id: {task_id}.",
            "## The task\n" + json.dumps(task_view(s.task), sort_keys=True),
            "## Task Memory (summary)\n" + json.dumps(memory_view(s.memory), sort_keys=True,
                                                      default=str),
            self._prior(s),
            self._skills(s, actor)) if x)
        index = len(s.memory.execution_record) + 1
        s.messages = [{"role": "system", "content": f"{SYSTEM_PROMPT}\n\n{context}"},
                      {"role": "user", "content": f"Choose block b{index}: call propose or "
                       "stop."}]
        purpose = "executor"
        if topology == "planner-executor":
            purpose = "sub-agent"
            stop = self._budget_or_deadline(s)
            if stop is not None:
                return stop
            plan = self._plan(s, index, context)
            if plan:
                s.messages.append({"role": "user", "content": "The planner's plan for this "
                                   f"block (execute it with the tools):\n{plan}"})
        for step in range(s.task.executor.max_steps):
            stop = self._budget_or_deadline(s)
            if stop is not None:
                return stop
            self.last.steps = step + 1
            reply = self._call(s, tier, s.messages, schemas, purpose, actor)
            if not reply.success:
                self._fail(s, actor, None, f"model call failed: {reply.error}")
                if reply.error_kind == "down":
                    return self._exit(s, "failed-blocked", f"agent executor: the model "
                                      f"endpoint of tier {tier} is down: {reply.error}")
                continue
            if not reply.tool_calls:
                self._no_tool_call(s, actor, reply)
                continue
            s.messages.append({"role": "assistant", "content": reply.content or None,
                               "tool_calls": [{"id": c.id, "type": "function", "function": {
                                   "name": c.name, "arguments": c.arguments}}
                                   for c in reply.tool_calls]})
            for c in reply.tool_calls:
                out = self._tool(ctx, s, c.name, c.arguments)
                s.messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
                decision = self._outcome(s, actor)
                if decision is not None:
                    return decision
            if s.objection is not None:
                s.messages.append({"role": "user", "content": s.objection})
                s.objection = None
        return self._exit(s, "failed-blocked", f"agent executor: no decision in "
                          f"{s.task.executor.max_steps} steps" + self._last_failures(s))

    def _outcome(self, s: _Session, actor: E.Actor) -> Decision | None:
        """The decision once a decision tool succeeded (a proposal after its review)."""
        if s.stopped is not None:
            reason, handoff = s.stopped
            return Decision("stop", reason=f"agent stopped: {reason}", handoff=handoff,
                            events=s.events, actor=actor)
        if s.proposal is None:
            return None
        cand, sub_goal = s.proposal
        if s.routing["agent_topology"] == "executor-reviewer" and not s.reviewed:
            s.reviewed = True
            objection = self._review(s, cand, sub_goal)
            if objection is not None:
                s.proposal = None
                s.objection = (f"The reviewer objected to {describe(cand)}: {objection}. "
                               "Revise once: call propose again (the same candidate if you "
                               "disagree), or stop.")
                return None
        return Decision("try", cand, sub_goal=sub_goal, events=s.events, actor=actor)

    # --- model calls ------------------------------------------------------------------

    def _call(self, s: _Session, tier: str, messages: list[dict[str, Any]],
              schemas: list[dict[str, Any]] | None, purpose: str, actor: E.Actor
              ) -> ModelReply:
        settings = self.models[tier]
        left = max(0.001, s.deadline - time.monotonic())
        if left < settings.timeout_s:  # the decision's own limit bounds each call
            settings = settings.model_copy(update={"timeout_s": left})
        reply = call_model(self.ws, tier, messages, tools=schemas, purpose=purpose,
                           settings=settings,
                           event_fields={"task_id": s.memory.task_id, "actor": actor})
        assert reply.event is not None
        s.events.append(reply.event)
        s.tokens += reply.tokens_in + reply.tokens_out
        s.cost += reply.cost_usd
        self.last.calls += 1
        self.last.model_s += reply.latency_s
        return reply

    def _plan(self, s: _Session, index: int, context: str) -> str:
        tier = s.routing.get("planner_tier", s.routing["model_tier"])
        actor = E.Actor.agent(AGENT_NAME, self.models[tier].model)
        messages = [{"role": "system", "content": f"{PLAN_PROMPT}\n\n{context}"},
                    {"role": "user", "content": f"Plan block b{index}."}]
        reply = self._call(s, tier, messages, None, "planner", actor)
        if not reply.success:
            self._fail(s, actor, None, f"planner: model call failed: {reply.error}")
            return ""
        if not reply.content.strip():
            self._fail(s, actor, None, "planner: an empty plan"
                       + (" (it asked for tools)" if reply.tool_calls else ""))
        return reply.content.strip()

    def _review(self, s: _Session, cand: dict[str, Any], sub_goal: str) -> str | None:
        """One reviewer call on a proposal: its objection (one line), or None (approved; a
        review that failed is recorded and lets the proposal stand)."""
        tier = s.routing.get("reviewer_tier", s.routing["model_tier"])
        actor = E.Actor.agent(AGENT_NAME, self.models[tier].model)
        schema = [{"type": "function", "function": {
            "name": "verdict", "description": "your verdict on the proposal",
            "parameters": VerdictArgs.model_json_schema()}}]
        messages = [{"role": "system", "content": REVIEW_PROMPT},
                    {"role": "user", "content": "## The task\n" + json.dumps(
                        task_view(s.task), sort_keys=True) + "\n\n## Task Memory (summary)\n"
                     + json.dumps(memory_view(s.memory), sort_keys=True, default=str)
                     + "\n\n## The proposal\n" + json.dumps(
                         {"candidate": cand, "sub_goal": sub_goal}, sort_keys=True)}]
        reply = self._call(s, tier, messages, schema, "reviewer", actor)
        if not reply.success:
            self._fail(s, actor, "verdict", f"reviewer: model call failed: {reply.error}")
            return None
        raw = reply.tool_calls[0].arguments if reply.tool_calls else reply.content
        try:
            v = VerdictArgs.model_validate_json(raw)
        except ValueError as e:
            self._fail(s, actor, "verdict", "reviewer: no verdict: "
                       + one_line(str(e).splitlines()[0] if str(e) else raw, 200),
                       {"raw": raw[:2000]})
            return None
        if v.verdict == "approve":
            return None
        return one_line("; ".join(v.reasons) or "no reasons given", 1000)

    # --- tools ------------------------------------------------------------------------

    def _offered(self, ctx: T.ToolContext) -> list[str]:
        """The registry's read tools, write_file, and this executor's own."""
        names = [t.name for t in ctx.tools.values() if not t.writes]
        return [*names, "write_file", *ctx.extra]

    def _decision_tools(self, s: _Session, actor: E.Actor) -> dict[str, T.AgentTool]:
        ws = self.ws

        def propose(_ctx: T.ToolContext, a: ProposeArgs) -> Any:
            cand = dict(a.candidate)
            code_keys = {k: v for k, v in cand.items() if k.startswith(CODE_PREFIX)}
            members = s.task.code.members if s.task.code else []
            for k in code_keys:  # its commit is resolved when the block starts
                if k[len(CODE_PREFIX):] not in members:
                    raise HarnessError(f"out of scope: {k}: the task changes no member "
                                       f"{k[len(CODE_PREFIX):]!r} (code.members: "
                                       f"{', '.join(members) or 'none'})")
            cand = canonical_candidate(s.task.scope, cand)  # tried under one spelling
            rest = {k: v for k, v in cand.items() if k not in code_keys}
            problem = out_of_scope(s.task, s.point, s.profile, rest)
            if problem:
                raise HarnessError(f"out of scope: {problem}")
            if not code_keys and effective_digest(s.point, s.profile, cand) in s.memory.tried:
                raise HarnessError(f"{describe(cand)} was already tried: propose another "
                                   "candidate, or stop")
            s.proposal = (cand, a.sub_goal)
            return {"accepted": True, "candidate": cand}

        def stop(_ctx: T.ToolContext, a: StopArgs) -> Any:
            s.stopped = (a.reason, a.handoff)
            return {"stopped": True}

        def run_command(_ctx: T.ToolContext, a: task_tools.RunArgs) -> Any:
            # Made without following a link, as the MCP run_command's (task_dirs.dir_in_task).
            cwd = dir_in_task(ws, str(s.memory.task_id), a.cwd or ".", "cwd")
            left = max(1.0, min(MAX_COMMAND_S, s.deadline - time.monotonic()))
            run = run_tool(ws, a.argv, tool="agent", cwd=cwd, timeout=left,
                           sandbox=s.task.sandbox,
                           event_fields={"task_id": s.memory.task_id, "actor": actor})
            s.events.append(run.event)
            # The MCP run_command's answer (harness/loop/manual.py), less the block: none yet.
            return {"exit_code": run.returncode, "error": run.event.error,
                    "stdout_digest": run.event.stdout_digest,
                    "stderr_digest": run.event.stderr_digest,
                    "event_id": str(run.event.event_id), **output_tail(run)}

        return {
            "propose": T.AgentTool("propose", "Decide: the next block's candidate (inside "
                                   "the scope, not tried before) and its sub-goal.",
                                   ProposeArgs, propose),
            "stop": T.AgentTool("stop", "Decide: stop the task's loop (nothing worth trying "
                                "is left), with a handoff note.", StopArgs, stop),
            "run_command": T.AgentTool(
                "run_command", "Run a command (argv) in the task's scratch directory or its "
                "worktrees (cwd), recorded with the block this decision starts. Answers its "
                "exit code and the end of its output, redacted (stdout, stderr: the last 8 KB "
                "each; *_cut: the bytes left out before them); artifact_read reads the whole "
                "by its *_digest.",
                task_tools.RunArgs, run_command, writes=True),
        }

    def _tool(self, ctx: T.ToolContext, s: _Session, name: str, arguments: str) -> str:
        """Run one tool call (failures are collected by the registry); the text the model
        reads back. A successful registry tool is recorded as a tool call of the block."""
        args: str | dict[str, Any] = arguments
        try:  # the task's id is implied: this agent works on one task
            parsed = json.loads(arguments) if arguments.strip() else {}
            t = T.available(ctx).get(name)
            if isinstance(parsed, dict) and t is not None and "task_id" in \
                    t.params.model_fields and "task_id" not in parsed:
                args = {**parsed, "task_id": ctx.task_id}
        except json.JSONDecodeError:
            pass  # the registry records it as malformed
        n_events = len(s.events)
        t0 = time.monotonic()
        try:
            res = T.call(ctx, name, args)
        except Exception as e:  # a handler's own bug or OS error: a failed step, not a crash
            res = T.ToolResult(False, error=f"{name}: {type(e).__name__}: {e}")
        if not res.ok:
            if len(s.events) == n_events:  # not recorded by the registry
                self._fail(s, ctx.actor, name, res.error or "failed", args)
            else:
                s.failures.append(res.error or "failed")
            return res.text()
        if name not in ("propose", "stop", "run_command"):
            text = res.text()
            s.events.append(E.ToolInvoked(
                tool=f"agent:{name}", argv=[name, one_line(json.dumps(
                    args, sort_keys=True, default=str), 2000)],
                exit_code=0, duration_s=round(time.monotonic() - t0, 6),
                stdout_digest=put_json(self.ws, res.result),
                task_id=s.memory.task_id, actor=ctx.actor))
            return text
        return res.text()

    def _no_tool_call(self, s: _Session, actor: E.Actor, reply: ModelReply) -> None:
        text = reply.content.strip()
        if reply.finish_reason == "content_filter":
            why = "refused (finish_reason content_filter)"
        elif text:
            why = f"no tool call: the model answered prose: {one_line(text, 160)!r}"
        else:
            why = f"no tool call: an empty answer (finish_reason {reply.finish_reason})"
        self._fail(s, actor, None, why)
        if text:
            s.messages.append({"role": "assistant", "content": text})
        s.messages.append({"role": "user", "content": "Answer with a tool call: propose "
                           "{candidate, sub_goal} or stop {reason, handoff}."})

    # --- failures, exits, budgets -------------------------------------------------------

    def _fail(self, s: _Session, actor: E.Actor, tool: str | None, reason: str,
              arguments: Any = None) -> None:
        reason = capped(one_line(reason), T.REASON_BYTES)  # the model's text: bounded
        s.failures.append(reason)
        args = {} if arguments is None else T.capped_arguments(arguments)
        s.events.append(E.AgentStepFailed(tool=tool, reason=reason, arguments=args,
                                          task_id=s.memory.task_id, actor=actor))

    def _last_failures(self, s: _Session) -> str:
        return f" (last: {one_line(s.failures[-1], 200)})" if s.failures else ""

    def _exit(self, s: _Session, state: Literal["failed-blocked", "failed-budget"],
              reason: str) -> Decision:
        return Decision("stop", reason=one_line(reason, 600), events=s.events,
                        exit_state=state)

    def _budget_or_deadline(self, s: _Session) -> Decision | None:
        ex, mem = s.task.exit, s.memory
        tokens = mem.model_tokens_in + mem.model_tokens_out + s.tokens
        cost = mem.model_cost_usd + s.cost
        if ex.max_tokens is not None and tokens >= ex.max_tokens:
            return self._exit(s, "failed-budget", f"token budget spent: {tokens} of "
                              f"{ex.max_tokens} tokens (mid-decision)")
        if ex.max_cost_usd is not None and cost >= ex.max_cost_usd:
            return self._exit(s, "failed-budget", f"cost budget spent: ${cost:.4f} of "
                              f"${ex.max_cost_usd:.4f} (mid-decision)")
        if time.monotonic() >= s.deadline:
            return self._exit(s, "failed-blocked", f"agent executor: no decision within "
                              f"{s.task.executor.timeout_s:g}s" + self._last_failures(s))
        return None

    def _prior(self, s: _Session) -> str:
        """The prior tasks (`context.prior_tasks`) as prompt text: their exits, handoffs and
        best results, read from the ledger at each decision (a prior task may move on)."""
        if not s.task.context.prior_tasks:
            return ""
        briefs = [prior_brief(self.ws.ledger, t) for t in s.task.context.prior_tasks]
        return "## Prior tasks (start from what they learned)\n" + json.dumps(
            prior_view(briefs), sort_keys=True, default=str)

    # --- skills ---------------------------------------------------------------------------

    def _skills(self, s: _Session, actor: E.Actor) -> str:
        """The skills for this block as prompt text, their choice recorded (SkillsProvided):
        harness/agents/skills.py's `select(ws, task_type, query, k)` on the sub-goal the last
        handoff proposed (else the task's goal)."""
        mod = S
        nb = s.memory.next_block or {}
        query = str(nb.get("sub_goal") or s.task.goal)
        key = (s.task.type, query)
        if key not in self._skills_cache:
            try:
                self._skills_cache[key] = mod.select(self.ws, s.task.type, query, 3)
            except (HarnessError, OSError, ValueError) as e:
                self._fail(s, actor, None, f"skills: none chosen: {e}")
                return ""
        skills, event = self._skills_cache[key]
        s.events.append(event.model_copy(update={  # a new fact each block: its own id
            "event_id": uuid.uuid4(), "occurred_at": utcnow(), "task_id": s.memory.task_id,
            "actor": actor}))
        return f"## Skills for this block\n{mod.render(skills)}" if skills else ""
