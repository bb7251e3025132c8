"""ShareGPT-style conversation files as a benchmark dataset (as bench_serving's `sharegpt`).

Contracts:
- A file is a JSON array of conversations, or JSONL with one conversation per line (chosen by
  its first non-blank character: `[` → JSON array). A conversation is an object with
  `conversations: [{"from": "human"|"user"|…, "value": str}, …]` (ShareGPT) or `messages:
  [{"role": …, "content": str}, …]` (OpenAI). The prompt is the first turn's text; the output
  length is the token count of the second turn (the reply), else `default_output_len`.
- Like bench_serving: conversations with fewer than 2 turns are skipped when no default output
  length is given; prompts or replies under 4 tokens are pruned (too short to measure); the
  usable ones are shuffled with `seed` and the first `num_prompts` taken. Fewer usable than
  asked is an error naming both counts (a point's request count is not silently lowered).
- Any malformed entry raises `HarnessError("FILE:LINE: …")` naming the field (JSON arrays:
  `FILE: entry N: …`; invalid JSON: `FILE:LINE:COL: …`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import HarnessError
from .datasets import Prompt, encode_text

MIN_TOKENS = 4


def _entries(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, entry) for each conversation of the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HarnessError(f"dataset file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HarnessError(f"cannot read dataset file {path}: {e}") from None
    if text.lstrip()[:1] == "[":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise HarnessError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        for i, item in enumerate(items):
            yield f"{path}: entry {i}", item
        return
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HarnessError(f"{path}:{no}: invalid JSON: {e.msg} (column {e.colno})") from None
        yield f"{path}:{no}", obj


def _turns(where: str, obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        raise HarnessError(f"{where}: expected a conversation object, got {type(obj).__name__}")
    if "conversations" in obj:
        key, text_key = "conversations", "value"
    elif "messages" in obj:
        key, text_key = "messages", "content"
    else:
        raise HarnessError(f"{where}: field 'conversations' (or 'messages') is missing")
    turns = obj[key]
    if not isinstance(turns, list):
        raise HarnessError(f"{where}: field '{key}' must be a list of turns")
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or not isinstance(t.get(text_key), str):
            raise HarnessError(f"{where}: field '{key}[{i}].{text_key}' must be a string")
        out.append(t[text_key])
    return out


def sharegpt_prompts(path: str | Path, tokenizer, *, num_prompts: int,
                     default_output_len: int | None = None, seed: int = 42) -> list[Prompt]:
    """`num_prompts` prompts from a ShareGPT-style file (module contract)."""
    p = Path(path)
    usable: list[Prompt] = []
    for where, obj in _entries(p):
        turns = _turns(where, obj)
        if not turns or (len(turns) < 2 and default_output_len is None):
            continue
        prompt_len = len(encode_text(tokenizer, turns[0]))
        out_len = len(encode_text(tokenizer, turns[1])) if len(turns) > 1 else default_output_len
        assert out_len is not None
        if prompt_len < MIN_TOKENS or out_len < MIN_TOKENS:
            continue
        usable.append(Prompt(turns[0], prompt_len, out_len))
    if len(usable) < num_prompts:
        raise HarnessError(f"dataset {p} has {len(usable)} usable conversations (prompt and "
                           f"reply of ≥ {MIN_TOKENS} tokens); the point asks for "
                           f"{num_prompts} (traffic.num_prompts)")
    random.Random(seed).shuffle(usable)
    return usable[:num_prompts]
