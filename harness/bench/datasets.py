"""Benchmark prompt sets: random (exact token lengths), shared-prefix, and custom JSONL.

Contracts:
- `random_prompts`: lengths follow `sglang.bench_serving --dataset-name random`: each input
  and output length is drawn uniformly from [max(1, int(L × range_ratio)), L] (ratio 1.0 =
  fixed lengths; 0.0 = [1, L]). Every prompt encodes (without special tokens) to exactly its
  `prompt_len` tokens with the given tokenizer: random non-special ids are decoded, re-encoded,
  and trimmed/extended until the round trip is stable. Seeded: the same arguments give the
  same prompts.
- `shared_prefix_prompts`: `num_groups` random system prefixes of `system_prompt_len` tokens,
  each followed by `prompts_per_group` random questions of `question_len` tokens
  (`"{system}\\n\\n{question}"`, as bench_serving's generated-shared-prefix); shuffled, seeded;
  `prompt_len` is the encoded length of the whole prompt.
- `custom_prompts`: JSONL of `{"prompt": str, "output_len": int}`; a bad line raises
  `HarnessError("FILE:LINE: …")` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import HarnessError

if TYPE_CHECKING:
    import numpy as np
from ..jsonl import iter_jsonl


@dataclass(frozen=True)
class Prompt:
    """One request's input. `prompt_len` counts the text's tokens; `media` are image data URLs
    sent after the text as OpenAI chat content parts (harness/bench/media.py)."""

    prompt: str
    prompt_len: int
    output_len: int
    media: tuple[str, ...] = ()


def load_tokenizer(path: str | Path):
    """The model's tokenizer from a local directory (never the hub)."""
    p = Path(path)
    if not p.is_dir():
        raise HarnessError(f"tokenizer directory {p} does not exist")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers raises many kinds; one line is enough
        raise HarnessError(f"cannot load tokenizer from {p}: {' '.join(str(e).split())}") from None


def encode_text(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def token_pool(tok) -> np.ndarray:
    special = set(getattr(tok, "all_special_ids", []) or [])
    size = len(tok)
    import numpy as np  # here: only building prompts needs it

    ids = np.array([i for i in range(size) if i not in special], dtype=np.int64)
    if ids.size == 0:
        raise HarnessError("tokenizer has no non-special tokens")
    return ids


def text_of_length(tok, n: int, rng: np.random.Generator, pool: np.ndarray | None = None,
                   max_rounds: int = 32) -> str:
    """A text that encodes to exactly `n` tokens (no special tokens)."""
    if n <= 0:
        return ""
    pool = token_pool(tok) if pool is None else pool
    for _attempt in range(8):
        ids = rng.choice(pool, size=n).tolist()
        for _ in range(max_rounds):
            text = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            got = encode_text(tok, text)
            if len(got) == n:
                return text
            # Trim to n, or extend with fresh random ids, and try the round trip again.
            ids = got[:n] if len(got) > n else got + rng.choice(pool, size=n - len(got)).tolist()
    # Rarely a trim cuts a multi-byte character, whose replacement re-encodes longer, round
    # after round. Only then (so every prompt the rounds above build stays as it was): redraw
    # the tail when a round's length repeats.
    for _attempt in range(64):
        ids, last = rng.choice(pool, size=n).tolist(), -1
        for _ in range(max_rounds):
            text = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            got = encode_text(tok, text)
            if len(got) == n:
                return text
            k = min(n, 1 + (len(got) == last) * 2)
            last = len(got)
            ids = got[:n - k] + rng.choice(pool, size=k).tolist() if len(got) > n \
                else got + rng.choice(pool, size=n - len(got)).tolist()
    raise HarnessError(f"could not build a prompt of exactly {n} tokens with this tokenizer")


def random_lengths(rng: np.random.Generator, length: int, ratio: float, n: int) -> list[int]:
    if length < 1:
        raise HarnessError(f"length {length} must be at least 1")
    if not 0.0 <= ratio <= 1.0:
        raise HarnessError(f"range_ratio {ratio} must be within [0, 1]")
    lo = max(1, int(length * ratio))
    return rng.integers(lo, length + 1, size=n).tolist()


def random_prompts(tokenizer, num_prompts: int, input_len: int, output_len: int,
                   range_ratio: float = 1.0, seed: int = 42) -> list[Prompt]:
    """bench_serving's `random` dataset with exact token lengths (module contract)."""
    if num_prompts < 1:
        raise HarnessError(f"num_prompts {num_prompts} must be at least 1")
    import numpy as np  # here: only building prompts needs it

    rng = np.random.default_rng(seed)
    ins = random_lengths(rng, input_len, range_ratio, num_prompts)
    outs = random_lengths(rng, output_len, range_ratio, num_prompts)
    pool = token_pool(tokenizer)
    return [Prompt(text_of_length(tokenizer, i, rng, pool), i, o) for i, o in zip(ins, outs,
                                                                                   strict=True)]


def shared_prefix_prompts(tokenizer, num_groups: int, prompts_per_group: int,
                          system_prompt_len: int, question_len: int, output_len: int,
                          seed: int = 42) -> list[Prompt]:
    """bench_serving's `generated-shared-prefix` dataset (module contract)."""
    if num_groups < 1 or prompts_per_group < 1:
        raise HarnessError("num_groups and prompts_per_group must be at least 1")
    import numpy as np  # here: only building prompts needs it

    rng = np.random.default_rng(seed)
    pool = token_pool(tokenizer)
    out: list[Prompt] = []
    for _ in range(num_groups):
        system = text_of_length(tokenizer, system_prompt_len, rng, pool)
        for _ in range(prompts_per_group):
            question = text_of_length(tokenizer, question_len, rng, pool)
            full = f"{system}\n\n{question}"
            out.append(Prompt(full, len(encode_text(tokenizer, full)), output_len))
    order = rng.permutation(len(out)).tolist()
    return [out[i] for i in order]


def custom_prompts(path: str | Path, tokenizer=None, default_output_len: int | None = None,
                   limit: int | None = None) -> list[Prompt]:
    """Prompts from JSONL lines `{"prompt": str, "output_len": int}`. `prompt_len` is the
    tokenizer's count when given, else the line's `prompt_len`, else 0. Blank lines skipped."""
    p = Path(path)
    out: list[Prompt] = []
    for no, obj in iter_jsonl(p):
        where = f"{p}:{no}"
        if not isinstance(obj, dict):
            raise HarnessError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise HarnessError(f"{where}: field 'prompt' must be a non-empty string")
        out_len = obj.get("output_len", default_output_len)
        if isinstance(out_len, bool) or not isinstance(out_len, int) or out_len < 1:
            raise HarnessError(f"{where}: field 'output_len' must be an integer ≥ 1, "
                               f"got {out_len!r}")
        if tokenizer is not None:
            plen = len(encode_text(tokenizer, prompt))
        else:
            plen = obj.get("prompt_len", 0)
            if isinstance(plen, bool) or not isinstance(plen, int) or plen < 0:
                raise HarnessError(f"{where}: field 'prompt_len' must be an integer ≥ 0")
        out.append(Prompt(prompt, plen, out_len))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise HarnessError(f"dataset {p} has no prompts")
    return out


def build_prompts(dataset: str, *, tokenizer_dir: str | Path | None = None,
                  dataset_path: str | Path | None = None, num_prompts: int = 64,
                  input_len: int = 128, output_len: int = 64, range_ratio: float = 1.0,
                  seed: int = 42, gsp_num_groups: int = 4, gsp_prompts_per_group: int = 16,
                  gsp_system_prompt_len: int = 512, gsp_question_len: int = 64) -> list[Prompt]:
    """The prompt set named by `dataset` (random | shared-prefix | custom)."""
    tok = load_tokenizer(tokenizer_dir) if tokenizer_dir else None
    if dataset == "random":
        if tok is None:
            raise HarnessError("dataset 'random' needs --tokenizer (the model's tokenizer dir)")
        return random_prompts(tok, num_prompts, input_len, output_len, range_ratio, seed)
    if dataset == "shared-prefix":
        if tok is None:
            raise HarnessError("dataset 'shared-prefix' needs --tokenizer")
        return shared_prefix_prompts(tok, gsp_num_groups, gsp_prompts_per_group,
                                     gsp_system_prompt_len, gsp_question_len, output_len, seed)
    if dataset == "custom":
        if not dataset_path:
            raise HarnessError("dataset 'custom' needs --dataset-path FILE.jsonl")
        return custom_prompts(dataset_path, tok, output_len, limit=num_prompts)
    raise HarnessError(f"unknown dataset {dataset!r} (random, shared-prefix, custom)")


def small_bpe_tokenizer(out: str | Path) -> Path:
    """A small byte-level BPE tokenizer (vocab 400) trained offline in ~0.1 s and saved as a
    fast tokenizer in `out`: enough for prompts of exact token lengths against the scripted
    server (tests and the client benchmark), without pulling a model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["The quick brown fox jumps over the lazy dog.",
              "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
              "def f(x): return x * 2 + 1", "Water boils at 100 degrees Celsius."] * 50
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = Path(out)
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(out))
    return out
