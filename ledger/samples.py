"""The format of an observation window's samples artifact, named by the Node Registry's
host summaries and the endpoint monitor's summaries: gzip'd JSON columns, `t` (epoch seconds)
first. Hosts: `cpu` (percent), `mem` (MiB used), `gpus` {uuid: {util, mem, procs}}, each GPU
column aligned with `t` (null where a sample had no GPU data). Written through
`append_with_samples` by harness/nodes/registry.py and harness/diagnose/monitor.py, read by
the index's projector."""

from __future__ import annotations

import gzip
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from pydantic import BaseModel

if TYPE_CHECKING:
    from .workspace import Workspace

_E = TypeVar("_E", bound=BaseModel)


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


def append_with_samples(ws: Workspace, stream: str, summary: _E, columns: dict[str, Any]) -> _E:
    """Store a window's samples as an artifact and append `summary` (whose
    `samples_artifact` field names it) to `stream`; the summary as appended comes back.
    Used by the Node Registry's and the endpoint monitor's writers, each for its own stream."""
    art = ws.artifacts.put(encode_samples(columns), verbatim=True)
    ev = summary.model_copy(update={"samples_artifact": art})
    ws.ledger.append(stream, [ev])  # type: ignore[list-item]
    return ev
