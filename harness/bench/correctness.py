"""Correctness: greedy token-match rate of a candidate against the baseline's outputs.

Contracts:
- `token_match(baseline, candidate)` is pure. Both are one token-id list per prompt, in the
  same prompt order. Greedy decoding diverges for good after its first different token, so a
  prompt's score is its matched prefix: `match = matched_prefix / max(len_b, len_c)` (1.0 when
  both are empty); a shorter or longer candidate loses the difference. The overall rate is
  token-weighted: Σ matched_prefix / Σ max(len_b, len_c). Returns `(rate, per_prompt)` with
  one dict per prompt (index, lengths, matched_prefix, match, exact, first_mismatch).
- `collect_greedy_outputs` sends a fixed prompt set with temperature 0 and a fixed
  `max_tokens` through the bench client and returns, per prompt, the text and token ids. Token
  ids come from re-tokenizing the generated text with the model's tokenizer: streamed OpenAI
  completions (transformers serve included) return text, not ids. Identical texts give
  identical ids, so this can only under-report a match where texts differ at a token boundary.
- `record_correctness` appends one MeasurementRecorded (source `forge-correctness`, metrics
  `token_match`, `exact_match`, `prompts`) with the per-prompt results in meta and the outputs
  as a JSONL artifact. Data policy (harness/guard/data_policy.py): for class production
  (`data_class`, else the class of `url`) the artifact keeps no prompt, text or token ids,
  only their lengths and sha256 digests (`outputs_jsonl(..., scrub=True)`).
- `collect_greedy_outputs(..., guard=)` sends through the production guard (bench client).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from ...ledger import events as E
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import data_policy
from ..record import record_measurements
from .client import BenchGuard, run_bench
from .datasets import Prompt
from .request import BenchConfig

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, the first humans to walk on the Moon were",
    "To make a cup of tea, first",
    "The quick brown fox",
    "Water boils at a temperature of",
)


def token_match(baseline: Sequence[Sequence[int]],
                candidate: Sequence[Sequence[int]]) -> tuple[float, list[dict[str, Any]]]:
    """Token-weighted greedy match rate and per-prompt results (module contract)."""
    if len(baseline) != len(candidate):
        raise HarnessError(f"baseline has {len(baseline)} outputs but candidate has "
                           f"{len(candidate)}: they must cover the same prompt set")
    per: list[dict[str, Any]] = []
    matched_total = denom_total = 0
    for i, (b, c) in enumerate(zip(baseline, candidate, strict=True)):
        b, c = list(b), list(c)
        k = 0
        for x, y in zip(b, c, strict=False):
            if x != y:
                break
            k += 1
        denom = max(len(b), len(c))
        exact = b == c
        per.append({"index": i, "baseline_len": len(b), "candidate_len": len(c),
                    "matched_prefix": k, "match": (k / denom) if denom else 1.0,
                    "exact": exact, "first_mismatch": None if exact else k})
        matched_total += k
        denom_total += denom
    rate = matched_total / denom_total if denom_total else 1.0
    return rate, per


@dataclass(frozen=True)
class GreedyOutput:
    prompt: str
    text: str
    token_ids: list[int]
    success: bool
    error: str = ""


def collect_greedy_outputs(url: str, model: str, tokenizer, *,
                           prompts: Sequence[str] = DEFAULT_PROMPTS, max_tokens: int = 32,
                           engine: str = "hf", endpoint: str = "completions",
                           concurrency: int = 4,
                           extra_body: Mapping[str, Any] | None = None,
                           guard: BenchGuard | None = None) -> list[GreedyOutput]:
    """Greedy outputs of a server on a fixed prompt set (module contract)."""
    if tokenizer is None:
        raise HarnessError("collecting greedy outputs needs the model's tokenizer (for ids)")
    ps = [Prompt(p, len(tokenizer.encode(p, add_special_tokens=False)), max_tokens)
          for p in prompts]
    cfg = BenchConfig(url=url, model=model, endpoint=endpoint, max_concurrency=concurrency,
                      warmup=0, engine=engine, extra_body=dict(extra_body or {}))
    res = run_bench(cfg, ps, guard=guard)
    out = []
    for p, r in zip(prompts, res.records, strict=True):
        ids = list(tokenizer.encode(r.generated_text, add_special_tokens=False)) \
            if r.success else []
        out.append(GreedyOutput(p, r.generated_text, ids, r.success, r.error))
    return out


def outputs_jsonl(outputs: Sequence[GreedyOutput], *, scrub: bool = False) -> bytes:
    """One JSON line per output; `scrub`: prompt, text and token ids as lengths and digests
    (a scrubbed line is not a GreedyOutput any more: `is_scrubbed`)."""
    rows = [asdict(o) for o in outputs]
    if scrub:
        rows = data_policy.scrub(rows, data_policy.PRODUCTION)
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def is_scrubbed(row: Mapping[str, Any]) -> bool:
    return row.get("data_class") == data_policy.PRODUCTION


def compare_outputs(baseline: Sequence[GreedyOutput],
                    candidate: Sequence[GreedyOutput]) -> tuple[float, list[dict[str, Any]]]:
    """`token_match` over two collected output sets; a candidate request that failed scores
    0 for its prompt (its error is kept in the per-prompt result)."""
    if [o.prompt for o in baseline] != [o.prompt for o in candidate]:
        raise HarnessError("baseline and candidate outputs are for different prompt sets")
    rate, per = token_match([o.token_ids for o in baseline], [o.token_ids for o in candidate])
    for row, o in zip(per, candidate, strict=True):
        if not o.success:
            row["error"] = o.error
    return rate, per


def record_correctness(ws: Workspace, rate: float, per_prompt: Sequence[Mapping[str, Any]],
                       outputs: Sequence[GreedyOutput] = (), *, task_id: str | None = None,
                       block_id: str | None = None, candidate: Mapping[str, Any] | None = None,
                       run_id: str | None = None, baseline_digest: str | None = None,
                       url: str | None = None, data_class: str | None = None):
    """Append one MeasurementRecorded for a correctness check; returns the event."""
    cls = data_class or data_policy.class_of(ws, url=url)
    scrub = not data_policy.stores_text(ws, cls)
    digest = ws.artifacts.put(outputs_jsonl(outputs, scrub=scrub)) if outputs else None
    n = len(per_prompt)
    exact = sum(1 for r in per_prompt if r.get("exact")) / n if n else 1.0
    ev = E.MeasurementRecorded(
        task_id=task_id, block_id=block_id,
        run_id=run_id or f"correctness-{(digest or 'none')[7:19]}",
        source="forge-correctness",
        metrics={"token_match": float(rate), "exact_match": float(exact), "prompts": float(n)},
        candidate=dict(candidate or {}),
        success=True,
        artifact_digest=digest,
        meta={"per_prompt": [dict(r) for r in per_prompt],
              "token_ids": "retokenized generated text (model tokenizer)"},
        input_digests={"baseline_outputs": baseline_digest} if baseline_digest else {},
    )
    record_measurements(ws, [ev], task_id=task_id,
                        command_id=f"correctness:{task_id or ''}:{block_id or ''}:{ev.run_id}:"
                                   f"{digest or ev.event_id}")
    return ev
