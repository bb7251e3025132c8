"""The journal's history view: one page per deployment point (its runtime profile's revision
left out) with its primary metric block after block, across profile revisions and code
snapshots (`projections.history`), and an index of them (`history`).

A page: a plot of the metric's median per block in ledger order (x: the block's place in the
series; colour and shape: the decision on it, accepted changes marked; shape: the runtime
profile when the series has several) and a table of the same points with when each was
measured (UTC), its profile, code snapshot, candidate and runs. Deterministic: the same index
gives the same pages.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from ..projections.history import history
from .compare_page import num
from .page import Page, link, page_name, strong, text
from .pages import task_path
from .plot import PlotCache, Point

if TYPE_CHECKING:
    import duckdb

INDEX = "history"
MAX_PAGES = 500


def series_title(key: dict[str, Any]) -> str:
    count = f"{key['accelerator_count']}× " if key.get("accelerator_count") else ""
    parts = [str(key.get("model") or "?"), f"{key.get('service') or '?'} profile",
             f"on {count}{key.get('accelerator') or '?'}",
             ", ".join(str(key[d]) for d in ("architecture", "parallelism", "scenario")
                       if key.get(d))]
    return " · ".join(p for p in parts if p)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def history_path(key: dict[str, Any]) -> str:
    # The dimensions' digest keeps two series apart whose readable parts agree.
    h = hashlib.sha256(repr(sorted(key.items(), key=lambda kv: kv[0])).encode()).hexdigest()
    service = key.get("service") or "point"
    return f"history/{page_name(f'{service}-{h[:12]}')}"


def history_page(s: dict[str, Any], plots: PlotCache) -> Page:
    key, metric, pts = s["key"], s["metric"], s["points"]
    title = f"History: {series_title(key)}"
    way = {"higher": "higher is better", "lower": "lower is better"}.get(s["direction"] or "",
                                                                         "no direction stated")
    at = max(max(x["position"], x["decided_position"] or 0) for x in pts)
    p = Page(history_path(key), "history", title, position=at,
             summary=f"{metric} over {len(pts)} blocks of {len(s['tasks'])} tasks",
             meta={"metric": metric, **{k: v for k, v in key.items() if v is not None}})
    profiles = sorted({rp for x in pts for rp in x["runtime_profiles"]})
    snaps = sorted({sn for x in pts for sn in x["repo_snapshots"]})
    p.add("p", text(strong("Metric:"), f" {metric} (median of each block's runs; {way}). ",
                    f"{_n(len(pts), 'block')}, {_n(len(profiles), 'runtime profile revision')} "
                    f"({', '.join(profiles) or 'none'}), {_n(len(snaps), 'code snapshot')}."))
    p.add("table", ["dimension", "value"], [(k, "—" if v is None else str(v))
                                            for k, v in key.items()])
    svg = plots.order_svg(
        [Point(i, x["median"], x["block_id"], x["verdict"],
               ", ".join(x["runtime_profiles"]) or "—") for i, x in enumerate(pts, start=1)],
        xlabel="measured block, in ledger order", ylabel=metric,
        title=f"{metric} across profile revisions and code")
    if svg:
        p.add("svg", svg)
    p.add("h", "Blocks")
    p.add("table", ["#", "measured at (UTC)", "task / block", "runtime profile", "code snapshot",
                    "candidate", metric, "runs", "decision"],
          [(i, (x["at"] or "—")[:19].replace("T", " "),
            text(link(task_path(x["task_id"]), x["task_id"]), f" / {x['block_id']}"),
            ", ".join(x["runtime_profiles"]) or "—",
            ", ".join(sn.removeprefix("sha256:")[:12] for sn in x["repo_snapshots"]) or "—",
            "baseline" if x["candidate"] in (None, "{}") else x["candidate"],
            num(x["median"]), x["n"], x["verdict"])
           for i, x in enumerate(pts, start=1)])
    return p


def history_pages(con: duckdb.DuckDBPyConnection, plots: PlotCache) -> list[Page]:
    """The series' pages and their index (nothing when nothing was measured in a task)."""
    series = history(con)
    if not series:
        return []
    shown = sorted(series, key=lambda s: -s["points"][-1]["position"])[:MAX_PAGES]
    pages = [history_page(s, plots) for s in shown]
    idx = Page(INDEX, "index", "Deployment point history",
               position=max(p.position for p in pages),
               summary=f"{len(series)} deployment points: a metric across profile revisions "
                       "and code snapshots")
    idx.add("p", "Each deployment point (its runtime profile's revision left out) with its "
                 "primary metric block after block; accepted changes marked.")
    idx.add("table", ["deployment point", "metric", "blocks", "accepted", "last measured (UTC)"],
            [(link(pg.path, series_title(s["key"])), s["metric"], len(s["points"]),
              sum(x["verdict"] == "accepted" for x in s["points"]),
              (s["points"][-1]["at"] or "—")[:19].replace("T", " "))
             for pg, s in zip(pages, shown, strict=True)])
    if len(series) > len(shown):
        idx.add("p", f"{len(series) - len(shown)} older points are not drawn (at most "
                     f"{MAX_PAGES}).")
    return [idx, *pages]
