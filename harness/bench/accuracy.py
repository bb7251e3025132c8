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
  error. It returns an `AccuracyRun`: the accuracy, one `(item id, correct)` per item in
  id order (correct: the item's `metric`, `exact_match` by default; `acc` for
  multiple-choice suites; of lm_eval's one sample per filter, `filter_name`'s, else the
  task's first filter's), lm_eval's `doc_hash` per item, and `dataset` (`dataset_identity`:
  per lm_eval task its dataset and the datasets-cache folder and revision it was read from,
  the items digest, the few-shot count, the endpoint). An item id is lm_eval's doc_id; for
  a group suite (several leaf tasks: mmlu_generative) `<task>/<doc_id>`. `limit`
  evaluates the first `limit` items (of each leaf task). `task` is looked up
  among the YAML files of `include_path` (the shipped set by default; relative `data_files`
  resolved against the YAML's folder), else in lm_eval's own registry (gsm8k, mmlu, gpqa: a
  configuration away on a host whose Hugging Face cache holds their datasets:
  dataset_cache.py carries one there). lm_eval is
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
  `accuracy`, `items`, `runtime_s_<side>`, and with a baseline `baseline_accuracy`,
  `accuracy_delta`) with the gate result, the per-item results (ids and correctness only,
  never prompts or answers) and the dataset identity in meta, and the per-item JSONL
  (`items_jsonl`: id, doc_hash, correct, baseline) as its artifact, on the task's stream
  (`task_id`) or `measurements`.
- `evaluate_accuracy` (`forge eval accuracy`) checks that each URL answers (`check_answers`:
  `GET /v1/models`, any status, within `PROBE_TIMEOUT_S`) before lm_eval starts, runs the
  candidate and, given `baseline_url`, the baseline on the same items (timing each), refuses
  to pair two runs whose ids agree but whose items digests differ (other documents: another
  dataset revision), judges, records, and returns a summary dict (with `runtime_s`,
  `dataset` and the items artifact's digest).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import secrets
import time
from collections.abc import Mapping, Sequence
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


ItemId = int | str  # lm_eval's doc_id; `<task>/<doc_id>` when the suite is a group


@dataclass(frozen=True)
class AccuracyRun:
    task: str
    accuracy: float
    items: list[tuple[ItemId, bool]] = field(default_factory=list)  # (item id, correct)
    doc_hashes: dict[ItemId, str] = field(default_factory=dict)  # lm_eval's doc_hash per item
    dataset: dict[str, Any] = field(default_factory=dict)  # dataset_identity()


def dataset_identity(tasks: Sequence[Any], hashes: Mapping[ItemId, str]) -> dict[str, Any]:
    """What a run evaluated: per lm_eval task its dataset (path, name), the datasets-cache
    folder it was read from and that folder's hash (`revision`: the hub commit of a hub
    dataset), and `items_digest`, the sha256 of the evaluated items' `id doc_hash` lines."""
    out: dict[str, Any] = {"tasks": {}}
    for t in tasks:
        folder = None
        ds: Any = getattr(t, "dataset", None)
        for split in (ds.values() if hasattr(ds, "values") else []):
            files = getattr(split, "cache_files", None) or []
            if files:
                folder = Path(files[0]["filename"]).parent
                break
        out["tasks"][str(t.config.task)] = {
            "dataset_path": t.config.dataset_path, "dataset_name": t.config.dataset_name,
            "cache_folder": str(folder) if folder else None,
            "revision": folder.name if folder else None}
    lines = "\n".join(f"{i} {h}" for i, h in sorted(hashes.items(), key=lambda x: str(x[0])))
    out["items_digest"] = "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    return out


def run_task(url: str, model: str, task: str = "arith", *, endpoint: str = "completions",
             include_path: str | Path | None = TASKS_DIR, limit: int | None = None,
             concurrency: int = 1, timeout_s: float = 60.0, seed: int = 1234,
             metric: str = "exact_match", filter_name: str | None = None) -> AccuracyRun:
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
    manager = TaskManager(include_defaults=shipped is None)
    # The tasks are built here, not inside simple_evaluate, to read which dataset (cache
    # folder, revision) each one loaded; a group (mmlu_generative) is its leaf tasks.
    try:
        leaves = list(manager.load([spec])["tasks"].values())
    except Exception as e:  # lm_eval's and datasets' own errors (unknown task, not cached)
        why = str(e).splitlines()[0] if str(e) else ""
        raise HarnessError(f"lm_eval {task}: {type(e).__name__}: {why}") from None
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
                model_args=args, tasks=leaves, task_manager=manager, log_samples=True,
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
    names = [str(t.config.task) for t in leaves]
    got = (res or {}).get("samples", {})
    if not names or any(n not in got for n in names):
        raise HarnessError(f"lm_eval returned no samples for {task}")
    items: list[tuple[ItemId, bool]] = []
    hashes: dict[ItemId, str] = {}
    for name in names:
        for s in _filtered(got[name], name, metric, filter_name):
            i: ItemId = int(s["doc_id"]) if len(names) == 1 else f"{name}/{int(s['doc_id'])}"
            items.append((i, bool(s[metric])))
            hashes[i] = str(s.get("doc_hash", ""))
    items.sort(key=lambda x: (isinstance(x[0], str), x[0]))
    acc = sum(c for _, c in items) / len(items) if items else 0.0
    ident = dataset_identity(leaves, hashes)
    ident["n_shot"] = {n: (res.get("n-shot") or {}).get(n) for n in names}
    ident["endpoint"] = endpoint
    return AccuracyRun(task, acc, items, hashes, ident)


def _filtered(samples: list[dict[str, Any]], name: str, metric: str,
              filter_name: str | None) -> list[dict[str, Any]]:
    """One sample per item: lm_eval logs one per filter (gsm8k: strict-match and
    flexible-extract); `filter_name`, else the task's first filter."""
    filters = list(dict.fromkeys(str(s.get("filter")) for s in samples))
    want = filter_name if filter_name is not None else (filters[0] if filters else None)
    if samples and want not in filters:
        raise HarnessError(f"task {name} has no filter {want!r} (it has "
                           f"{', '.join(filters)}): pass filter_name=")
    chosen = [s for s in samples if str(s.get("filter")) == want]
    if chosen and metric not in chosen[0]:
        raise HarnessError(f"task {name} has no per-item {metric!r} (it has "
                           f"{', '.join(chosen[0].get('metrics', []))}): pass metric=")
    return chosen


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


def items_jsonl(baseline: AccuracyRun | None, candidate: AccuracyRun) -> bytes:
    """One JSON line per item in id order: `{id, doc_hash, correct[, baseline]}` (0/1; the
    doc_hash is lm_eval's hash of the item's document, never its text)."""
    base = dict(baseline.items) if baseline is not None else {}
    rows = []
    for i, c in candidate.items:
        row: dict[str, Any] = {"id": i, "doc_hash": candidate.doc_hashes.get(i),
                               "correct": int(c)}
        if baseline is not None:
            row["baseline"] = int(base[i]) if i in base else None
        rows.append(orjson.dumps(row) + b"\n")
    return b"".join(rows)


def record_accuracy(ws: Workspace, baseline: AccuracyRun, candidate: AccuracyRun,
                    result: GateResult | None, *, url: str, baseline_url: str | None = None,
                    task_id: str | None = None, block_id: str | None = None,
                    run_id: str | None = None, runtime_s: Mapping[str, float] | None = None):
    """Append one MeasurementRecorded for an accuracy check; returns the event."""
    judged = result is not None
    digest = ws.artifacts.put(items_jsonl(baseline if judged else None, candidate))
    ev = E.MeasurementRecorded(
        task_id=task_id, block_id=block_id,
        run_id=run_id or f"accuracy-{candidate.task}-{secrets.token_hex(6)}",
        source="forge-accuracy",
        metrics={"accuracy": float(candidate.accuracy), "items": float(len(candidate.items)),
                 **({"baseline_accuracy": float(baseline.accuracy),
                     "accuracy_delta": float(candidate.accuracy - baseline.accuracy)}
                    if judged else {}),
                 **{f"runtime_s_{k}": float(v) for k, v in (runtime_s or {}).items()}},
        candidate={"url": url},
        success=True,
        artifact_digest=digest,
        meta={"task": candidate.task, "baseline_url": baseline_url,
              "gate": result.model_dump(mode="json") if result is not None else None,
              "dataset": candidate.dataset,
              "items": [[i, int(c)] for i, c in candidate.items],
              **({"baseline_items": [[i, int(c)] for i, c in baseline.items],
                  "baseline_dataset": baseline.dataset}
                 if judged else {})},
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
                      filter_name: str | None = None,
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
                          "concurrency": concurrency, "metric": metric,
                          "filter_name": filter_name}
    t0 = time.monotonic()
    cand = run_task(url, model, task, **kw)
    runtime = {"candidate": round(time.monotonic() - t0, 3)}
    base = None
    if baseline_url:
        t0 = time.monotonic()
        base = run_task(baseline_url, baseline_model or model, task, **kw)
        runtime["baseline"] = round(time.monotonic() - t0, 3)
    if base is not None and base.dataset.get("items_digest") != cand.dataset.get(
            "items_digest") and {i for i, _ in base.items} == {i for i, _ in cand.items}:
        raise HarnessError(f"{task}: the baseline and the candidate read different items "
                           f"(items digest {base.dataset.get('items_digest')} vs "
                           f"{cand.dataset.get('items_digest')}): not paired")
    gate = judge_accuracy(base, cand, margin=margin, confidence=confidence,
                          iterations=iterations, seed=seed) if base is not None else None
    ev = record_accuracy(ws, base or cand, cand, gate, url=url, baseline_url=baseline_url,
                         task_id=task_id, block_id=block_id, runtime_s=runtime)
    return {"task": task, "items": len(cand.items), "accuracy": cand.accuracy,
            "baseline_accuracy": base.accuracy if base else None,
            "gate": gate.model_dump(mode="json") if gate else None,
            "dataset": cand.dataset, "runtime_s": runtime,
            "items_digest": ev.artifact_digest, "event_id": ev.event_id}
