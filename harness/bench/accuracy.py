"""Accuracy: task accuracy of a candidate against the baseline's, judged for non-inferiority.

Greedy token match (correctness.py) says whether a candidate *writes the same tokens*; it
cannot say whether the answers a candidate changed are still right, and a fast candidate that
loses accuracy must be rejected even when its tokens mostly match. This module runs a task
set with EleutherAI's lm-evaluation-harness (`lm_eval`) against an engine's OpenAI-compatible
endpoint and judges the paired per-item results.

Contracts:
- The offline task set: `examples/accuracy/arith.jsonl`, `ARITH_ITEMS` distinct
  integer-arithmetic items made by `arith_items(n, seed)` (seeded: the file is reproducible
  and a test checks it is), and the lm_eval task `examples/accuracy/arith.yaml`
  (`dataset_path: json` with a relative `data_files`, `generate_until` on
  `Question: ...\\nAnswer:` prompts, greedy, the first integer of the answer compared by
  `exact_match`). It needs no network: `run_task` sets `HF_DATASETS_OFFLINE=1` unless the
  environment already says.
- `run_task(url, model, task, ...)` evaluates with `lm_eval.simple_evaluate` through the
  `local-completions` model (POST `/v1/completions`; `endpoint="chat"`:
  `local-chat-completions`, `/v1/chat/completions`), no tokenizer
  (`tokenized_requests=False`), `log_samples=True`. lm_eval sends through a loopback relay
  (guard/relay.py): each request goes on by the one outbound client (the address the
  production check resolved, `timeout_s` as the deadline of each whole response, the byte
  cap, no redirect followed), and a request the client cut fails the run with its one-line
  error. It returns an `AccuracyRun`: the accuracy and one `(doc_id, correct)` per item in
  doc order (correct: the item's `metric`, `exact_match` by default; `acc` for
  multiple-choice suites). `limit` evaluates the first `limit` items. `task` is looked up
  among the YAML files of `include_path` (the shipped set by default; relative `data_files`
  resolved against the YAML's folder), else in lm_eval's own registry (gsm8k, mmlu, gpqa: a
  configuration away on a host whose Hugging Face cache holds their datasets). lm_eval is
  imported inside the function: it is an optional extra (`pip install
  'infer-forge[accuracy]'`), and a missing one is a HarnessError.
- `judge_accuracy(baseline, candidate, margin=, confidence=, iterations=, seed=)` is pure. The
  two runs must cover the same items. Per item d = candidate_correct - baseline_correct; the
  estimate is mean(d) (the accuracy difference), its interval a seeded paired percentile
  bootstrap over items. Non-inferiority: `pass` when the whole interval is at or above
  -margin (as gates.py reads a threshold), `fail` when the whole interval is below it,
  `inconclusive` when it straddles (too few items to tell). Returns a GateResult of kind
  `accuracy` (metric `accuracy`, `median` the candidate's accuracy, `baseline_median` the
  baseline's, `ratio` the difference, `ci` its interval, `threshold` -margin, `n` the
  items). Same inputs and seed -> same result.
- `record_accuracy` appends one MeasurementRecorded (source `forge-accuracy`, metrics
  `accuracy`, `items`, and with a baseline `baseline_accuracy`, `accuracy_delta`) with the
  gate result and the per-item results (doc ids and correctness only, never prompts or
  answers) in meta, on the task's stream (`task_id`) or `measurements`.
- `evaluate_accuracy` (`forge eval accuracy`) checks that each URL answers (`check_answers`:
  `GET /v1/models`, any status, within `PROBE_TIMEOUT_S`) before lm_eval starts, runs the
  candidate and, given `baseline_url`, the baseline on the same items, judges, records, and
  returns a summary dict.
"""

from __future__ import annotations

import math
import os
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...ledger import events as E
from ...ledger.payloads import GateResult, Verdict
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..record import record_measurements

ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = ROOT / "examples" / "accuracy"  # include_path for the offline task set
ARITH_ITEMS = 300
ARITH_SEED = 15
PROBE_TIMEOUT_S = 5.0  # check_answers: a server that is up answers GET /v1/models at once


def arith_items(n: int = ARITH_ITEMS, seed: int = ARITH_SEED) -> list[dict[str, str]]:
    """`n` distinct seeded integer-arithmetic items `{"question", "answer"}` (+, -, *)."""
    rng = random.Random(seed)
    out: dict[str, str] = {}  # question -> answer; a repeated question is drawn again
    while len(out) < n:
        op = rng.choice("+-*")
        a, b = (rng.randint(2, 99), rng.randint(2, 99)) if op == "*" else \
            (rng.randint(10, 999), rng.randint(10, 999))
        val = a + b if op == "+" else a - b if op == "-" else a * b
        out.setdefault(f"What is {a} {op} {b}?", str(val))
    return [{"question": q, "answer": v} for q, v in out.items()]


def arith_jsonl(n: int = ARITH_ITEMS, seed: int = ARITH_SEED) -> bytes:
    return b"".join(orjson.dumps(x) + b"\n" for x in arith_items(n, seed))


@dataclass(frozen=True)
class AccuracyRun:
    task: str
    accuracy: float
    items: list[tuple[int, bool]] = field(default_factory=list)  # (doc_id, correct)


def run_task(url: str, model: str, task: str = "arith", *, endpoint: str = "completions",
             include_path: str | Path | None = TASKS_DIR, limit: int | None = None,
             concurrency: int = 1, timeout_s: float = 60.0, seed: int = 1234,
             metric: str = "exact_match") -> AccuracyRun:
    """Evaluate `task` against the server at `url` with lm_eval (module contract)."""
    # datasets reads this when imported: a local file or the host's cache, never the Hub
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise HarnessError(f"accuracy evaluation needs lm_eval (pip install "
                           f"'infer-forge[accuracy]'): {e}") from None
    if endpoint not in ("completions", "chat"):
        raise HarnessError(f"endpoint {endpoint!r}: expected completions or chat")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    shipped = task_config(task, include_path) if include_path else None
    spec: str | dict[str, Any] = shipped or task  # else lm_eval's registry (gsm8k, mmlu, ...)
    # A task given as its config needs no registry: lm_eval's default TaskManager reads every
    # one of its ~14k task YAMLs first (~12 s of each run); one without defaults reads none.
    manager = None if shipped is None else TaskManager(include_defaults=False)
    # In the function for start-up time: the loopback relay loads when lm_eval runs.
    from ..guard.relay import Relay

    with Relay(f"{base}{path}", timeout_s=timeout_s) as relay:
        # lm_eval's own timeout later than the relay's deadline: the relay's error is the one
        args = (f"base_url={relay.url},model={model},tokenizer_backend=none,"
                f"tokenized_requests=False,num_concurrent={concurrency},max_retries=1,"
                f"timeout={int(timeout_s) + 10}")
        try:
            res = lm_eval.simple_evaluate(
                model="local-chat-completions" if endpoint == "chat" else "local-completions",
                model_args=args, tasks=[spec], task_manager=manager, log_samples=True,
                limit=limit,
                apply_chat_template=endpoint == "chat", random_seed=seed,
                numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)
        except HarnessError:
            raise
        except Exception as e:  # lm_eval's own errors (HTTP, dataset) as one line
            why = relay.errors[0] if relay.errors else f"{type(e).__name__}: {e}"
            raise HarnessError(f"lm_eval {task} against {url}: {why}") from None
        if relay.errors:  # lm_eval may carry on past a failed request: not a measurement
            raise HarnessError(f"lm_eval {task} against {url}: {relay.errors[0]}")
    if not res or task not in res.get("samples", {}):
        raise HarnessError(f"lm_eval returned no samples for {task}")
    samples = res["samples"][task]
    if samples and metric not in samples[0]:
        raise HarnessError(f"task {task} has no per-item {metric!r} (it has "
                           f"{', '.join(samples[0].get('metrics', []))}): pass metric=")
    items = sorted((int(s["doc_id"]), bool(s[metric])) for s in samples)
    acc = sum(c for _, c in items) / len(items) if items else 0.0
    return AccuracyRun(task, acc, items)


def task_config(task: str, include_path: str | Path) -> dict[str, Any] | None:
    """The lm_eval config of `task` from the YAML files in `include_path`, its relative
    `data_files` made absolute against the YAML's folder (lm_eval would resolve them against
    the working directory); None when no YAML there declares `task`."""
    import yaml

    folder = Path(include_path)
    if not folder.is_dir():
        raise HarnessError(f"include path {folder}: not a directory")
    for f in sorted(folder.glob("*.yaml")):
        try:
            cfg = yaml.safe_load(f.read_text())
        except yaml.YAMLError as e:
            raise HarnessError(f"{f}: not YAML: {e}") from None
        if not isinstance(cfg, dict) or cfg.get("task") != task:
            continue
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        if isinstance(files, dict):
            cfg["dataset_kwargs"]["data_files"] = {
                k: str(f.parent / v) if not Path(str(v)).is_absolute() else v
                for k, v in files.items()}
        elif isinstance(files, str) and not Path(files).is_absolute():
            cfg["dataset_kwargs"]["data_files"] = str(f.parent / files)
        return cfg
    return None


def paired_bootstrap_ci(diffs: Sequence[float], *, confidence: float = 0.95,
                        iterations: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Seeded percentile-bootstrap interval of mean(diffs), items resampled (pairs kept)."""
    import numpy as np

    xs = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, len(xs), size=(iterations, len(xs)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha], method="inverted_cdf")
    return float(lo), float(hi)


def judge_accuracy(baseline: AccuracyRun, candidate: AccuracyRun, *, margin: float = 0.02,
                   name: str = "accuracy", confidence: float = 0.95, iterations: int = 2000,
                   seed: int = 0) -> GateResult:
    """Non-inferiority of the candidate's accuracy against the baseline's (module contract)."""
    if margin < 0:
        raise HarnessError(f"margin {margin}: must be >= 0")
    common: dict[str, Any] = {"name": name, "kind": "accuracy", "metric": "accuracy",
                              "threshold": -float(margin), "direction": "at_least"}
    b = dict(baseline.items)
    c = dict(candidate.items)
    if set(b) != set(c):
        raise HarnessError(f"baseline has {len(b)} items and candidate {len(c)}, "
                           f"{len(set(b) ^ set(c))} not in both: they must cover the same items")
    if not b:
        return GateResult.judged("inconclusive", reason="no items evaluated", n=0, **common)
    ids = sorted(b)
    diffs = [float(c[i]) - float(b[i]) for i in ids]
    acc_b = sum(b.values()) / len(ids)
    acc_c = sum(c.values()) / len(ids)
    delta = acc_c - acc_b
    lo, hi = paired_bootstrap_ci(diffs, confidence=confidence, iterations=iterations, seed=seed)
    verdict: Verdict = "pass" if lo >= -margin else "fail" if hi < -margin else "inconclusive"
    worse = sum(1 for d in diffs if d < 0)
    better = sum(1 for d in diffs if d > 0)
    reason = (f"accuracy {acc_c:.4g} vs baseline {acc_b:.4g}: difference {delta:+.4g} "
              f"(CI {lo:+.4g}..{hi:+.4g}, {len(ids)} items, {worse} lost, {better} gained) "
              f"needs >= {-margin:+.4g}")
    return GateResult.judged(verdict, reason=reason, n=len(ids), median=round(acc_c, 6),
                             baseline_median=round(acc_b, 6), ratio=round(delta, 6),
                             ci=[round(lo, 6), round(hi, 6)], **common)


def record_accuracy(ws: Workspace, baseline: AccuracyRun, candidate: AccuracyRun,
                    result: GateResult | None, *, url: str, baseline_url: str | None = None,
                    task_id: str | None = None, block_id: str | None = None,
                    run_id: str | None = None):
    """Append one MeasurementRecorded for an accuracy check; returns the event."""
    ev = E.MeasurementRecorded(
        task_id=task_id, block_id=block_id,
        run_id=run_id or f"accuracy-{candidate.task}-{secrets.token_hex(6)}",
        source="forge-accuracy",
        metrics={"accuracy": float(candidate.accuracy), "items": float(len(candidate.items)),
                 **({"baseline_accuracy": float(baseline.accuracy),
                     "accuracy_delta": float(candidate.accuracy - baseline.accuracy)}
                    if result is not None else {})},
        candidate={"url": url},
        success=True,
        meta={"task": candidate.task, "baseline_url": baseline_url,
              "gate": result.model_dump(mode="json") if result is not None else None,
              "items": [[i, int(c)] for i, c in candidate.items],
              **({"baseline_items": [[i, int(c)] for i, c in baseline.items]}
                 if result is not None else {})},
    )
    record_measurements(ws, [ev], task_id=task_id,
                        command_id=f"accuracy:{task_id or ''}:{block_id or ''}:{ev.event_id}")
    return ev


def check_answers(ws: Workspace, url: str, *, timeout_s: float = PROBE_TIMEOUT_S,
                  task_id: str | None = None, block_id: str | None = None) -> None:
    """A HarnessError, one line, unless the server at `url` answers `GET /v1/models` within
    `timeout_s` (any HTTP status is an answer): lm_eval takes seconds to start and then
    retries a dead URL before it fails."""
    from ..guard import outbound  # in the function for start-up time, as production below

    base = url.rstrip("/").removesuffix("/v1")
    guard = outbound.Guard(ws, E.Actor.tool("forge-accuracy"), task_id, block_id)
    try:
        outbound.fetch("GET", f"{base}/v1/models", timeout_s=timeout_s, max_bytes=1 << 16,
                       guard=guard, max_redirects=0)
    except HarnessError as e:
        raise HarnessError(f"{url} does not answer ({e}); lm_eval not started") from None


def evaluate_accuracy(ws: Workspace, url: str, model: str, task: str = "arith", *,
                      baseline_url: str | None = None, baseline_model: str | None = None,
                      margin: float = 0.02, endpoint: str = "completions",
                      include_path: str | Path | None = TASKS_DIR, limit: int | None = None,
                      concurrency: int = 1, metric: str = "exact_match",
                      confidence: float = 0.95, iterations: int = 2000, seed: int = 0,
                      task_id: str | None = None, block_id: str | None = None
                      ) -> dict[str, Any]:
    """`forge eval accuracy`: run `task` on the candidate at `url` (and the baseline at
    `baseline_url`, same items), judge non-inferiority when there is a baseline, record one
    MeasurementRecorded; returns the accuracies, the gate result (None without a baseline)
    and the event id."""
    if margin < 0:
        raise HarnessError(f"margin {margin}: must be >= 0")
    # lm_eval sends its own requests, unpaced: against a production endpoint that is load
    # beyond any probe budget, refused (and recorded) before anything is sent unless forge.toml
    # allows it and a person approved this exact run. In the function for start-up time: the
    # production guard (~5 ms, its task reads) loads for a run, not for the gates judging one.
    from ..guard import production

    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    for u in (url, baseline_url):
        if u:
            production.check(ws, u, f"POST {path}", rps=math.inf, requests=limit,
                             actor=E.Actor.tool("forge-accuracy"), task_id=task_id,
                             block_id=block_id)
    for u in (url, baseline_url):
        if u:
            check_answers(ws, u, task_id=task_id, block_id=block_id)
    kw: dict[str, Any] = {"endpoint": endpoint, "include_path": include_path, "limit": limit,
                          "concurrency": concurrency, "metric": metric}
    cand = run_task(url, model, task, **kw)
    base = run_task(baseline_url, baseline_model or model, task, **kw) if baseline_url \
        else None
    gate = judge_accuracy(base, cand, margin=margin, confidence=confidence,
                          iterations=iterations, seed=seed) if base is not None else None
    ev = record_accuracy(ws, base or cand, cand, gate, url=url, baseline_url=baseline_url,
                         task_id=task_id, block_id=block_id)
    return {"task": task, "items": len(cand.items), "accuracy": cand.accuracy,
            "baseline_accuracy": base.accuracy if base else None,
            "gate": gate.model_dump(mode="json") if gate else None,
            "event_id": ev.event_id}
