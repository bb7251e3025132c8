"""Import `sglang.bench_serving` result files (JSONL, any 0.4–0.5 version) as measurements.

bench_serving's `--output-file` appends one JSON object per run. Its keys changed over
versions, so results are keyed by what is present, never by a fixed schema:
- 0.4.x: `{mean,median,std,p99}_{ttft,tpot,itl,e2e_latency}_ms` (+ `p95_itl_ms`, `max_itl_ms`),
  no `server_info`, no p90/p95 (other than ITL), no goodput keys.
- 0.5.x: adds `p90_*`/`p95_*`, `server_info` (with `version`), `max_output_tokens_per_s`,
  `max_concurrent_requests`, and with `--goodput` `request_goodput`, `slo_attainment`,
  `slo_attainment_by_metric`, `goodput_slos_ms`.
- Some builds dump the metrics dataclass directly (`total_input`, `total_output`), some name
  the total throughput `total_token_throughput`; `--output-details` adds per-request arrays at
  the top level or under `details`. These are aliased to one set of names.

Contract: `parse_results(path)` returns one `ImportedRun` per non-blank line or raises
`HarnessError("FILE:LINE: …")` naming the field (malformed JSON, not an object, a required key
missing or not a number). Required: `completed`, `duration`, `request_throughput`,
`output_throughput`, `median_ttft_ms`. `import_results(ws, path, task_id, block_id)` stores the
file as an artifact and appends one `MeasurementRecorded` (source `sglang.bench_serving`) per
run, atomically and idempotently (importing the same file into the same place twice adds
nothing).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import HarnessError
from .metrics import numeric_metrics

SOURCE = "sglang.bench_serving"
REQUIRED = ("completed", "duration", "request_throughput", "output_throughput", "median_ttft_ms")
ALIASES = {
    "total_input": "total_input_tokens",
    "total_output": "total_output_tokens",
    "total_output_retokenized": "total_output_tokens_retokenized",
    "total_token_throughput": "total_throughput",
}
# Run arguments: kept in meta, not in metrics.
ARG_KEYS = frozenset({
    "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len",
    "random_input_len", "random_output_len", "random_range_ratio", "num_prompts", "seed",
    "tag", "model_id", "tokenizer_id", "date", "label", "burstiness", "lora_name",
    "gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len", "gsp_question_len",
    "gsp_output_len",
})
DETAIL_KEYS = frozenset({"input_lens", "output_lens", "ttfts", "itls", "generated_texts",
                         "errors", "start_times", "details"})
_NEW_STYLE = re.compile(r"^p(90|95)_(ttft|tpot|e2e_latency)_ms$|^p90_itl_ms$")


@dataclass(frozen=True)
class ImportedRun:
    line: int
    shape: str  # "0.4.x" or "0.5.x"
    metrics: dict[str, float]
    meta: dict[str, Any]


def detect_shape(obj: dict[str, Any]) -> str:
    """The client generation that wrote `obj`, from the keys it has."""
    # `total_input`/nested `details` come from the 0.5-era `sglang.benchmark.metrics` layout.
    if ("server_info" in obj or "request_goodput" in obj or "max_concurrent_requests" in obj
            or "slo_attainment" in obj or "total_input" in obj or "details" in obj
            or any(_NEW_STYLE.match(k) for k in obj)):
        return "0.5.x"
    return "0.4.x"


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HarnessError(f"{where}: field {key!r} must be a number, got {value!r}"[:300])
    return float(value)


def parse_line(obj: Any, where: str, line: int) -> ImportedRun:
    if not isinstance(obj, dict):
        raise HarnessError(f"{where}: expected a JSON object (one bench_serving result), "
                           f"got {type(obj).__name__}")
    data = {ALIASES.get(k, k): v for k, v in obj.items()}
    for key in REQUIRED:
        if key not in data:
            raise HarnessError(f"{where}: missing required field {key!r} "
                               f"(not a sglang.bench_serving result line?)")
        _number(where, key, data[key])
    metrics: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for k, v in data.items():
        if k in ARG_KEYS:
            # bench_serving writes `Infinity` for an unbounded rate; keep it readable as text.
            meta[k] = str(v) if isinstance(v, float) and not math.isfinite(v) else v
        elif k in DETAIL_KEYS or k == "server_info":
            continue
        elif k in ("slo_attainment_by_metric", "goodput_slos_ms"):
            if v is None:
                continue
            if not isinstance(v, dict):
                raise HarnessError(f"{where}: field {k!r} must be an object, got {v!r}"[:300])
            if k == "goodput_slos_ms":
                meta[k] = v
            else:
                metrics[k] = {s: _number(where, f"{k}.{s}", x) for s, x in v.items()}
        elif k.endswith("_ms") or k.endswith("_throughput") or k in (
                "completed", "failed", "duration", "concurrency", "accept_length",
                "total_input_tokens", "total_output_tokens", "total_output_tokens_retokenized",
                "max_output_tokens_per_s", "max_concurrent_requests", "request_goodput",
                "slo_attainment"):
            if v is None:
                continue
            metrics[k] = _number(where, k, v)
    details = data.get("details") if isinstance(data.get("details"), dict) else data
    errors = details.get("errors")
    if "failed" not in metrics and isinstance(errors, list):
        metrics["failed"] = float(sum(1 for e in errors if e))
    server_info = data.get("server_info")
    shape = detect_shape(obj)
    meta["client_shape"] = shape
    meta["line"] = line
    meta["has_details"] = isinstance(errors, list)
    if isinstance(server_info, dict):
        if server_info.get("version"):
            meta["sglang_version"] = server_info["version"]
        meta["server_info_keys"] = len(server_info)
    flat = numeric_metrics(metrics)
    bad = [k for k, v in flat.items() if not math.isfinite(v)]
    if bad:
        raise HarnessError(f"{where}: field {bad[0]!r} is not a finite number")
    return ImportedRun(line, shape, flat, meta)


def parse_results(path: str | Path) -> tuple[list[ImportedRun], bytes]:
    """Every result line of a bench_serving JSONL file, and the file's bytes."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise HarnessError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HarnessError(f"{p}: not UTF-8 text (a bench_serving JSONL file?)") from None
    runs: list[ImportedRun] = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HarnessError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
        runs.append(parse_line(obj, where, no))
    if not runs:
        raise HarnessError(f"{p}: no bench_serving results (empty file)")
    return runs, raw


def import_results(ws, path: str | Path, *, task_id: str | None = None,
                   block_id: str | None = None) -> dict[str, Any]:
    """Record every run in `path` as a MeasurementRecorded; returns a summary."""
    from ..ledger import events as E
    from ..ledger.store import task_stream
    from .bench import MEASUREMENTS_STREAM

    runs, raw = parse_results(path)
    file_hash = hashlib.sha256(raw).hexdigest()
    digest = ws.artifacts.put(raw)
    p = Path(path)
    events = [
        E.MeasurementRecorded(
            task_id=task_id, block_id=block_id,
            run_id=f"{p.name}:{r.line}",
            source=SOURCE,
            metrics=r.metrics,
            success=r.metrics.get("completed", 0) > 0,
            error=(f"{int(r.metrics['failed'])} requests failed"
                   if r.metrics.get("failed") else None),
            artifact_digest=digest,
            meta={**r.meta, "file": p.name},
            input_digests={"bench_serving_file": "sha256:" + file_hash},
        )
        for r in runs
    ]
    stream = task_stream(task_id) if task_id else MEASUREMENTS_STREAM
    command = f"bench-import:{file_hash[:32]}:{task_id or ''}:{block_id or ''}"
    res = ws.ledger.append(stream, events, command_id=command)
    return {"file": str(p), "stream": stream, "runs": len(runs), "duplicate": res.duplicate,
            "shapes": sorted({r.shape for r in runs}), "artifact": digest,
            "versions": sorted({str(r.meta["sglang_version"]) for r in runs
                                if "sglang_version" in r.meta}),
            "measurements": [{"run_id": e.run_id, "shape": r.shape,
                              "output_throughput": r.metrics.get("output_throughput"),
                              "median_ttft_ms": r.metrics.get("median_ttft_ms")}
                             for e, r in zip(events, runs, strict=True)]}
