"""Reads of recorded profiles (`ProfileCaptured`, written by harness/perf/capture.py) and
the comparison of two of them (`forge perf compare A B`).

A capture is named by its event id or an unambiguous prefix of it (8+ characters shown by
`forge perf capture`). Captures live on the `profiles` stream or on task streams; both are
found through the ledger's type filter. The index holds no profile table yet (that needs an
index schema bump), so comparisons read the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ledger import events as E
from ..ledger.store import Ledger
from .errors import ProjectionError


def captures(ledger: Ledger) -> list[tuple[str, E.ProfileCaptured]]:
    """Every recorded capture, oldest first, with its stream."""
    return [(r.stream, r.event) for r in ledger.events(types=[E.ProfileCaptured.TYPE])
            if isinstance(r.event, E.ProfileCaptured)]


def find_capture(ledger: Ledger, ref: str) -> tuple[str, E.ProfileCaptured]:
    """The capture whose event id is `ref` or starts with it; ProjectionError when none or
    several match."""
    ref = ref.strip().lower()
    if len(ref) < 4:
        raise ProjectionError(f"profile {ref!r}: give at least 4 characters of its event id")
    hits = [(s, ev) for s, ev in captures(ledger) if str(ev.event_id).startswith(ref)]
    if not hits:
        raise ProjectionError(f"no recorded profile {ref!r} (forge perf capture records one)")
    if len(hits) > 1:
        raise ProjectionError(f"profile {ref!r} is ambiguous: {len(hits)} captures match")
    return hits[0]


def running_engine_pid(ledger: Ledger, url: str) -> int | None:
    """The pid recorded by the last `EngineLaunched` at `url` that no `EngineStopped` at
    `url` followed (an engine forge started, e.g. `forge engine up`); None when there is
    none. Whether that process still runs is for the caller to check."""
    url = url.rstrip("/")
    pid = None
    for r in ledger.events(types=[E.EngineLaunched.TYPE, E.EngineStopped.TYPE]):
        ev = r.event
        if isinstance(ev, E.EngineLaunched | E.EngineStopped) and ev.url.rstrip("/") == url:
            pid = ev.pid if isinstance(ev, E.EngineLaunched) else None
    return pid


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Two summaries' top entries side by side (each a mapping with `top`: entries with
    `name` and `share`): one row per name in either, `share_a`, `share_b` (None where absent
    from that top), `delta` = share_b - share_a (absent counted as 0), largest |delta| first,
    then by name."""
    sa = {op["name"]: op["share"] for op in a.get("top", ())}
    sb = {op["name"]: op["share"] for op in b.get("top", ())}
    rows = [{"name": k, "share_a": sa.get(k), "share_b": sb.get(k),
             "delta": round((sb.get(k) or 0.0) - (sa.get(k) or 0.0), 6)}
            for k in set(sa) | set(sb)]
    rows.sort(key=lambda r: (-abs(r["delta"]), r["name"]))
    return rows


def compare_captures(ledger: Ledger, ref_a: str, ref_b: str) -> dict[str, Any]:
    """`forge perf compare`: both captures' headers and the rows of `compare`. Captures of
    different kinds (kernel time vs py-spy samples) are refused: their shares do not measure
    the same thing."""
    (sa, a), (sb, b) = find_capture(ledger, ref_a), find_capture(ledger, ref_b)
    if a.kind != b.kind:
        raise ProjectionError(f"profiles {ref_a} ({a.kind}) and {ref_b} ({b.kind}) rank "
                              "different things; compare captures of one kind")

    def head(stream: str, ev: E.ProfileCaptured) -> dict[str, Any]:
        return {"event_id": str(ev.event_id), "stream": stream, "task_id": ev.task_id,
                "block_id": ev.block_id, "engine": ev.engine, "url": ev.url,
                "method": ev.method, "kind": ev.kind, "unit": ev.unit,
                "total_ms": ev.total_ms, "at": ev.occurred_at.isoformat(),
                "bench": dict(ev.bench)}

    dump = [{"top": [op.model_dump() for op in ev.top]} for ev in (a, b)]
    return {"a": head(sa, a), "b": head(sb, b), "rows": compare(dump[0], dump[1])}
