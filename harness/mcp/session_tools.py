"""The tools of one agent session (the MCP server's, given to `ToolContext.extra`): engines
the agent launches and keeps up between calls, the benchmark client, the task's evaluator on
the open block, and the journal's read-only queries.

Contract:
- `AgentSession(ws)` holds what outlives one call: the running engines (by id, `e1`, `e2`, …)
  and one evaluator per task (its prompt set and tokenizer are built once). `close()` stops
  every engine still up (the server calls it when it ends: no orphan process).
- `session_tools(session, retrieve=None)` → name → AgentTool:
  - `engine_up`: a task's runtime profile with its open block's candidate (or a candidate in
    the task's scope) on the point's model, or a runtime profile / deployment point file.
    For a task, EngineLaunched/EngineStopped go on the task's stream (its open block when one
    is open) with the agent as actor; otherwise on `engines`.
  - `engine_down`: stop one engine (or every engine of the session).
  - `bench`: the benchmark client against an engine of the session or a URL, with the task's
    point's traffic; with a task, one MeasurementRecorded in its open block (task-level when
    none is open) by the agent. An engine launched for the task must run the open block's
    candidate to measure it.
  - `evaluate`: the task's evaluator on the open block's candidate, recorded exactly as the
    loop's measure step records it (`loop.steps.measure_events`, one save).
  - `journal_compare`, `journal_filter`, `journal_sql`: `projections.queries`, read-only
    (`journal_sql` runs in the locked session of `forge sql`).
  - `journal_retrieve`: only when a `retrieve(query, k)` callable is given (the journal's
    retrieval lives in wiki/, which the harness does not import: cli.py passes it).
  - `journal_ask`: only when an `ask(question)` callable is given (`forge wiki ask`: an
    answer from the journal with its citations; read-only, nothing is filed; cli.py passes
    it for the same reason).
- Every engine this session starts runs in the tool-call sandbox (its events' actor is the
  agent: `guard/engine_sandbox.py`); a profile or point file the agent names may not run in a
  container image, and is refused where no sandbox can be made (only a task's own
  contract-pinned profile then starts).
- Every refusal is a HarnessError with one line; `registry.call` records it as AgentStepFailed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from ...ledger import events as E
from ...ledger.candidates import canonical_candidate
from ...ledger.specs import (
    DeploymentPoint,
    RuntimeProfile,
    apply_candidate,
    load_point,
    load_profile,
)
from ...ledger.streams import ENGINES_STREAM, task_stream
from ...ledger.workspace import Workspace
from ...projections.memory import read_memory
from ..agents.tool_registry import AgentTool, Args, ToolContext
from ..engines import engine_for
from ..engines.base import engine_config_of
from ..engines.whole import deploy_whole
from ..errors import HarnessError
from ..loop import code
from ..loop.decision import out_of_scope
from ..loop.steps import Stepper, measure_events
from ..models.weights import resolve_model
from ..record import task_append
from ..task import load_task_from_ledger

Retrieve = Callable[[str, int], Any]
Ask = Callable[[str], Any]


@dataclass
class EngineHandle:
    engine_id: str
    running: Any  # harness.engines.base.RunningEngine
    task_id: str | None
    candidate: dict[str, Any]
    model_dir: str | None  # the tokenizer the bench client uses
    traffic: Any = None  # the deployment point's traffic, when launched for one

    def info(self) -> dict[str, Any]:
        r = self.running
        return {"engine_id": self.engine_id, "engine": r.engine, "base_url": r.base_url,
                "model": r.model, "pid": getattr(r, "pid", None), "task_id": self.task_id,
                "candidate": self.candidate}


@dataclass
class AgentSession:
    """What one agent session keeps between calls (module contract)."""

    ws: Workspace
    engines: dict[str, EngineHandle] = field(default_factory=dict)
    evaluators: dict[str, Any] = field(default_factory=dict)
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, running: Any, task_id: str | None, candidate: dict[str, Any],
            model_dir: str | None, traffic: Any) -> EngineHandle:
        with self._lock:
            self._count += 1
            h = EngineHandle(f"e{self._count}", running, task_id, candidate, model_dir, traffic)
            self.engines[h.engine_id] = h
        return h

    def get(self, engine_id: str) -> EngineHandle:
        h = self.engines.get(engine_id)
        if h is None:
            raise HarnessError(f"no engine {engine_id!r} in this session (up: "
                               f"{', '.join(sorted(self.engines)) or 'none'}; engine_up)")
        return h

    def stop(self, engine_id: str, reason: str = "teardown") -> dict[str, Any]:
        with self._lock:
            h = self.engines.pop(engine_id, None)
        if h is None:
            raise HarnessError(f"no engine {engine_id!r} in this session")
        _retarget(self.ws, h)
        h.running.stop(reason=reason)
        return {**h.info(), "stopped": True,
                "exit_code": getattr(getattr(h.running, "server", None), "exit_code", None)}

    def close(self, reason: str = "session ended") -> list[str]:
        """Stop every engine still up (the server's exit); never raises."""
        stopped = []
        for engine_id, h in list(self.engines.items()):
            try:
                self.stop(engine_id, reason=reason)
            except Exception:  # noqa: BLE001 - an engine whose stop cannot be recorded
                server = getattr(h.running, "server", None)  # still stops
                if server is not None:
                    server.stop(reason=reason)
            stopped.append(engine_id)
        return stopped


def _retarget(ws: Workspace, h: EngineHandle) -> None:
    """Where the stop of a task's engine is recorded: the block it was launched in if that is
    still open, else the task (task-level), else (the task exited) the `engines` stream."""
    sink = getattr(h.running, "sink", None)
    if sink is None or h.task_id is None:
        return
    mem, _ = read_memory(ws.ledger, h.task_id)
    if mem.status == "exited":
        sink.stream = ENGINES_STREAM
        return
    open_block = mem.current_block.block_id if mem.current_block else None
    if sink.fields.get("block_id") != open_block:
        sink.fields["block_id"] = None


# --- what to launch ----------------------------------------------------------------------


def _model_dir(ws: Workspace, source: str, revision: str | None = None) -> str:
    """The point's model on disk, as the engine evaluator finds it (weights.resolve_model: a
    recipe pulled when missing, a hub id referenced in the shared cache at `revision`)."""
    return str(resolve_model(ws, source, revision))


def _open_task(ctx: ToolContext, task_id: str) -> tuple[Any, Any]:
    lt = load_task_from_ledger(ctx.ws, task_id)
    mem, _ = read_memory(ctx.ws.ledger, task_id)
    if mem.status == "exited":
        raise HarnessError(f"task {task_id} has exited ({mem.exit_state}); nothing more is "
                           "recorded in it")
    return lt, mem


class EngineUpArgs(Args):
    task_id: str | None = Field(None, description=(
        "launch this task's runtime profile on its point's model, with the open block's "
        "candidate applied (default when the session is bound to a task)"))
    candidate: dict[str, Any] | None = Field(None, description=(
        "with a task: a candidate in its scope instead of the open block's"))
    profile: str | None = Field(None, max_length=1000,
                                description="a runtime profile YAML file (instead of a task)")
    point: str | None = Field(None, max_length=1000, description=(
        "a deployment point YAML file: its runtime profile file and model (instead of a task)"))
    model: str | None = Field(None, max_length=1000, description=(
        "the model (a directory or a pulled name such as forge:tiny-llama); with `profile`"))


def _engine_up(session: AgentSession, ctx: ToolContext, a: EngineUpArgs) -> Any:
    task_id = a.task_id or (ctx.task_id if not (a.profile or a.point) else None)
    if sum(x is not None for x in (task_id, a.profile, a.point)) != 1:
        raise HarnessError("engine_up: give one of task_id, profile or point")
    point: DeploymentPoint | None
    profile: RuntimeProfile | None
    fields: dict[str, Any] = {"actor": ctx.actor}
    stream = None
    candidate: dict[str, Any] = {}
    if task_id is not None:
        lt, mem = _open_task(ctx, task_id)
        blk = mem.current_block
        if a.candidate is not None:
            problem = out_of_scope(lt.task, lt.point, lt.profile, a.candidate) \
                if a.candidate else None
            if problem:
                raise HarnessError(f"task {task_id}: candidate out of scope: {problem}")
            candidate = canonical_candidate(lt.task.scope, dict(a.candidate))
        elif blk is not None:
            candidate = dict(blk.candidate)
        point, profile = apply_candidate(lt.point, lt.profile, candidate)
        if profile is None:
            raise HarnessError(f"task {task_id}: its deployment point has no runtime profile "
                               "recorded to launch")
        fields.update(task_id=task_id, block_id=blk.block_id if blk else None)
        stream = task_stream(task_id)
        # Refused now, before a server starts, if the task cannot record the launch.
        task_append(ctx.ws, task_id, [E.EngineLaunched(engine="-", command=[], url="-",
                                                        **fields)])
    elif a.point is not None:
        if a.candidate:
            raise HarnessError("engine_up: a candidate applies to a task's engine only")
        point = load_point(a.point)
        ref = point.runtime_profile
        if not ref.file:
            raise HarnessError(f"engine_up: point {a.point} names no runtime_profile.file")
        profile = load_profile((Path(a.point).parent / ref.file).resolve())
    else:
        if a.candidate:
            raise HarnessError("engine_up: a candidate applies to a task's engine only")
        point, profile = None, load_profile(str(a.profile))
    name, config = engine_config_of(profile)
    if task_id is None and config.get("image"):  # the agent's own file, not a task's pin
        raise HarnessError(f"engine_up: {a.profile or a.point} runs in a container image, "
                           "whose runtime is outside the sandbox; launch a task whose runtime "
                           "profile pins it")
    source = a.model or (point.model.source if point is not None else None)
    revision = point.model.revision if point is not None and not a.model else None
    model_dir = _model_dir(ctx.ws, source, revision) if source and name != "external" else None
    ctx.progress(f"launching {name} engine" + (f" for task {task_id}" if task_id else ""))
    if point is not None and name != "external":  # the point as a whole: PD, EPD, replicas
        running = deploy_whole(ctx.ws, point, profile, model=model_dir, stream=stream,
                               event_fields=fields)
    else:
        running = engine_for(name).launch(config, model=model_dir, ws=ctx.ws, stream=stream,
                                          event_fields=fields)
    traffic = point.scenario.traffic if point is not None else None
    h = session.add(running, task_id, candidate, model_dir, traffic)
    return {**h.info(), "describe": running.describe()}


class EngineDownArgs(Args):
    engine_id: str | None = Field(None, description="the engine (default: every engine of "
                                  "this session)")


def _engine_down(session: AgentSession, ctx: ToolContext, a: EngineDownArgs) -> Any:
    ids = [a.engine_id] if a.engine_id else sorted(session.engines)
    for i in ids:
        h = session.get(i)
        if ctx.task_id is not None and h.task_id not in (None, ctx.task_id):
            raise HarnessError(f"engine {i} belongs to task {h.task_id}, not {ctx.task_id}")
    return {"stopped": [session.stop(i, reason="engine_down") for i in ids]}


# --- bench -------------------------------------------------------------------------------


class BenchArgs(Args):
    engine_id: str | None = Field(None, description="an engine of this session (engine_up)")
    url: str | None = Field(None, max_length=1000,
                            description="an OpenAI-compatible base URL (instead of an engine)")
    model: str | None = Field(None, max_length=1000,
                              description="with url: the model name requests carry")
    tokenizer: str | None = Field(None, max_length=1000,
                                  description="with url: the model's tokenizer directory")
    engine: str = Field("hf", description="the engine kind behind url (its extra body fields)")
    task_id: str | None = Field(None, description=(
        "record the run in this task's open block (its point's traffic is the default)"))
    num_prompts: int | None = Field(None, ge=1, le=100_000)
    input_len: int | None = Field(None, ge=1, le=1_000_000)
    output_len: int | None = Field(None, ge=1, le=1_000_000)
    concurrency: int | None = Field(None, ge=1, le=100_000)
    request_rate: float | None = Field(None, gt=0)
    seed: int = 42


def _length(value: Any) -> int:
    return int(round(value if isinstance(value, int | float) else value.mean))


def _bench(session: AgentSession, ctx: ToolContext, a: BenchArgs) -> Any:
    # In the function for start-up time: `forge mcp` starts without the bench client.
    from ..bench.client import bench_command

    task_id = a.task_id or ctx.task_id
    h = session.get(a.engine_id) if a.engine_id else None
    if h is not None:
        url, model, engine, tok = h.running.base_url, h.running.model, h.running.engine, \
            h.model_dir
    elif a.url and a.model:
        url, model, engine, tok = a.url, a.model, a.engine, a.tokenizer
    else:
        raise HarnessError("bench: give engine_id (engine_up) or url and model")
    traffic = h.traffic if h is not None else None
    block_id, candidate = None, {}
    if task_id is not None:
        lt, mem = _open_task(ctx, task_id)
        traffic = lt.point.scenario.traffic
        blk = mem.current_block
        block_id, candidate = (blk.block_id, dict(blk.candidate)) if blk else (None, {})
        if h is not None and h.task_id != task_id:
            raise HarnessError(f"engine {h.engine_id} was not launched for task {task_id} "
                               "(engine_up with the task): its numbers are not the task's")
        if h is not None and blk is not None and h.candidate != blk.candidate:
            raise HarnessError(f"engine {h.engine_id} runs {h.candidate or 'the baseline'}, "
                               f"not block {blk.block_id}'s candidate "
                               f"{blk.candidate or '(the baseline)'}: its numbers would be "
                               "recorded against the wrong candidate")
        if tok is None:
            tok = _model_dir(ctx.ws, lt.point.model.source)
    if tok is None:
        raise HarnessError("bench: give tokenizer (the model's tokenizer directory)")
    t = traffic
    rate = a.request_rate or (t.request_rate if t is not None and t.request_rate else math.inf)
    ctx.progress(f"benchmarking {url}")
    out = bench_command(
        url=url, model=model, tokenizer_dir=tok, engine=engine,
        num_prompts=a.num_prompts or (t.num_prompts if t is not None else 64),
        input_len=a.input_len or (_length(t.input_len) if t is not None else 128),
        output_len=a.output_len or (_length(t.output_len) if t is not None else 64),
        range_ratio=t.range_ratio if t is not None else 1.0,
        max_concurrency=a.concurrency or (t.concurrency if t is not None else None),
        request_rate=rate, seed=a.seed, ws=ctx.ws if task_id else None, task_id=task_id,
        block_id=block_id, candidate=candidate, actor=ctx.actor, guard_ws=ctx.ws)
    out["config"] = {k: v for k, v in out["config"].items() if k != "tokenizer"}
    return out


# --- evaluate ----------------------------------------------------------------------------


class EvaluateArgs(Args):
    task_id: str | None = Field(None, description="the task (default: the session's)")


def _evaluate(session: AgentSession, ctx: ToolContext, a: EvaluateArgs) -> Any:
    # In the function for start-up time: `forge mcp` starts without the evaluators.
    from ..loop.command_evaluator import make_evaluator

    task_id = a.task_id or ctx.task_id
    if task_id is None:
        raise HarnessError("evaluate: give task_id")
    lt = load_task_from_ledger(ctx.ws, task_id)
    mem, version = read_memory(ctx.ws.ledger, task_id)
    if mem.status == "exited":
        raise HarnessError(f"task {task_id} has exited ({mem.exit_state})")
    blk = mem.current_block
    if blk is None:
        raise HarnessError(f"task {task_id}: no open loop block; evaluate measures the open "
                           "block's candidate (block_start first)")
    if blk.measurements:
        raise HarnessError(f"task {task_id}: block {blk.block_id} is measured already "
                           f"({len(blk.measurements)} runs); verify and hand it off")
    evaluator = session.evaluators.get(task_id)
    if evaluator is None:
        evaluator = make_evaluator(ctx.ws, lt.task, lt.profile, base_dir=lt.base_dir)
        session.evaluators[task_id] = evaluator
    st = Stepper(ctx.ws, lt, ctx.progress)
    evs = measure_events(st, mem, blk, evaluator, actor=ctx.actor)
    sid = code.snapshot(ctx.ws, lt, f"task {task_id} {blk.block_id} measured")
    st.save(f"{blk.block_id}:measure", code.with_snapshot(evs, sid), version, memory=mem)
    runs = [e for e in evs if isinstance(e, E.MeasurementRecorded)]
    return {"task_id": task_id, "block_id": blk.block_id, "candidate": blk.candidate,
            "runs": [{"run_id": r.run_id, "success": r.success, "error": r.error,
                      "metrics": r.metrics} for r in runs]}


# --- the journal (read-only) -------------------------------------------------------------


class CompareArgs(Args):
    a: str = Field(min_length=1, max_length=500, description=(
        "a task, a block (task/b2), a runtime profile (service@rev) or a point"))
    b: str = Field(min_length=1, max_length=500, description="the other side, same forms")


class FilterArgs(Args):
    model: list[str] = Field(default_factory=list, max_length=50)
    task_type: list[str] = Field(default_factory=list, max_length=50)
    gpu: list[str] = Field(default_factory=list, max_length=50)
    engine: list[str] = Field(default_factory=list, max_length=50)
    metric: list[str] = Field(default_factory=list, max_length=50)
    task: list[str] = Field(default_factory=list, max_length=50)
    profile: list[str] = Field(default_factory=list, max_length=50)
    architecture: list[str] = Field(default_factory=list, max_length=50)
    limit: int = Field(200, ge=1, le=10_000)


class SqlArgs(Args):
    query: str = Field(min_length=1, max_length=20_000, description=(
        "one read-only query over the journal's index (SELECT / WITH / DESCRIBE / SHOW)"))
    max_rows: int = Field(200, ge=1, le=10_000)
    timeout_s: float = Field(30.0, gt=0, le=300)


class RetrieveArgs(Args):
    query: str = Field(min_length=1, max_length=2000)
    k: int = Field(5, ge=1, le=50)


class AskArgs(Args):
    question: str = Field(min_length=1, max_length=2000, description=(
        "a question about past work: flags, kernels, models, accelerators, failures"))


def _compare(ctx: ToolContext, a: CompareArgs) -> Any:
    # In the function for start-up time: `forge mcp` starts without the queries (~20 ms).
    from ...projections.queries import compare_ws

    return compare_ws(ctx.ws, a.a, a.b)


def _filter(ctx: ToolContext, a: FilterArgs) -> Any:
    # In the function for start-up time: the queries, as `_compare`.
    from ...projections.queries import filter_ws

    crit = a.model_dump(exclude={"limit"})
    t = filter_ws(ctx.ws, limit=a.limit, **crit)
    return {"rows": t.records(), "truncated": t.truncated}


def _sql(ctx: ToolContext, a: SqlArgs) -> Any:
    # In the function for start-up time: the queries, as `_compare`.
    from ...projections.queries import sql_ws

    t = sql_ws(ctx.ws, a.query, max_rows=a.max_rows, timeout_s=a.timeout_s)
    return {"columns": t.columns, "rows": [list(r) for r in t.rows], "truncated": t.truncated}


# --- the set -----------------------------------------------------------------------------


def session_tools(session: AgentSession, retrieve: Retrieve | None = None,
                  ask: Ask | None = None) -> dict[str, AgentTool]:
    """This session's tools by name (module contract)."""

    def bound(fn: Callable[[AgentSession, ToolContext, Any], Any]
              ) -> Callable[[ToolContext, Any], Any]:
        return lambda ctx, a: fn(session, ctx, a)

    out = [
        AgentTool("engine_up", "Launch an engine and keep it up between calls: the task's "
                  "runtime profile with the open block's candidate (or a candidate in scope) "
                  "on its point's model, or a runtime profile / point file. Recorded "
                  "(EngineLaunched) in the task.", EngineUpArgs, bound(_engine_up), True),
        AgentTool("engine_down", "Stop an engine this session launched (default: all).",
                  EngineDownArgs, bound(_engine_down), True),
        AgentTool("bench", "Benchmark an engine of this session (or a URL) with the task "
                  "point's traffic (bench_serving metrics); with a task, recorded as a "
                  "measurement in its open block.", BenchArgs, bound(_bench), True),
        AgentTool("evaluate", "Measure the open block's candidate with the task's evaluator "
                  "(contract repeats), recorded as the loop records its measure step.",
                  EvaluateArgs, bound(_evaluate), True),
        AgentTool("journal_compare", "Compare two tasks, blocks (task/b2), runtime profiles "
                  "(service@rev) or points: differing dimensions, metric medians and deltas, "
                  "gate verdicts.", CompareArgs, _compare),
        AgentTool("journal_filter", "Measurements (median per task, block, candidate and "
                  "metric) matching every given criterion; several values of one criterion "
                  "are alternatives.", FilterArgs, _filter),
        AgentTool("journal_sql", "One read-only SQL query over the journal's index (tables "
                  "tasks, loop_blocks, measurements, gate_verdicts, decisions, handoffs, "
                  "task_overview, block_overview, …; SHOW TABLES to list them).",
                  SqlArgs, _sql),
    ]
    if retrieve is not None:
        out.append(AgentTool(
            "journal_retrieve", "Semantic search over past decisions, handoffs and task "
            "goals in the journal.", RetrieveArgs, lambda _ctx, a: retrieve(a.query, a.k)))
    if ask is not None:
        out.append(AgentTool(
            "journal_ask", "Ask the journal a question: an answer from its concept pages and "
            "index, every claim with the ledger events it cites (event ids, types, the "
            "journal page showing each).", AskArgs, lambda _ctx, a: ask(a.question)))
    return {t.name: t for t in out}
