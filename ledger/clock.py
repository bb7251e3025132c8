"""Time and identity helpers shared by events and the store."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import orjson


def utcnow() -> datetime:
    return datetime.now(UTC)


def canonical_json(value: object) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace. The basis of every content hash."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def digest(value: object) -> str:
    """sha256 of the canonical JSON of a value, as 'sha256:<hex>'."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
