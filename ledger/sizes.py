"""Sizes of what comes from outside (a command's output, an agent's arguments, a handoff's
findings): every such field is bounded before it is recorded.

Contract:
- `truncated(size, sha256)`: the mark left where something was cut,
  `…[truncated: <size> bytes, sha256:<hex digest of the whole>]`: how much there was and
  which bytes, so the whole can still be recognised (and its artifact, when one was kept).
- `capped(text, limit)`: `text` when its UTF-8 is at most `limit` bytes, else its head
  (cut on a character boundary) followed by the mark; at most `limit` + ~100 bytes.
- `tail(text, limit)`: `text` and 0 when its UTF-8 is at most `limit` bytes, else its last
  `limit` bytes (cut on a character boundary) and how many bytes came before them (what an
  agent reads back of a command's output: the end matters most).
- `capped_json(value, limit)`: a JSON-shaped value as it is when its JSON text is at most
  `limit` bytes, else `{"truncated": capped(<its JSON text>, limit)}`.
- `handoff_problem(...)`: why a handoff's text is too large to record (one line naming the
  field and its size), or None. Limits: `STATE_CHARS`, `FINDING_CHARS` per finding,
  `MAX_FINDINGS`, `NEXT_CHARS`.
- `MAX_ARTIFACT_BYTES`: the largest file stored from a place a call could write (a measure's
  `--artifact`, a graph node's deliverable): `ArtifactStore.put_file(limit=)` refuses more
  before reading it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

STATE_CHARS = 4000
FINDING_CHARS = 4000
MAX_FINDINGS = 50
NEXT_CHARS = 2000
MAX_ARTIFACT_BYTES = 1 << 30  # a file stored from where a call could write (a deliverable)


def truncated(size: int, sha256: str) -> str:
    return f"…[truncated: {size} bytes, sha256:{sha256}]"


def capped(text: str, limit: int) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    head = data[:limit].decode("utf-8", "ignore")
    return head + truncated(len(data), hashlib.sha256(data).hexdigest())


def tail(text: str, limit: int) -> tuple[str, int]:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, 0
    kept = data[-limit:].decode("utf-8", "ignore")  # a character cut in two is left out
    return kept, len(data) - len(kept.encode("utf-8", "surrogatepass"))


def capped_json(value: Any, limit: int) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    if len(text.encode("utf-8", "surrogatepass")) <= limit:
        return value
    return {"truncated": capped(text, limit)}


def handoff_problem(state_reached: str, findings: list[str] | tuple[str, ...],
                    next_sub_goal: str | None) -> str | None:
    if len(state_reached) > STATE_CHARS:
        return f"state reached is {len(state_reached)} characters (at most {STATE_CHARS})"
    if len(findings) > MAX_FINDINGS:
        return f"{len(findings)} findings (at most {MAX_FINDINGS})"
    for i, f in enumerate(findings, 1):
        if len(f) > FINDING_CHARS:
            return f"finding {i} is {len(f)} characters (at most {FINDING_CHARS} each)"
    if next_sub_goal is not None and len(next_sub_goal) > NEXT_CHARS:
        return f"next sub-goal is {len(next_sub_goal)} characters (at most {NEXT_CHARS})"
    return None
