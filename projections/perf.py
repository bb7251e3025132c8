"""Reads of recorded profiles (`ProfileCaptured`, written by harness/perf/capture.py) and
the comparison of two of them (`forge perf compare A B`).

A capture is named by its event id or an unambiguous prefix of it (8+ characters shown by
`forge perf capture`). Captures live on the `profiles` stream or on task streams; both are
found through the ledger's type filter. The index holds no profile table yet (that needs an
index schema bump), so comparisons read the ledger.

Kernel by kernel: `compare_phases` lines up two captures' per-phase tables (ProfileCaptured
`phases`, harness/perf/phases.py). The basis is time per output token of each window when both
captures know their output tokens (windows of different lengths compare), else total time.
Rows: per phase, one per name in either table, largest absolute delta first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


PHASE_ORDER = {"prefill": 0, "decode": 1}


def compare_phases(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
                   ) -> dict[str, Any]:
    """Two captures' phases (each `{name, total_ms, per_token_ms, top: [{name, count,
    total_ms, mean_ms, share, per_token_ms}]}`) side by side: `basis` ("ms per output token"
    when every phase of both has `per_token_ms`, else "ms"), and per phase in either
    (prefill, decode, then by name) its totals `a`, `b`, `delta` and `rows`: `{name, a, b,
    delta, rel, calls_a, calls_b, mean_ms_a, mean_ms_b, share_a, share_b}`, None where the
    entry is not in that capture's table (its delta counts it as 0), `rel` = delta / a (None
    when a is absent or 0), largest |delta| first, then by name."""
    phases = [ph for side in (a, b) for ph in side]
    per_token = bool(phases) and all(ph.get("per_token_ms") is not None for ph in phases)
    key = "per_token_ms" if per_token else "total_ms"

    def total(ph: Mapping[str, Any] | None) -> float | None:
        return None if ph is None else ph.get(key)

    pa = {ph["name"]: ph for ph in a}
    pb = {ph["name"]: ph for ph in b}
    names = sorted(set(pa) | set(pb), key=lambda n: (PHASE_ORDER.get(n, 2), n == "other", n))
    out = []
    for name in names:
        ta = {op["name"]: op for op in (pa.get(name) or {}).get("top", ())}
        tb = {op["name"]: op for op in (pb.get(name) or {}).get("top", ())}
        rows = []
        for k in set(ta) | set(tb):
            oa, ob = ta.get(k), tb.get(k)
            va = oa[key] if oa else None
            vb = ob[key] if ob else None
            delta = round((vb or 0.0) - (va or 0.0), 6)
            rows.append({"name": k, "a": va, "b": vb, "delta": delta,
                         "rel": round(delta / va, 6) if va else None,
                         "calls_a": oa["count"] if oa else None,
                         "calls_b": ob["count"] if ob else None,
                         "mean_ms_a": oa["mean_ms"] if oa else None,
                         "mean_ms_b": ob["mean_ms"] if ob else None,
                         "share_a": oa["share"] if oa else None,
                         "share_b": ob["share"] if ob else None})
        rows.sort(key=lambda r: (-abs(r["delta"]), r["name"]))
        sa, sb = total(pa.get(name)), total(pb.get(name))
        out.append({"name": name, "a": sa, "b": sb,
                    "delta": round((sb or 0.0) - (sa or 0.0), 6), "rows": rows})
    return {"basis": "ms per output token" if per_token else "ms", "phases": out}


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
    out: dict[str, Any] = {"a": head(sa, a), "b": head(sb, b),
                           "rows": compare(dump[0], dump[1])}
    if a.phases and b.phases:
        out.update(compare_phases([ph.model_dump() for ph in a.phases],
                                  [ph.model_dump() for ph in b.phases]))
    else:  # a capture from before phases, or py-spy's: the shares of the top lists only
        out.update({"basis": None, "phases": []})
    return out


def format_phases(out: Mapping[str, Any], per_phase: int = 15) -> str:
    """The phase tables of `compare_captures`' answer, `per_phase` rows each."""
    us = out["basis"] == "ms per output token"
    unit = "us/token" if us else "ms"
    scale = 1000.0 if us else 1.0

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v * scale:.2f}"

    lines = []
    for ph in out["phases"]:
        lines.append(f"phase {ph['name']} ({unit}): A {fmt(ph['a'])}  B {fmt(ph['b'])}  "
                     f"delta {ph['delta'] * scale:+.2f}")
        for r in ph["rows"][:per_phase]:
            rel = "" if r["rel"] is None else f" ({r['rel'] * 100:+.1f} %)"
            calls = f"{r['calls_a'] if r['calls_a'] is not None else '-'}->" \
                    f"{r['calls_b'] if r['calls_b'] is not None else '-'}"
            lines.append(f"  {fmt(r['a']):>10}  {fmt(r['b']):>10}  "
                         f"{r['delta'] * scale:+10.2f}{rel:<12} {calls:>11}  {r['name']}")
    return "\n".join(lines)
