"""Data policy: prompts and responses of class `production` are not stored, only described.

Contracts:
- Classes: `public`, `internal`, `production`. `class_of(ws, url=, dataset=, dataset_path=)`
  is the strictest class that applies: an endpoint in `[guard] production_endpoints` is
  `production`; `[data.classes]` maps dataset names (the dataset's name, its file's path as
  given, absolute, its file name or stem) and endpoints (a URL prefix or `host[:port]`, as the
  production guard matches them) to a class. Nothing named: `internal`.
- `stores_text(ws, cls)`: prompts and responses of `cls` may be stored: every class but
  `production`, which only with `[data] store_production = true`.
- `scrub(records, cls, allow=False)` is pure: for `production` (unless `allow`), each
  record's text fields (`TEXT_KEYS`: prompt, generated_text, text, messages, content,
  response, token_ids, output_ids) are emptied (same type: "" or []) and described by
  `<key>_chars` (characters; items for a list) and `<key>_sha256`; the record gets
  `data_class: production`. Other fields (lengths in tokens, timings, errors) are kept. Any
  other class: copies, unchanged.
- `scrub_json(value)`: a JSON value (a model request or response) with every string
  replaced by `{"chars", "sha256"}`, except the values of structural keys (`KEEP_KEYS`: role,
  model, finish_reason, object, type, name, id); numbers (token usage), booleans and shape
  are kept.
- `describe(texts)`: count, lengths and digests of a list of texts.
Digests are sha256 of the UTF-8 text (of canonical JSON for a non-string).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...ledger.workspace import Workspace
from .production import endpoint_matches, is_production

CLASSES = ("public", "internal", "production")
DEFAULT_CLASS = "internal"
TEXT_KEYS = ("prompt", "generated_text", "text", "messages", "content", "response",
             "token_ids", "output_ids")
KEEP_KEYS = frozenset({"role", "model", "finish_reason", "object", "type", "name", "id"})
PRODUCTION = "production"


def _rank(cls: str) -> int:
    return CLASSES.index(cls) if cls in CLASSES else CLASSES.index(DEFAULT_CLASS)


def strictest(classes: Iterable[str]) -> str:
    return max(classes, key=_rank, default=DEFAULT_CLASS)


def class_of(ws: Workspace, *, url: str | None = None, dataset: str | None = None,
             dataset_path: str | Path | None = None) -> str:
    """The class of a dataset and/or endpoint (module contract)."""
    table: Mapping[str, str] = ws.config.settings.data.classes
    found: list[str] = []
    names: list[str] = [dataset] if dataset else []
    if dataset_path:
        p = Path(dataset_path)
        names += [str(dataset_path), str(p.expanduser().resolve()), p.name, p.stem]
    found += [table[n] for n in names if n in table]
    if url:
        if is_production(ws, url):
            found.append(PRODUCTION)
        found += [c for key, c in table.items() if _is_endpoint_key(key)
                  and endpoint_matches(key, url, f"forge.toml: data.classes.{key}")]
    return strictest(found) if found else DEFAULT_CLASS


def _is_endpoint_key(key: str) -> bool:
    """A `[data.classes]` key that names an endpoint: a URL, or a host with a port or a dot
    (plain names are datasets)."""
    if "://" in key:
        return True
    host, _, port = key.rpartition(":")
    return (bool(host) and port.isdigit()) or ("." in key and "/" not in key
                                               and not key.endswith((".jsonl", ".json")))


def stores_text(ws: Workspace, cls: str) -> bool:
    return cls != PRODUCTION or ws.config.settings.data.store_production


def _sha(value: Any) -> str:
    data = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def scrub(records: Iterable[Mapping[str, Any]], cls: str, *, allow: bool = False,
          keys: Sequence[str] = TEXT_KEYS) -> list[dict[str, Any]]:
    """Records fit to store under class `cls` (module contract)."""
    if cls != PRODUCTION or allow:
        return [dict(r) for r in records]
    out = []
    for r in records:
        row = dict(r)
        for k in keys:
            if k not in row or row[k] is None:
                continue
            v = row[k]
            row[k] = [] if isinstance(v, list) else "" if isinstance(v, str) else None
            row[f"{k}_chars"] = len(v) if isinstance(v, str | list) else len(_canonical(v))
            row[f"{k}_sha256"] = _sha(v)
        row["data_class"] = PRODUCTION
        out.append(row)
    return out


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def scrub_json(value: Any, _key: str | None = None) -> Any:
    """`value` with its free text replaced by lengths and digests (module contract)."""
    if isinstance(value, str):
        if _key in KEEP_KEYS:
            return value
        return {"chars": len(value), "sha256": _sha(value)}
    if isinstance(value, Mapping):
        return {k: scrub_json(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_json(v, _key) for v in value]
    return value


def describe(texts: Sequence[str]) -> dict[str, Any]:
    """What is kept of texts that are not: count, lengths (characters) and sha256 digests."""
    return {"data_class": PRODUCTION, "count": len(texts), "chars": [len(t) for t in texts],
            "sha256": [_sha(t) for t in texts]}


def for_storage(ws: Workspace, value: Any, cls: str) -> Any:
    """A JSON value as it may be stored under class `cls`: as is, or `scrub_json`ed with
    `data_class: production` added at the top of a mapping."""
    if stores_text(ws, cls):
        return value
    out = scrub_json(value)
    return {"data_class": PRODUCTION, **out} if isinstance(out, dict) else out
