"""The format of an observation window's samples artifact (the Node Registry's summaries name
one): gzip'd JSON columns `t` (epoch seconds), `cpu` (percent), `mem` (MiB used), and `gpus`
{uuid: {util, mem, procs}}, each GPU column aligned with `t` (null where a sample had no GPU
data). Written by harness/nodes/registry.py, read by the index's projector."""

from __future__ import annotations

import gzip
from typing import Any

import orjson


def encode_samples(columns: dict[str, Any]) -> bytes:
    return gzip.compress(orjson.dumps(columns), compresslevel=6, mtime=0)


def decode_samples(data: bytes) -> dict[str, Any]:
    """The columns back; ValueError when the bytes are not such an artifact."""
    try:
        out = orjson.loads(gzip.decompress(data))
    except (OSError, EOFError, orjson.JSONDecodeError) as e:
        raise ValueError(f"not a samples artifact: {e}") from None
    if not isinstance(out, dict) or not isinstance(out.get("t"), list):
        raise ValueError("not a samples artifact: no `t` column")
    return out
