"""Import `sglang.bench_serving` result files (JSONL, any 0.4–0.5 version) as measurements.

bench_serving's `--output-file` appends one JSON object per run. Its keys changed over
releases, so results are keyed by what is present, never by a fixed schema, and each line is
labelled with the releases whose client writes its key set (GENERATIONS, read from the
`result = {...}` each released client writes, 0.4.0 … 0.5.23; real outputs of several are in
tests/data/sglang/golden/bench/). Keys cannot tell every release apart: a 0.4.4 and a 0.5.3
client write the same keys, so such a line is labelled `0.4.3.post3–0.5.3`.
- 0.4.0–0.4.1.post7 write no `request_throughput` (0.4.0–0.4.1.post4 not even mean/p99
  TTFT): it is derived as completed / duration, the client's own formula, and named in
  `meta["derived"]`.
- From 0.5.3.post1 `total_input_text_tokens`/`total_input_vision_tokens` (VLM points), from
  0.5.4.post3 `server_info` (the server's `/server_info`; through a router it may be null),
  from 0.5.14 p90/p95 of every latency and, with `--cache-report`, `cache_report` (its numbers
  become `cache_report.<key>` metrics, its storage backend a meta field); 0.5.23's `--goodput`
  adds `request_goodput`, `slo_attainment`, `slo_attainment_by_metric`, `goodput_slos_ms`.
- Some builds dump the metrics dataclass directly (`total_input`, `total_output`), some name
  the total throughput `total_token_throughput`; `--output-details` adds per-request arrays at
  the top level or under `details`. These are aliased to one set of names.

The SGLang version (`meta["sglang_version"]`, and where it came from in
`meta["sglang_version_source"]`): the line's `server_info` (`server_info`, or
`server_info.decode` for a PD deployment's aggregated answer); else the version the caller
read from the deployment's servers' `/server_info` (`deployment`); else the bench client's
own release (`bench_client`: the client's, not the server's). A client release that cannot
have written the line's keys is refused, as is a deployment version that contradicts the
line's `server_info`.

Contract: `iter_results(path)` yields one `ImportedRun` per non-blank line or raises
`HarnessError("FILE:LINE: …")` naming the field (not UTF-8, malformed JSON, not an object, a
required key missing, not a number, NaN/Infinity or too large for a float; a run argument that
the ledger cannot hold). Required: `completed`, `duration`, `output_throughput`,
`median_ttft_ms`. `import_results(ws, path, task_id, block_id)` checks
every line first (a bad line: nothing stored or recorded), stores the file as an artifact and
appends one `MeasurementRecorded` (source `sglang.bench_serving`) per run, in saves of BATCH
events, idempotently (importing the same file into the same place twice adds nothing) and in
memory bounded by BATCH and MAX_LINE_BYTES, not by the file (see `import_results`).
Data policy (harness/guard/data_policy.py): a line whose class is production (the file's name
or stem, or the line's `dataset_name`, classed so in forge.toml) is stored with its texts
(`generated_texts`, `prompts`, at the top or under `details`) replaced by their count,
lengths and digests (`<key>_described`); the events name the original file's hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.ids import check_optional_id
from ...ledger.numbers import bad_number, field_path
from ...ledger.streams import MEASUREMENTS_STREAM, task_stream
from ...ledger.textfile import TextFileError, read_text
from ...ledger.workspace import Workspace
from .. import jsonl
from ..errors import HarnessError
from ..guard import data_policy
from ..record import check_measurement_target, record_measurements
from .metrics import numeric_metrics

SOURCE = "sglang.bench_serving"
# Bounds that keep an import's memory flat whatever the file's size.
BATCH = 1000  # runs per save (one transaction, one command id each)
MAX_LINE_BYTES = 16 << 20  # one result line (with --output-details arrays) may be large
CHUNK_BYTES = 8 << 20  # artifact bytes redacted at once (a smaller file: in one piece)
LISTED = 20  # measurements named in the summary
REQUIRED = ("completed", "duration", "output_throughput", "median_ttft_ms")
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
# The key generations of the result line, newest first: (first release, last release or
# None for "to the latest", keys whose presence marks it). Read from the `result = {...}` that
# each release's client writes to --output-file (every x.y.z release from 0.4.0 to 0.5.23,
# and every post release between two that differ). A line is of the newest generation whose
# marker keys it has all of.
GENERATIONS: tuple[tuple[str, str | None, frozenset[str]], ...] = (
    ("0.5.23", None, frozenset({"request_goodput"})),  # only with --goodput
    ("0.5.14", None, frozenset({"p90_ttft_ms", "p95_tpot_ms"})),  # + cache_report, if asked
    ("0.5.8", "0.5.13.post1", frozenset({"p90_e2e_latency_ms"})),
    ("0.5.6", "0.5.7", frozenset({"max_output_tokens_per_s", "max_concurrent_requests"})),
    ("0.5.5.post2", "0.5.5.post3", frozenset({"total_throughput"})),
    ("0.5.4.post3", "0.5.5.post1", frozenset({"server_info"})),
    ("0.5.3.post1", "0.5.4.post2", frozenset({"total_input_text_tokens"})),
    ("0.4.3.post3", "0.5.3", frozenset({"p95_itl_ms", "accept_length"})),
    ("0.4.2", "0.4.3.post2", frozenset({"request_throughput", "concurrency"})),
    ("0.4.1.post5", "0.4.1.post7", frozenset({"p99_ttft_ms", "mean_ttft_ms"})),
    ("0.4.0", "0.4.1.post4", frozenset()),
)
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:rc(\d+)|\.post(\d+))?$")


def release_key(version: str) -> tuple[int, int, int, int] | None:
    """A release's order (0.5.0rc2 < 0.5.0 < 0.5.0.post1), or None when not a release."""
    m = _RELEASE.match(version.strip())
    if not m:
        return None
    a, b, c, rc, post = m.groups()
    return (int(a), int(b), int(c), int(rc) - 100 if rc else int(post or 0))


def generation_label(first: str, last: str | None) -> str:
    return f"{first}+" if last is None else first if first == last else f"{first}–{last}"


@dataclass(frozen=True)
class ImportedRun:
    line: int
    shape: str  # the releases whose client writes this key set (GENERATIONS), e.g. "0.5.14+"
    metrics: dict[str, float]
    meta: dict[str, Any]


def detect_shape(obj: dict[str, Any]) -> str:
    """The releases whose client writes `obj`'s key set (e.g. `0.4.3.post3–0.5.3`, `0.5.14+`)."""
    keys = {(ALIASES[k] if k in ALIASES else k) for k in obj}
    for first, last, markers in GENERATIONS:
        if markers <= keys:
            return generation_label(first, last)
    raise AssertionError("the oldest generation has no markers")  # pragma: no cover


def _check_client(where: str, shape: str, client_version: str) -> None:
    """A client release outside the releases that write generation `shape` is refused."""
    v = release_key(client_version)
    if v is None:
        raise HarnessError(f"bench client version {client_version!r}: expected a release "
                           "like 0.5.23")
    first, last = next((f, t) for f, t, _ in GENERATIONS if generation_label(f, t) == shape)
    lo, hi = release_key(first), (release_key(last) if last else None)
    assert lo is not None
    if v < lo or (hi is not None and v > hi):
        raise HarnessError(f"{where}: the bench client of sglang {client_version} cannot "
                           f"have written this line (its keys are those of {shape})")


def _server_info_version(server_info: Any) -> tuple[str, str] | None:
    """(version, source) from a line's `server_info`: its own `version`, or (a PD deployment's
    aggregated answer, which the client itself reads as `["decode"][0]`) the first decode
    server's."""
    if not isinstance(server_info, dict):
        return None
    if server_info.get("version"):
        return str(server_info["version"]), "server_info"
    decode = server_info.get("decode")
    if isinstance(decode, list) and decode and isinstance(decode[0], dict) \
            and decode[0].get("version"):
        return str(decode[0]["version"]), "server_info.decode"
    return None


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HarnessError(f"{where}: field {key!r} must be a number, got {value!r}"[:300])
    try:
        x = float(value)
    except OverflowError:  # an integer too large for a float
        x = math.inf
    if not math.isfinite(x):
        shown = value if isinstance(value, float) else f"{str(value)[:12]}… (too large)"
        raise HarnessError(f"{where}: field {key!r} is not a finite number ({shown})")
    return x


def parse_line(obj: Any, where: str, line: int, *, server_version: str | None = None,
               client_version: str | None = None) -> ImportedRun:
    """One result line. `server_version`: the deployment's servers' version (read from their
    `/server_info`), for a line without one; `client_version`: the bench client's release."""
    if not isinstance(obj, dict):
        raise HarnessError(f"{where}: expected a JSON object (one bench_serving result), "
                           f"got {type(obj).__name__}")
    data: dict[str, Any] = {(ALIASES[k] if k in ALIASES else k): v for k, v in obj.items()}
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
        elif k == "cache_report":
            if v is None:
                continue
            if not isinstance(v, dict):
                raise HarnessError(f"{where}: field {k!r} must be an object, got {v!r}"[:300])
            for sub, x in v.items():
                if isinstance(x, str):  # storage_backend: a name, not a number
                    meta[f"{k}.{sub}"] = x
                elif x is not None:
                    metrics[f"{k}.{sub}"] = _number(where, f"{k}.{sub}", x)
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
                "total_input_text_tokens", "total_input_vision_tokens",
                "max_output_tokens_per_s", "max_concurrent_requests", "request_goodput",
                "slo_attainment"):
            if v is None:
                continue
            metrics[k] = _number(where, k, v)
    details = data.get("details")
    if not isinstance(details, dict):
        details = data
    errors = details.get("errors")
    if "failed" not in metrics and isinstance(errors, list):
        metrics["failed"] = float(sum(1 for e in errors if e))
    if "request_throughput" not in metrics and metrics["duration"] > 0:
        # 0.4.0–0.4.1.post7 do not write it; their own formula is completed / duration.
        metrics["request_throughput"] = metrics["completed"] / metrics["duration"]
        meta["derived"] = ["request_throughput"]
    server_info = data.get("server_info")
    shape = detect_shape(obj)
    meta["client_shape"] = shape
    meta["line"] = line
    meta["has_details"] = isinstance(errors, list)
    if client_version is not None:
        _check_client(where, shape, client_version)
        meta["bench_client_version"] = client_version
    if isinstance(server_info, dict):
        meta["server_info_keys"] = len(server_info)
    known = _server_info_version(server_info)
    if known is not None and server_version is not None and known[0] != server_version:
        raise HarnessError(f"{where}: server_info says sglang {known[0]}, but the deployment's "
                           f"version was given as {server_version}")
    if known is None and server_version is not None:
        known = (server_version, "deployment")
    if known is None and client_version is not None:
        known = (client_version, "bench_client")
    if known is not None:
        meta["sglang_version"], meta["sglang_version_source"] = known
    flat = numeric_metrics(metrics)
    bad = bad_number(meta)  # e.g. a seed over 64 bits: the ledger could not hold it
    if bad is not None:
        raise HarnessError(f"{where}: field {field_path('', bad[0])}: {bad[1]}")
    return ImportedRun(line, shape, flat, meta)


@dataclass(frozen=True)
class Given:
    """What the caller knows beyond the file: the deployment's servers' SGLang version (from
    their `/server_info`) and the bench client's own release (see parse_line)."""

    server_version: str | None = None
    client_version: str | None = None


def parse_results(path: str | Path, given: Given = Given()) -> tuple[list[ImportedRun], bytes]:
    """Every result line of a (small) bench_serving JSONL file, and the file's bytes.
    `import_results` streams instead: use this only where the whole file fits in memory."""
    p = Path(path)
    runs = list(iter_results(p, given))
    if not runs:
        raise HarnessError(f"{p}: no bench_serving results (empty file)")
    try:
        return runs, p.read_bytes()
    except OSError as e:
        raise HarnessError(f"cannot read {p}: {e.strerror or e}") from None


def iter_results(path: str | Path, given: Given = Given()) -> Iterator[ImportedRun]:
    """The result lines of a bench_serving JSONL file, one at a time (bounded memory)."""
    p = Path(path)
    for no, raw in _raw_lines(p):
        run = _parse_raw(p, no, raw, given)
        if run is not None:
            yield run


def _raw_lines(p: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) of `p`, each line at most MAX_LINE_BYTES."""
    return jsonl.read_lines(p, max_line_bytes=MAX_LINE_BYTES)


def _parse_raw(p: Path, no: int, raw: bytes, given: Given) -> ImportedRun | None:
    where = f"{p}:{no}"
    obj = jsonl.parse_line(raw, where)
    return None if obj is None else parse_line(obj, where, no,
                                               server_version=given.server_version,
                                               client_version=given.client_version)


@dataclass
class _Scan:
    """What the first pass learns: per-batch hashes of the raw bytes, counts, a summary."""

    file_hash: str = ""
    runs: int = 0
    batch_hashes: list[str] = field(default_factory=list)
    shapes: set[str] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)
    version_sources: set[str] = field(default_factory=set)
    listed: list[dict[str, Any]] = field(default_factory=list)


def _batches(p: Path, scan: _Scan | None, given: Given
             ) -> Iterator[tuple[bytes, list[ImportedRun], str]]:
    """(raw bytes, runs, sha256 of the raw bytes) per BATCH runs (the last batch takes the
    rest of the file). Fills `scan` on the way when given."""
    h = hashlib.sha256()
    raw_parts: list[bytes] = []
    runs: list[ImportedRun] = []
    for no, raw in _raw_lines(p):
        run = _parse_raw(p, no, raw, given)
        if run is not None and len(runs) == BATCH:
            part = b"".join(raw_parts)
            yield part, runs, hashlib.sha256(part).hexdigest()
            raw_parts, runs = [], []
        h.update(raw)
        raw_parts.append(raw)
        if run is not None:
            runs.append(run)
    if runs or raw_parts:
        part = b"".join(raw_parts)
        yield part, runs, hashlib.sha256(part).hexdigest()
    if scan is not None:
        scan.file_hash = h.hexdigest()


TEXT_DETAILS = ("generated_texts", "prompts")


def _line_scrubber(ws: Workspace, p: Path) -> Callable[[bytes], bytes] | None:
    """How lines are stored under the data policy: None when none of them can be of class
    production (nothing to parse twice), else a function of one raw line."""
    if ws.config.settings.data.store_production:
        return None
    file_cls = data_policy.class_of(ws, dataset_path=p)
    if file_cls != data_policy.PRODUCTION and data_policy.PRODUCTION not in \
            ws.config.settings.data.classes.values():
        return None

    def scrub(raw: bytes) -> bytes:
        obj = json.loads(raw) if raw.strip() else None
        if not isinstance(obj, dict):
            return raw
        cls = data_policy.strictest([file_cls, data_policy.class_of(
            ws, dataset=str(obj.get("dataset_name") or ""))])
        if cls != data_policy.PRODUCTION:
            return raw
        details = obj.get("details")
        for holder in (obj, details if isinstance(details, dict) else {}):
            for key in TEXT_DETAILS:
                if isinstance(holder.get(key), list):
                    holder[f"{key}_described"] = data_policy.describe(
                        [str(t) for t in holder[key]])
                    holder[key] = []
        obj["data_class"] = data_policy.PRODUCTION
        return json.dumps(obj).encode("utf-8") + b"\n"

    return scrub


def _scan_chunks(p: Path, scan: _Scan, scrub: Callable[[bytes], bytes] | None = None,
                 given: Given = Given()) -> Iterator[bytes]:
    """First pass: validate every line, fill `scan`, and yield the file's bytes in chunks of
    whole lines for the artifact store (each line through `scrub` when given). Raises
    (before anything is stored) on a bad line."""
    pending: list[bytes] = []
    size = 0
    for part, runs, digest in _batches(p, scan, given):
        scan.batch_hashes.append(digest)
        if scrub is not None:
            part = b"".join(scrub(line) for line in part.splitlines(keepends=True))
        for r in runs:
            scan.runs += 1
            scan.shapes.add(r.shape)
            if "sglang_version" in r.meta:
                scan.versions.add(str(r.meta["sglang_version"]))
                scan.version_sources.add(str(r.meta["sglang_version_source"]))
            if len(scan.listed) < LISTED:
                scan.listed.append({"run_id": f"{p.name}:{r.line}", "shape": r.shape,
                                    "output_throughput": r.metrics.get("output_throughput"),
                                    "median_ttft_ms": r.metrics.get("median_ttft_ms")})
        pending.append(part)
        size += len(part)
        if size >= CHUNK_BYTES:
            yield b"".join(pending)
            pending, size = [], 0
    if not scan.runs:
        raise HarnessError(f"{p}: no bench_serving results (empty file)")
    if pending:
        yield b"".join(pending)


def import_results(ws: Workspace, path: str | Path, *, task_id: str | None = None,
                   block_id: str | None = None, given: Given = Given()) -> dict[str, Any]:
    """Record every run in `path` as a MeasurementRecorded; returns a summary (`versions`:
    the SGLang versions recorded, `version_sources`: where each came from).

    Streams the file twice, holding at most BATCH runs at a time: the first pass validates
    every line and stores the artifact (a bad line anywhere: nothing is stored or recorded),
    the second appends the runs in saves of BATCH events. Each save's command id names the
    file's hash and the batch, so a re-import adds nothing and an interrupted import resumes
    where it stopped; a file that changes between the passes is refused at the first batch
    that differs."""
    check_optional_id(task_id, "task id")  # the one id rule
    check_optional_id(block_id, "block id")
    check_measurement_target(ws, task_id, block_id)  # before the file is read or stored
    p = Path(path)
    scan = _Scan()
    digest = ws.artifacts.put_stream(_scan_chunks(p, scan, _line_scrubber(ws, p), given))
    file_hash = scan.file_hash
    stream = task_stream(task_id) if task_id else MEASUREMENTS_STREAM
    base = f"bench-import:{file_hash[:32]}:{task_id or ''}:{block_id or ''}"
    appended = seen = 0
    for i, (_part, runs, part_hash) in enumerate(_batches(p, None, given)):
        seen = i + 1
        if i >= len(scan.batch_hashes) or part_hash != scan.batch_hashes[i]:
            first = runs[0].line if runs else "?"
            raise HarnessError(f"{p}: changed while it was imported (from line {first} on); "
                               f"{appended} runs were recorded: import it again")
        if not runs:
            continue
        command = base if i == 0 else f"{base}:{i}"  # batch 0 keeps the single-save id
        if ws.ledger.command_done(command):
            continue
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
        res = record_measurements(ws, events, task_id=task_id, command_id=command)
        if not res.duplicate:
            appended += len(events)
    if seen != len(scan.batch_hashes):
        raise HarnessError(f"{p}: changed while it was imported (it is shorter now); "
                           f"{appended} runs were recorded: import it again")
    return {"file": str(p), "stream": stream, "runs": scan.runs, "duplicate": appended == 0,
            "recorded": appended, "shapes": sorted(scan.shapes), "artifact": digest,
            "versions": sorted(scan.versions), "version_sources": sorted(scan.version_sources),
            "measurements": scan.listed}


# --- `forge measure --from-json FILE` and `--metric NAME=NUMBER` ---------------------------

MAX_JSON_BYTES = 16 << 20


class _NonFinite:
    """What `NaN`, `Infinity` or a float too large (1e400) parse to: refused where used."""

    def __init__(self, text: str):
        self.text = text


def _json_float(text: str) -> float | _NonFinite:
    x = float(text)
    return x if math.isfinite(x) else _NonFinite(text)


def _line_of_key(text: str, key: str) -> int | None:
    m = re.search(re.escape(json.dumps(key)) + r"\s*:", text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def metrics_from_json(path: str | Path) -> dict[str, float]:
    """The metrics in a JSON file holding one object (e.g. a bench_serving result): its
    top-level numbers. Refused with one line naming file, line and field: a file that cannot
    be read, is not UTF-8, not JSON, not an object; a metric that is NaN, an infinity, too
    large for a float or over 64 bits. bench_serving's run arguments (`request_rate:
    Infinity`) are not metrics and are left out."""
    p = Path(path)
    try:
        text = read_text(p, MAX_JSON_BYTES, "a JSON object of metrics")
    except TextFileError as e:
        raise HarnessError(f"{p}: {e}") from None
    try:
        data = json.loads(text, parse_constant=_NonFinite, parse_float=_json_float)
    except json.JSONDecodeError as e:
        raise HarnessError(f"{p}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})"
                           ) from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        raise HarnessError(f"{p}: malformed JSON ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{p}: expected a JSON object of metrics, got "
                           f"{'an array' if isinstance(data, list) else type(data).__name__}")
    out: dict[str, float] = {}
    for k, v in data.items():
        if isinstance(v, _NonFinite):
            if k in ARG_KEYS:
                continue  # a run argument (bench_serving writes `Infinity` for no rate limit)
            line = _line_of_key(text, k)
            raise HarnessError(f"{p}{f':{line}' if line else ''}: field {k!r}: {v.text} is "
                               "not a finite number")
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = v
    return finite_metrics(out, str(p), text)


def finite_metrics(values: dict[str, Any], where: str, text: str | None = None
                   ) -> dict[str, float]:
    """`values` as floats, each finite and within 64 bits (HarnessError naming the field)."""
    out: dict[str, float] = {}
    for k, v in values.items():
        bad = bad_number(v)
        x = None
        if bad is None:
            try:
                x = float(v)
            except (OverflowError, TypeError, ValueError):
                x = None
        if x is None or not math.isfinite(x):
            why = bad[1] if bad else f"{str(v)[:40]} is not a finite number"
            line = _line_of_key(text, k) if text is not None else None
            raise HarnessError(f"{where}{f':{line}' if line else ''}: field {k!r}: {why}")
        out[k] = x
    return out
