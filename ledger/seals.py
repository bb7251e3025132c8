"""A save's seal: what its marker (`CommandHandled.seal`) says its events were, as stored.

Standard library and orjson only: the index's catch-up (`projections/index/`), `forge check`
and the read commands that print stored payloads without the event models
(`projections/fast_reads.py`) check rows against it without loading pydantic.

- `seal(topics, states)`: sha256 over a save's types, then their stored payloads, in the
  order stored. Newlines separate both: no type name holds one and orjson never writes
  one, so no other split of the same rows gives the same bytes.
- `sealed_rows(rows)`: per row `(position, stream, version, type, state)` of a run of
  consecutive rows, 1 where its save's marker follows in the run with a matching seal: the
  type and payload are exactly what the codec's `encode` wrote.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

MARKER_TYPE = "CommandHandled"  # ledger/events.py: the marker closing every save


def seal(topics: Sequence[str], states: Sequence[bytes]) -> str:
    """The seal a save's marker carries (module contract)."""
    h = hashlib.sha256("\n".join(topics).encode())
    h.update(b"\0")
    h.update(b"\n".join(states))
    return "sha256:" + h.hexdigest()


def sealed_rows(rows: Sequence[tuple[Any, ...]]) -> bytearray:
    """Per row of `rows`, 1 when its save's marker (`CommandHandled`, after the save's
    events) is among the rows and carries a seal equal to `seal` of the rows just before
    it: their types and payloads are exactly what the codec wrote. Anything else (no seal,
    a save cut by the run's start, rows changed or moved since) stays 0."""
    marks = bytearray(len(rows))
    at = [i for i, r in enumerate(rows) if r[3] == MARKER_TYPE]
    for i in at:
        try:
            d = orjson.loads(rows[i][4])
            n = sum(last - first + 1 for first, last in d["appended"].values())
            mark = d["seal"]
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            continue  # an unsealed (v1) or malformed marker: its save is checked
        if type(mark) is str and type(n) is int and 0 < n <= i:
            save = rows[i - n:i]  # a few rows: no transpose of the whole run
            if seal([r[3] for r in save], [r[4] for r in save]) == mark:
                marks[i - n:i] = b"\x01" * n
    return marks
