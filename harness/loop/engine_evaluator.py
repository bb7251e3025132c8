"""Evaluating a candidate on a real engine: launch, check outputs, benchmark, tear down.

Contract (an `Evaluator`, see evaluation.py):
- One engine launch per candidate: exactly `ctx.profile`'s engine configuration (the loop has
  applied the candidate's `engine.<key>` values to it), on `ctx.point`'s model (a `forge:`
  recipe is pulled if missing). Other scope dimensions are not this evaluator's to change: a
  candidate naming one is a failed run saying so.
- Per launch: greedy outputs on the fixed prompt set (stored as an artifact; the baseline's
  digest travels in `meta.outputs_digest`), then `repeats` benchmark runs of the point's
  traffic (seeded prompts of exact token lengths, the point's concurrency or request rate).
  Each run's metrics carry `token_match` against the baseline's outputs (1.0 for the baseline
  itself) and `failed` (requests that failed). When the task's contract has accuracy gates,
  each one's lm_eval task runs once per launch after the greedy outputs, before the
  repeats; its accuracy and per-item correctness (doc ids and 0/1 only, never text) go in
  every run's `meta.accuracy[<gate>]` (an `error` there when it could not run).
- Failures are data: a server that does not start or dies is a `RunResult(success=False)`
  with the error and the server log's tail; the server never outlives `evaluate`.
- Safety guard: all traffic goes through the production guard (an external production
  endpoint gets probe traffic within the budget or a refusal, recorded on the `guard` stream
  naming the task: the step's save owns the task stream), and outputs and records of a
  production-class endpoint are stored as lengths and digests (no token match against them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from ...ledger import events as E
from ...ledger.workspace import Workspace
from ..bench.client import BenchConfig, BenchGuard, run_bench
from ..bench.correctness import (
    GreedyOutput,
    collect_greedy_outputs,
    compare_outputs,
    is_scrubbed,
    outputs_jsonl,
)
from ..bench.datasets import Prompt, load_tokenizer, random_prompts
from ..bench.metrics import numeric_metrics
from ..engines import engine_for
from ..engines.base import engine_config_of
from ..errors import HarnessError
from ..guard import data_policy
from ..jsonl import iter_jsonl_text
from ..models.weights import model_path, parse_name, pull
from .evaluation import EvalContext, RunResult

GREEDY_MAX_TOKENS = 32


def _length(value: Any) -> int:
    return int(round(value if isinstance(value, int | float) else value.mean))


class EngineEvaluator:
    def __init__(self, ws: Workspace, task: Any, *, greedy_max_tokens: int = GREEDY_MAX_TOKENS):
        self.ws = ws
        self.task = task
        self.greedy_max_tokens = greedy_max_tokens
        self._prompts: list[Prompt] | None = None
        self._tokenizer = None
        self._model_dir: Path | None = None

    # --- setup, once per evaluator ---------------------------------------------------------

    def _model(self, point: Any) -> Path:
        if self._model_dir is None:
            source = point.model.source
            try:
                self._model_dir = model_path(Path(self.ws.home), source)
            except HarnessError:
                if parse_name(source)[0] != "recipe":
                    raise
                self._model_dir = Path(pull(self.ws, source).path)
        return self._model_dir

    def _setup(self, point: Any) -> list[Prompt]:
        """The fixed prompt set (built, with the tokenizer, on first use)."""
        if self._prompts is None:
            model_dir = self._model(point)
            self._tokenizer = load_tokenizer(model_dir)
            t = point.scenario.traffic
            self._prompts = random_prompts(self._tokenizer, t.num_prompts,
                                           _length(t.input_len), _length(t.output_len),
                                           t.range_ratio, 42)
        return self._prompts

    # --- one candidate ---------------------------------------------------------------------

    def evaluate(self, candidate: dict[str, Any], *, repeats: int, ctx: EvalContext
                 ) -> list[RunResult]:
        point, profile = ctx.point, ctx.profile
        if point is None or profile is None:
            raise HarnessError(f"task {ctx.task_id}: the engine evaluator needs a deployment "
                               "point and a runtime profile")
        others = [k for k in candidate if not k.startswith("engine.")]
        if others:
            return [RunResult({}, success=False, error=f"the engine evaluator can only change "
                              f"engine.* keys, not {', '.join(sorted(others))}")]
        prompts = self._setup(point)
        name, config = engine_config_of(profile)  # the candidate is applied already
        t = point.scenario.traffic
        say = ctx.progress
        fields = {"task_id": ctx.task_id, "block_id": ctx.block_id}
        guard = BenchGuard(self.ws, E.Actor.tool("forge-evaluator"), ctx.task_id,
                           ctx.block_id, in_step=True)
        meta: dict[str, Any] = {"source": "forge-bench", "engine": name}
        results: list[RunResult] = []
        try:
            say(f"launching {name} engine with {dict(candidate) or 'the profile as is'}")
            with engine_for(name).launch(config, model=self._model_dir, ws=self.ws,
                                         event_fields=fields) as eng:
                desc = eng.describe()
                meta["launch_command"] = desc.get("launch_command")
                meta["server_info_digest"] = self.ws.artifacts.put(
                    orjson.dumps(desc, default=str, option=orjson.OPT_SORT_KEYS))
                cfg = BenchConfig(url=eng.base_url, model=eng.model, engine=name,
                                  max_concurrency=t.concurrency,
                                  request_rate=t.request_rate or math.inf, warmup=0)
                # A warm-up pass at the measured concurrency: the first batches pay one-off
                # costs (allocation, kernel selection) that would inflate run 1.
                cls = data_policy.class_of(self.ws, url=eng.base_url, dataset="random")
                scrub = not data_policy.stores_text(self.ws, cls)
                meta["data_class"] = cls
                say(f"engine ready in {desc.get('startup_s', 0):.1f}s; warming up")
                run_bench(cfg, prompts[: max(1, t.concurrency or 1)], guard=guard)
                say("collecting greedy outputs on the fixed prompt set")
                outputs = collect_greedy_outputs(eng.base_url, eng.model, self._tokenizer,
                                                 max_tokens=self.greedy_max_tokens, engine=name,
                                                 guard=guard)
                meta["outputs_digest"] = self.ws.artifacts.put(outputs_jsonl(outputs,
                                                                             scrub=scrub))
                match = self._token_match(outputs, ctx.baseline)
                if acc := self._accuracy(eng.base_url, eng.model, cls, say):
                    meta["accuracy"] = acc
                say(f"benchmarking: {repeats} runs of {len(prompts)} requests at "
                    f"concurrency {t.concurrency or 'unbounded'}")
                for i in range(repeats):
                    eng.check()
                    res = run_bench(cfg, prompts, guard=guard)
                    res.scrub = scrub
                    digest = self.ws.artifacts.put(res.records_jsonl())
                    omitted: dict[str, str] = {}  # NaN / infinite: left out, with why
                    m = numeric_metrics(res.metrics, omitted)
                    if match is not None:
                        m["token_match"] = match
                    failed = int(m.get("failed", 0))
                    if failed:
                        eng.check(grace_s=2.0)  # failed requests: did the server die?
                    ok = m.get("completed", 0) > 0
                    say(f"run {i + 1}/{repeats}: {m.get('output_throughput', 0):.1f} tok/s, "
                        f"TTFT p50 {m.get('median_ttft_ms', float('nan')):.1f} ms, "
                        f"{failed} failed")
                    results.append(RunResult(
                        m, success=ok,
                        error=None if ok else f"all {failed} requests failed",
                        artifact_digest=digest, meta={**meta, "repeat": i, **(
                            {"omitted_metrics": omitted} if omitted else {})}))
        except HarnessError as e:
            msg = " ".join(str(e).split())
            say(f"engine run failed: {msg[:200]}")
            results.append(RunResult({}, success=False, error=msg, meta=meta))
        return results

    def _accuracy(self, url: str, model: str, cls: str, say: Any) -> dict[str, Any]:
        """Each accuracy gate's lm_eval task on the running engine: {gate: {task, accuracy,
        items: [[doc_id, 0|1], ...]}}, or {gate: {task, error}} (judged inconclusive)."""
        from ..bench import accuracy

        contract = getattr(self.task, "contract", None)
        out: dict[str, Any] = {}
        for g in (contract.gates if contract is not None else []):
            if g.kind != "accuracy":
                continue
            assert g.task is not None
            if cls == "production":  # its traffic would bypass the production guard
                out[g.name] = {"task": g.task, "error": "not run against a production-class "
                               "endpoint"}
                continue
            say(f"accuracy gate {g.name}: lm_eval {g.task}"
                + (f" on {g.limit} items" if g.limit else ""))
            try:
                run = accuracy.run_task(url, model, g.task, endpoint=g.endpoint or "completions",
                                        limit=g.limit)
            except HarnessError as e:
                out[g.name] = {"task": g.task, "error": " ".join(str(e).split())[:300]}
                continue
            out[g.name] = {"task": g.task, "accuracy": round(run.accuracy, 6),
                           "items": [[i, int(c)] for i, c in run.items]}
        return out

    def _token_match(self, outputs: list, baseline: Mapping[str, Any] | None) -> float | None:
        if baseline is None:
            return 1.0 if all(o.success for o in outputs) else None
        digest = None
        for run in baseline.get("runs", []):
            digest = (run.get("meta") or {}).get("outputs_digest")
            if digest:
                break
        if not digest:
            return None
        lines = self.ws.artifacts.get(digest).splitlines()
        rows = [r for _, r in iter_jsonl_text(lines, f"artifact {digest}")]
        if any(is_scrubbed(r) for r in rows):
            return None  # the data policy kept only digests: no prefix to compare
        base = [GreedyOutput(**r) for r in rows]
        rate, _ = compare_outputs(base, outputs)
        return rate

