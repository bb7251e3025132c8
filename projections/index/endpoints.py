"""The index's rows for endpoints (harness/diagnose/): `forge monitor`'s window summaries
(`EndpointSummarized` -> `endpoint_windows`, and its samples artifact loaded into
`endpoint_samples(position, url, t, metric, value)`: one row per scrape and metric, nulls
left out) and `forge diagnose`'s results (`DiagnosisRecorded` -> `diagnoses`, with the names
of the rules that fired). Kept out of projector.py for size; the projector calls these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ...ledger.errors import LedgerError
from ...ledger.samples import decode_samples
from .dims import as_float, as_int

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa


@dataclass
class EndpointBatch:
    windows: list[tuple[Any, ...]] = field(default_factory=list)
    samples: dict[str, list[Any]] = field(default_factory=lambda: {
        k: [] for k in ("position", "url", "t", "metric", "value")})
    diagnoses: list[tuple[Any, ...]] = field(default_factory=list)


def on_summary(b: EndpointBatch, artifacts: Callable[[str], bytes] | None, pos: int,
               d: dict[str, Any]) -> None:
    url, art = d.get("url"), d.get("samples_artifact")
    loaded = bool(art) and artifacts is not None and _load(b, artifacts, pos, str(url),
                                                             str(art))
    b.windows.append((pos, url, d.get("start"), d.get("end"), as_float(d.get("interval_s")),
                      as_int(d.get("samples")), as_int(d.get("missed")), as_int(d.get("errors")),
                      d.get("last_error"), _slo(d.get("slo_ms")), art, loaded))


def _slo(v: Any) -> str | None:
    if not isinstance(v, dict) or not v:
        return None
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def _load(b: EndpointBatch, artifacts: Callable[[str], bytes], pos: int, url: str,
          art: str) -> bool:
    try:
        cols = decode_samples(artifacts(art))
        t = [int(x * 1_000_000) for x in cols["t"]]
        s = b.samples
        for metric, values in (cols.get("metrics") or {}).items():
            for ti, v in zip(t, values, strict=True):
                if v is not None:
                    s["position"].append(pos)
                    s["url"].append(url)
                    s["t"].append(ti)
                    s["metric"].append(metric)
                    s["value"].append(float(v))
        return True
    except (OSError, LedgerError, ValueError, KeyError, TypeError):
        return False  # missing or unreadable artifact: the window row says so


def on_diagnosis(b: EndpointBatch, pos: int, d: dict[str, Any]) -> None:
    get = d.get
    fired = [str(f.get("rule")) for f in (get("findings") or []) if isinstance(f, dict)]
    b.diagnoses.append((pos, get("event_id"), get("occurred_at"), get("task_id"),
                        get("block_id"), get("url"), as_int(get("samples")),
                        bool(get("healthy")), fired))


def ops(b: EndpointBatch) -> list[tuple[Any, ...]]:
    """("insert", table, arrow) steps for the batch."""
    import pyarrow as pa

    out: list[tuple[Any, ...]] = []
    ts, s, i, f = pa.timestamp("us", tz="UTC"), pa.string(), pa.int64(), pa.float64()
    if b.windows:
        out.append(("insert", "endpoint_windows", _cols(b.windows, [
            ("position", i), ("url", s), ("start_at", s), ("end_at", s), ("interval_s", f),
            ("samples", i), ("missed", i), ("errors", i), ("last_error", s), ("slo_ms", s),
            ("samples_artifact", s), ("samples_loaded", pa.bool_())])))
    if b.samples["t"]:
        c = b.samples
        out.append(("insert", "endpoint_samples", pa.table({
            "position": pa.array(c["position"], i), "url": pa.array(c["url"], s),
            "t": pa.array(c["t"], ts), "metric": pa.array(c["metric"], s),
            "value": pa.array(c["value"], f)})))
    if b.diagnoses:
        out.append(("insert", "diagnoses", _cols(b.diagnoses, [
            ("position", i), ("event_id", s), ("occurred_at", s), ("task_id", s),
            ("block_id", s), ("url", s), ("samples", i), ("healthy", pa.bool_()),
            ("rules_fired", pa.list_(s))])))
    return out


def _cols(rows: list[tuple[Any, ...]], spec: list[tuple[str, pa.DataType]]) -> pa.Table:
    import pyarrow as pa

    cols = list(zip(*rows, strict=True))
    return pa.table({n: pa.array([None if v is None else (str(v) if t == pa.string() else v)
                                  for v in col], t)
                     for (n, t), col in zip(spec, cols, strict=True)})
