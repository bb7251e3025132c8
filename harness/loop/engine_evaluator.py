"""Evaluating a candidate on a real engine: launch, check outputs, benchmark, tear down.

Contract (an `Evaluator`, see evaluator_protocol.py):
- One deployment per candidate: the whole of `ctx.point` served by `ctx.profile` (the loop
  has applied the candidate: `engine.<key>`, `profile.<field>`, `topology.<path>` and role
  keys such as `prefill.tp`), through `engines.whole.deploy_whole` (one colocated server
  through its engine; PD, EPD and replicas as a planned deployment behind the router; in the
  profile's pinned image, version and arguments checked), on the point's model (a `forge:`
  recipe is pulled if missing, a hub id at the point's revision referenced in the shared
  Hugging Face cache: models/weights.py `resolve_model`). The scenario, model and
  accelerator are the experiment, not the deployment: a candidate naming them is a failed
  run saying so. The runs' `meta.deployment` says what was deployed (architecture,
  processes, plan digest, image, `weights`: real or dummy); dummy weights under a gate on
  real outputs (accuracy, `token_match`) are a failed run saying so, nothing launched
  (models/dummy_weights.py).
- Code: the block's builds (`ctx.builds`: each `code.<member>` with a `deploy:` recipe, and
  the pinned commit of each for the baseline; harness/engines/commit_build.py) are what
  runs: the profile gets the build's interpreter or image and the engine module's build
  version (`commit_build.apply_builds`); a `code.<member>` without a build is a failed run
  naming the missing recipe. Once the server is up, it must be that build: the version it
  reports equal to the build's, and a commit named in it (setuptools-scm's `+g<sha>`) the
  block's (`identity_problem`); otherwise nothing is measured and the run fails saying so.
  The runs' `meta.builds` record each build (commit, key, version, network, cached).
- Per launch: warm-up windows at the measured concurrency until two successive ones agree
  (warmup.py; every run's `meta.warmup`: windows, seconds, steady, throughputs), then greedy
  outputs on the fixed prompt set (stored as an artifact; the baseline's
  digest travels in `meta.outputs_digest`), then `repeats` benchmark runs of the point's
  workload (bench/workload.py: its dataset, lengths, shared-prefix groups, images, concurrency
  or request rate, and its SLO as the goodput definition; described in `meta.workload`; a
  point whose workload cannot be built is a failed run saying why, with nothing launched).
  Each run's metrics carry `token_match` against the baseline's outputs (1.0 for the baseline
  itself) and `failed` (requests that failed). Each run's `meta.host` is the host's state
  around it and `meta.contaminated` why that state contaminates it under the contract's
  host limits, or the defaults ([] when clean; harness/nodes/host_state.py). When the
  task's contract has accuracy gates,
  each one's lm_eval task runs once per launch after the greedy outputs, before the
  repeats; its accuracy and per-item correctness (doc ids and 0/1 only, never text) go in
  every run's `meta.accuracy[<gate>]` (an `error` there when it could not run).
- More runs: after the repeats, up to the contract's `more_runs` more, one at a time on the
  same deployment, while one could decide a gate (more_runs.py: the block unstable or
  trending, or a candidate's gate inconclusive against `ctx.baseline`); progress says why
  each is taken, and its `meta.extra_run` is true.
- Failures are data: a server that does not start or dies is a `RunResult(success=False)`
  with the error and the server log's tail; the server never outlives `evaluate`.
- Safety guard: all traffic goes through the production guard (an external production
  endpoint gets probe traffic within the budget or a refusal, recorded on the `guard` stream
  naming the task: the step's save owns the task stream), and outputs and records of a
  production-class endpoint are stored as lengths and digests (no token match against them).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from ...ledger import events as E
from ...ledger.specs import CODE_PREFIX, DeploymentPoint, HostLimits, TaskDefinition
from ...ledger.workspace import Workspace
from ..bench.client import BenchGuard, run_bench
from ..bench.correctness import (
    GreedyOutput,
    collect_greedy_outputs,
    compare_outputs,
    is_scrubbed,
    outputs_jsonl,
)
from ..bench.datasets import load_tokenizer
from ..bench.metrics import numeric_metrics
from ..bench.workload import Workload, workload_for
from ..engines.base import engine_config_of
from ..engines.commit_build import apply_builds, engine_build, identity_problem
from ..engines.whole import deploy_whole, deployable, deployment_meta
from ..errors import HarnessError
from ..guard import data_policy
from ..jsonl import iter_jsonl_text
from ..models.dummy_weights import dummy_refusal, weights_of
from ..models.weights import resolve_model
from ..nodes.host_state import HostSampler, contamination, deployment_gpus
from .evaluator_protocol import Baseline, EvalContext, RunResult
from .more_runs import more_runs_reason
from .warmup import warm_up

GREEDY_MAX_TOKENS = 32


def _host_limits(task: TaskDefinition) -> HostLimits:
    """The contract's host limits, the defaults when it sets none (recorded, not gated)."""
    contract = getattr(task, "contract", None)
    return (contract.host if contract is not None else None) or HostLimits()


class WorkloadError(HarnessError):
    """The point's traffic cannot be turned into a workload (bench/workload.py)."""


class EngineEvaluator:
    def __init__(self, ws: Workspace, task: TaskDefinition, *,
                 greedy_max_tokens: int = GREEDY_MAX_TOKENS,
                 base_dir: str | Path | None = None, nvml: Any = None):
        self.ws = ws
        self.nvml = nvml  # a pynvml-like module for the host state (None: pynvml, if any)
        self.task = task
        self.greedy_max_tokens = greedy_max_tokens
        self.base_dir = base_dir  # the task file's directory
        self._workload: Workload | None = None
        self._tokenizer = None
        self._model_dir: Path | None = None

    # --- setup, once per evaluator ---------------------------------------------------------

    def _model(self, point: DeploymentPoint) -> Path:
        if self._model_dir is None:  # a hub id: its snapshot in the shared cache
            self._model_dir = resolve_model(self.ws, point.model.source, point.model.revision)
        return self._model_dir

    def _point_dir(self) -> Path | None:
        """The point file's directory (a relative dataset file is found there), when known."""
        rel = getattr(self.task, "point", None)
        if self.base_dir is None:
            return None
        return Path(self.base_dir) / Path(rel).parent if isinstance(rel, str) else \
            Path(self.base_dir)

    def _setup(self, point: DeploymentPoint) -> Workload:
        """The point's workload (bench/workload.py; built, with the tokenizer, on first use)."""
        if self._workload is None:
            model_dir = self._model(point)
            self._tokenizer = load_tokenizer(model_dir)
            try:
                self._workload = workload_for(point, self._tokenizer, base_dir=self._point_dir())
            except HarnessError as e:  # the point's fault, not the run's: said as one
                raise WorkloadError(" ".join(str(e).split())) from None
        return self._workload

    # --- one candidate ---------------------------------------------------------------------

    def evaluate(self, candidate: dict[str, Any], *, repeats: int, ctx: EvalContext
                 ) -> list[RunResult]:
        point, profile = ctx.point, ctx.profile
        if point is None or profile is None:
            raise HarnessError(f"task {ctx.task_id}: the engine evaluator needs a deployment "
                               "point and a runtime profile")
        # Gates on real outputs never judge dummy weights (also refused at definition).
        if refused := dummy_refusal(getattr(self.task, "contract", None), profile,
                                    f"{profile.service} rev {profile.rev}"):
            return [RunResult({}, success=False, error=refused)]
        builds = dict(ctx.builds)
        unbuilt = [k for k in candidate if k.startswith(CODE_PREFIX)
                   and k[len(CODE_PREFIX):] not in builds]
        if unbuilt:
            return [RunResult({}, success=False, error=f"{', '.join(sorted(unbuilt))}: the "
                              "engine evaluator deploys a member's build; give the member a "
                              "`deploy:` recipe in forge-repos.yaml (install, module)")]
        others = [k for k in candidate if not deployable(k) and not k.startswith(CODE_PREFIX)]
        if others:
            return [RunResult({}, success=False, error=f"the engine evaluator deploys engine.*, "
                              f"profile.*, topology.*, role (prefill.tp, …) and code.* "
                              f"candidates, not {', '.join(sorted(others))}")]
        try:
            profile = apply_builds(profile, builds)
        except HarnessError as e:
            return [RunResult({}, success=False, error=" ".join(str(e).split()))]
        try:
            work = self._setup(point)
        except WorkloadError as e:  # a workload the point cannot have: no launch
            return [RunResult({}, success=False, error=f"workload: {e}")]
        prompts = work.prompts
        name, config = engine_config_of(profile)  # the candidate is applied already
        t = point.scenario.traffic
        say = ctx.progress
        contract = getattr(self.task, "contract", None)
        fields = {"task_id": ctx.task_id, "block_id": ctx.block_id}
        guard = BenchGuard(self.ws, E.Actor.tool("forge-evaluator"), ctx.task_id,
                           ctx.block_id, in_step=True)
        meta: dict[str, Any] = {"source": "forge-bench", "engine": name,
                                "workload": work.describe()}
        if builds:
            meta["builds"] = {m: b.record() for m, b in sorted(builds.items())}
        own = engine_build(name, builds)
        results: list[RunResult] = []
        try:
            say(f"launching {name} engine with {dict(candidate) or 'the profile as is'}")
            with deploy_whole(self.ws, point, profile, model=self._model_dir,
                              event_fields=fields, say=say) as eng:
                desc = eng.describe()
                if own is not None:  # the server that answered must be the block's build
                    problem = identity_problem(own, desc.get("version"),
                                               f"the {name} server at {eng.base_url}")
                    if problem is not None:
                        raise HarnessError(problem)
                    meta["builds"][own.member]["server_version"] = desc.get("version")
                meta["launch_command"] = desc.get("launch_command")
                meta["deployment"] = {**deployment_meta(point, desc),
                                      "weights": weights_of(profile)}
                meta["server_info_digest"] = self.ws.artifacts.put(
                    orjson.dumps(desc, default=str, option=orjson.OPT_SORT_KEYS))
                cfg = work.bench_config(eng.base_url, eng.model, name, warmup=0)
                cls = data_policy.class_of(self.ws, url=eng.base_url, dataset=work.dataset,
                                           dataset_path=work.dataset_path)
                scrub = not data_policy.stores_text(self.ws, cls)
                meta["data_class"] = cls
                # Warm-up windows at the measured concurrency until two agree: the first
                # batches pay one-off costs (allocation, kernel selection, caches) that would
                # make the runs climb one after another (warmup.py).
                say(f"engine ready in {desc.get('startup_s', 0):.1f}s; warming up")
                window = prompts[: max(1, t.concurrency or 1)]
                warm = warm_up(lambda: float(run_bench(cfg, window, guard=guard).metrics.get(
                    "output_throughput") or 0.0))
                meta["warmup"] = warm.record()
                say(warm.describe())
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
                # the host's state around each run, on the GPUs the deployment was given
                host = HostSampler(self.nvml, gpus=deployment_gpus(desc))
                limits = _host_limits(self.task)
                more = contract.more_runs if contract is not None else 0
                for i in range(repeats + more):
                    if i >= repeats:  # one more, only while it could decide a gate
                        why = more_runs_reason(contract, results, ctx.baseline)
                        if why is None:
                            break
                        say(f"extra run {i - repeats + 1}/{more}: {why}")
                    eng.check()
                    host.start()
                    try:
                        res = run_bench(cfg, prompts, guard=guard)
                    finally:
                        state = host.stop()
                    dirty = contamination(state, limits)
                    if dirty:
                        say(f"run {i + 1} contaminated: {'; '.join(dirty)}")
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
                    n = f"{i + 1}/{repeats}" if i < repeats else f"{i + 1} (extra)"
                    say(f"run {n}: {m.get('output_throughput', 0):.1f} tok/s, "
                        f"TTFT p50 {m.get('median_ttft_ms', float('nan')):.1f} ms, "
                        f"{failed} failed")
                    results.append(RunResult(
                        m, success=ok,
                        error=None if ok else f"all {failed} requests failed",
                        artifact_digest=digest, meta={**meta, "repeat": i, **(
                            {"omitted_metrics": omitted} if omitted else {}),
                            "host": state, "contaminated": dirty, **(
                            {"extra_run": True} if i >= repeats else {})}))
        except HarnessError as e:
            msg = " ".join(str(e).split())
            say(f"engine run failed: {msg[:200]}")
            results.append(RunResult({}, success=False, error=msg, meta=meta))
        return results

    def _accuracy(self, url: str, model: str, cls: str, say: Any) -> dict[str, Any]:
        """Each accuracy gate's lm_eval task on the running engine: {gate: {task, accuracy,
        items: [[doc_id, 0|1], ...]}}, or {gate: {task, error}} (judged inconclusive)."""
        # In the function for start-up time: lm_eval's wrapper (~75 ms).
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
            t0 = time.monotonic()
            try:
                run = accuracy.run_task(url, model, g.task, endpoint=g.endpoint or "completions",
                                        limit=g.limit)
            except HarnessError as e:
                out[g.name] = {"task": g.task, "error": " ".join(str(e).split())[:300]}
                continue
            took = round(time.monotonic() - t0, 3)
            say(f"accuracy gate {g.name}: {run.accuracy:.4f} over {len(run.items)} items "
                f"in {took:.1f} s")
            out[g.name] = {"task": g.task, "accuracy": round(run.accuracy, 6),
                           "items": [[i, int(c)] for i, c in run.items],
                           "items_digest": run.dataset.get("items_digest"),
                           "revisions": {k: v.get("revision") for k, v in
                                         run.dataset.get("tasks", {}).items()},
                           "runtime_s": took}
        return out

    def _token_match(self, outputs: list[Any], baseline: Baseline | None) -> float | None:
        if baseline is None:
            return 1.0 if all(o.success for o in outputs) else None
        digest = None
        for run in baseline.runs:
            digest = run.meta.get("outputs_digest")
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

