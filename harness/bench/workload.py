"""The benchmark workload of a deployment point: what its traffic shape and SLO say to send.

`workload_for(point, tokenizer, base_dir=None, seed=42)` → `Workload` (prompts, endpoint,
load, goodput SLO), and `Workload.bench_config(url, model, engine)` → the `BenchConfig`.

Contracts (docs/workload.md has the reader's version):
- Dataset (`traffic.dataset`): `random` (default; generated prompts of exact token lengths,
  options `random:group=N`), `sharegpt:PATH` (a ShareGPT-style conversation file,
  harness/bench/sharegpt.py: prompts and output lengths from the file), `custom:PATH`
  (JSONL `{"prompt", "output_len"}`). A relative PATH resolves against `base_dir` (the point
  file's directory, in the loop and `forge bench --point`), else the current directory.
  Anything else is an error listing the forms; the file's sha256 is in `describe()`.
- Lengths (generated prompts): an int L follows bench_serving's `random` dataset (uniform in
  [max(1, int(L × range_ratio)), L]); a Distribution: `fixed` = round(mean); `uniform` = whole
  numbers in [min, max]; `normal` = N(mean, std); `lognormal` = the log-normal with that mean
  and std (in tokens); normal and lognormal are rounded and clipped to [min or 1, max or ∞].
  The draws are seeded; with int lengths, no prefix reuse and no media, the prompts are
  exactly `datasets.random_prompts(…, seed)`.
- Prefix reuse (`traffic.prefix_reuse` p > 0, generated prompts only): prompts form groups of
  `group` (default 8) in generation order, the last one smaller; each group shares one
  random prefix of P = round(p × nominal input length) tokens (the int, or the
  Distribution's mean); each prompt is that prefix followed by its own suffix of
  max(L_i − P, 1) tokens (0 when p = 1: the group's prompts are one text). The prompts are
  then shuffled (seeded), so groups interleave as sessions do. The prefix is exact at token
  level: the prompt's token ids begin with the prefix's ids (suffixes are redrawn until the
  boundary does not merge).
- Media (`traffic.media_count` n > 0): only for `scenario.modality` image or multimodal and a
  model whose `modalities` include image; each prompt carries n distinct PNGs at
  `traffic.resolution` (harness/bench/media.py), sent after the text as `image_url` parts of
  one user message on `/v1/chat/completions`. Video and audio are refused (not generated).
  `prompt_len` counts text tokens only (image tokens depend on the model's processor).
- Load: `max_concurrency` = traffic.concurrency, `request_rate` = traffic.request_rate (None:
  all at once, bounded by the concurrency), `num_prompts` requests.
- SLO: the point's SLO is the run's goodput definition (harness/bench/slo.py).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...ledger.specs import DeploymentPoint, load_point
from ..errors import HarnessError
from . import media as M
from .client import bench_command
from .datasets import (
    Prompt,
    custom_prompts,
    encode_text,
    load_tokenizer,
    random_lengths,
    text_of_length,
    token_pool,
)
from .request import BenchConfig
from .sharegpt import sharegpt_prompts
from .slo import goodput_slo

DEFAULT_GROUP = 8
# `forge bench` options a point's workload sets (given with --point: a usage error).
POINT_SETS = ("dataset", "dataset_path", "input_len", "output_len", "range_ratio",
              "num_prompts", "max_concurrency", "request_rate", "endpoint", "goodput",
              "gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len",
              "gsp_question_len")
DATASET_FORMS = "random[:group=N], sharegpt:PATH, custom:PATH"


@dataclass(frozen=True)
class Workload:
    prompts: list[Prompt]
    endpoint: str  # completions | chat
    max_concurrency: int | None
    request_rate: float
    slo: dict[str, float] | None  # goodput thresholds, ms
    dataset: str
    dataset_path: str | None = None  # the dataset file, resolved
    dataset_digest: str | None = None  # its sha256
    groups: list[int] | None = None  # shared-prefix group of each prompt
    prefix_len: int = 0
    media_count: int = 0
    resolution: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def bench_config(self, url: str, model: str, engine: str, **kw: Any) -> BenchConfig:
        """The benchmark's configuration for this workload against `url`."""
        return BenchConfig(url=url, model=model, engine=engine, endpoint=self.endpoint,
                           max_concurrency=self.max_concurrency, request_rate=self.request_rate,
                           slo=self.slo, **kw)

    def describe(self) -> dict[str, Any]:
        """What was sent, for a run's meta and `forge bench --json`."""
        n = len(self.prompts)
        out: dict[str, Any] = {
            "dataset": self.dataset, "num_prompts": n, "endpoint": self.endpoint,
            "max_concurrency": self.max_concurrency,
            "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
            "mean_input_len": sum(p.prompt_len for p in self.prompts) / n if n else 0.0,
            "mean_output_len": sum(p.output_len for p in self.prompts) / n if n else 0.0,
            "goodput_slos_ms": self.slo}
        if self.dataset_digest:
            out["dataset_digest"] = self.dataset_digest
        if self.groups is not None:
            out.update(prefix_len=self.prefix_len, prefix_groups=len(set(self.groups)))
        if self.media_count:
            out.update(media_count=self.media_count, resolution=self.resolution)
        return out


def sample_lengths(rng: Any, spec: Any, ratio: float, n: int, name: str) -> list[int]:
    """`n` lengths of `spec` (an int or a Distribution; module contract)."""
    if isinstance(spec, int):
        return random_lengths(rng, spec, ratio, n)
    kind, mean = spec.kind, float(spec.mean)
    lo = 1 if spec.min is None else max(1, int(math.ceil(spec.min)))
    hi = math.inf if spec.max is None else float(spec.max)
    if kind == "fixed":
        return [max(1, int(round(mean)))] * n
    if kind == "uniform":
        if spec.min is None or spec.max is None or spec.min > spec.max:
            raise HarnessError(f"traffic.{name}: a uniform distribution needs min ≤ max")
        return rng.integers(lo, int(spec.max) + 1, size=n).tolist()
    if spec.std is None or spec.std < 0 or mean <= 0:
        raise HarnessError(f"traffic.{name}: a {kind} distribution needs mean > 0 and std ≥ 0")
    if kind == "normal":
        xs = rng.normal(mean, spec.std, size=n)
    else:  # lognormal with the given mean and std in tokens
        sigma2 = math.log1p((spec.std / mean) ** 2)
        xs = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
    return [int(min(hi, max(lo, round(float(x))))) for x in xs]


def _nominal(spec: Any) -> float:
    return float(spec if isinstance(spec, int) else spec.mean)


def _parse_dataset(text: str) -> tuple[str, str]:
    name, _, arg = (text or "random").partition(":")
    name = name.strip()
    if name not in ("random", "sharegpt", "custom"):
        raise HarnessError(f"traffic.dataset {text!r}: expected one of {DATASET_FORMS}")
    if name != "random" and not arg.strip():
        raise HarnessError(f"traffic.dataset {text!r}: {name} needs a file ({name}:PATH)")
    return name, arg.strip()


def _group_size(arg: str, text: str) -> int:
    if not arg:
        return DEFAULT_GROUP
    key, _, value = arg.partition("=")
    if key.strip() != "group" or not value.strip().isdigit() or int(value) < 1:
        raise HarnessError(f"traffic.dataset {text!r}: random takes group=N (N ≥ 1)")
    return int(value)


def _exact_suffix(tok: Any, prefix_ids: list[int], prefix: str, n: int, rng: Any,
                  pool: Any) -> str:
    """A suffix of `n` tokens whose concatenation with `prefix` tokenizes as prefix + suffix."""
    suffix = ""
    for _ in range(16):
        suffix = text_of_length(tok, n, rng, pool)
        ids = encode_text(tok, prefix + suffix)
        if ids[:len(prefix_ids)] == prefix_ids and len(ids) == len(prefix_ids) + n:
            return suffix
    raise HarnessError(f"could not build a suffix of {n} tokens that keeps the shared prefix "
                       "intact with this tokenizer")


def generated_prompts(tok: Any, traffic: Any, seed: int, group: int
                      ) -> tuple[list[Prompt], list[int] | None, int]:
    """Random prompts of the traffic's lengths, with shared-prefix groups when it reuses
    prefixes: (prompts, group of each, prefix length)."""
    import numpy as np  # here: only building prompts needs it

    n = traffic.num_prompts
    rng = np.random.default_rng(seed)
    ins = sample_lengths(rng, traffic.input_len, traffic.range_ratio, n, "input_len")
    outs = sample_lengths(rng, traffic.output_len, traffic.range_ratio, n, "output_len")
    pool = token_pool(tok)
    p = float(traffic.prefix_reuse)
    if p <= 0:
        return [Prompt(text_of_length(tok, i, rng, pool), i, o)
                for i, o in zip(ins, outs, strict=True)], None, 0
    plen = max(1, int(round(p * _nominal(traffic.input_len))))
    prompts: list[Prompt] = []
    groups: list[int] = []
    for g, start in enumerate(range(0, n, group)):
        prefix = text_of_length(tok, plen, rng, pool)
        prefix_ids = encode_text(tok, prefix)
        for i in range(start, min(n, start + group)):
            rest = 0 if p >= 1 else max(ins[i] - plen, 1)
            suffix = _exact_suffix(tok, prefix_ids, prefix, rest, rng, pool) if rest else ""
            prompts.append(Prompt(prefix + suffix, plen + rest, outs[i]))
            groups.append(g)
    order = rng.permutation(n).tolist()
    return [prompts[i] for i in order], [groups[i] for i in order], plen


def _media_check(point: DeploymentPoint) -> tuple[int, str | None]:
    t, modality = point.scenario.traffic, point.scenario.modality
    if modality in ("video", "audio"):
        raise HarnessError(f"scenario.modality {modality}: the workload generator makes images "
                           "only (video and audio are not generated)")
    if t.media_count and modality == "text":
        raise HarnessError(f"traffic.media_count {t.media_count}: scenario.modality is text "
                           "(image or multimodal sends media)")
    if modality in ("image", "multimodal"):
        if t.media_count < 1:
            raise HarnessError(f"scenario.modality {modality}: traffic.media_count must be ≥ 1")
        if "image" not in point.model.modalities:
            raise HarnessError(f"model {point.model.name} takes {', '.join(point.model.modalities)}"
                               f" (model.modalities), not the images scenario.modality "
                               f"{modality} sends")
        M.parse_resolution(t.resolution)
    return t.media_count, t.resolution


def workload_for(point: DeploymentPoint, tokenizer: Any, *, base_dir: str | Path | None = None,
                 seed: int = 42) -> Workload:
    """The workload `point` describes (module contract); raises HarnessError naming the field."""
    t = point.scenario.traffic
    count, resolution = _media_check(point)
    name, arg = _parse_dataset(t.dataset)
    digest, path = None, None
    groups: list[int] | None = None
    plen = 0
    if name == "random":
        prompts, groups, plen = generated_prompts(tokenizer, t, seed, _group_size(arg, t.dataset))
    else:
        if t.prefix_reuse > 0:
            raise HarnessError(f"traffic.prefix_reuse {t.prefix_reuse}: shared prefixes are "
                               f"generated (dataset random), not taken from {name} files")
        path = Path(arg).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise HarnessError(f"traffic.dataset {t.dataset!r}: file {path} does not exist")
        digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        default_out = int(round(_nominal(t.output_len)))
        if name == "sharegpt":
            prompts = sharegpt_prompts(path, tokenizer, num_prompts=t.num_prompts,
                                       default_output_len=default_out, seed=seed)
        else:
            prompts = custom_prompts(path, tokenizer, default_out, limit=t.num_prompts)
    if count:
        urls = M.images_for(len(prompts), count, resolution, seed)
        prompts = [Prompt(p.prompt, p.prompt_len, p.output_len, u)
                   for p, u in zip(prompts, urls, strict=True)]
    return Workload(prompts=prompts, endpoint="chat" if count else "completions",
                    max_concurrency=t.concurrency,
                    request_rate=float(t.request_rate) if t.request_rate else math.inf,
                    slo=goodput_slo(point.scenario.slo), dataset=t.dataset,
                    dataset_path=str(path) if path else None, dataset_digest=digest,
                    groups=groups, prefix_len=plen,
                    media_count=count, resolution=resolution if count else None)


def bench_point(point_file: str | Path, *, url: str, model: str, tokenizer_dir: str | None,
                seed: int = 42, **kw: Any) -> dict[str, Any]:
    """`forge bench --point FILE`: the point's workload run by `client.bench_command` (its
    other arguments in `kw`: engine, warmup, transport, recording, …); the summary gains
    `workload` (what was sent)."""
    if not tokenizer_dir:
        raise HarnessError("--point needs --tokenizer (the model's tokenizer directory)")
    pt = load_point(point_file)
    w = workload_for(pt, load_tokenizer(tokenizer_dir), base_dir=Path(point_file).parent,
                     seed=seed)
    t = pt.scenario.traffic
    out = bench_command(
        url=url, model=model, dataset=w.dataset, tokenizer_dir=tokenizer_dir,
        dataset_path=w.dataset_path, num_prompts=len(w.prompts),
        input_len=int(round(_nominal(t.input_len))), output_len=int(round(_nominal(t.output_len))),
        range_ratio=t.range_ratio, max_concurrency=w.max_concurrency,
        request_rate=w.request_rate, seed=seed, endpoint=w.endpoint,
        goodput=[f"{k}:{v!r}" for k, v in (w.slo or {}).items()], prompts=w.prompts, **kw)
    out["workload"] = w.describe()
    return out
