"""The journal's compare view: for each task with two measured blocks, its baseline block
beside its accepted (else best) block (`projections.comparison.task_pairs`), and an index of
them (`compare`).

Each page, in the order people read: what differed (the deployment point's dimensions), the
gated metrics (each side's median with its 95 % interval, the delta and the ratio with its
interval, which side is better, each side's verdicts), the accuracy items that changed (per
accuracy gate both blocks recorded: lost, gained, whether the same documents), the latency
distributions (TTFT, ITL, E2E as overlaid CDFs with their percentiles; the runs without
per-request records named), then the other metrics. Built from
`projections.comparison.comparison`: the same index and artifacts give the same pages. At
most MAX_PAGES pairs, the latest tasks first.

Kept between builds (the wiki's `_compare.json`): each task's comparison with the ledger
position of its last event; a task with no event since is not compared again (a comparison
reads only the task's own events and immutable artifacts). A damaged file is ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ledger.numbers import json_safe
from ..ledger.titles import dimension_value
from ..projections.comparison import LATENCIES, Read, comparison, task_pairs
from .files import write_if_changed
from .page import Page, link, page_name, strong, text
from .pages import task_path
from .plot import Cdf, PlotCache

if TYPE_CHECKING:
    import duckdb

INDEX = "compare"
CACHE_VERSION = 2  # bump when a comparison's shape changes: kept ones are computed again
MAX_PAGES = 200  # pairs drawn (a comparison, ~40 ms, and 3 CDFs each); the index says when
# more exist
UNITS = {"ttft_ms": ("TTFT", "ms", "fraction of requests ≤ x"),
         "itl_ms": ("ITL", "ms", "fraction of token gaps ≤ x"),
         "e2e_ms": ("E2E latency", "ms", "fraction of requests ≤ x")}


def compare_path(task_id: str) -> str:
    return f"compare/{page_name(task_id)}"


def num(v: Any) -> str:
    """A number for a cell: thousands separated above 1000, four significant digits below,
    never in e-notation; "—" for none."""
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return "—" if v is None else str(v)
    if not math.isfinite(v):
        return "—"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 1 or a == 0:
        return f"{v:.4g}" if "e" not in f"{v:.4g}" else f"{v:.0f}"
    digits = max(0, 3 - math.floor(math.log10(a)))  # four significant digits
    return f"{v:.{digits}f}".rstrip("0").rstrip(".") or "0"


def _ci(lo: Any, hi: Any) -> str:
    # An en dash between the bounds: a comma would read as a thousands separator.
    return f"[{num(lo)} – {num(hi)}]" if lo is not None and hi is not None else ""


def _pct(v: Any) -> str:
    return "—" if v is None else f"{'+' if v > 0 else ''}{num(v)} %"


BETTER = {"a": "A", "b": "B", "same": "same", None: "—"}


def _metric_rows(rows: list[dict[str, Any]], gated: bool) -> list[tuple]:
    out = []
    for r in rows:
        ratio = "—" if r["ratio"] is None else f"{num(r['ratio'])}× {_ci(*r['ratio_ci'])}"
        noise = {True: "yes", False: "no (within noise)", None: "—"}[r["beyond_noise"]]
        cells: list[Any] = [r["metric"]]
        if gated:
            cells.append(", ".join(r.get("gates", [])))
        cells += [f"{num(r['a'])} {_ci(*r['a_ci'])}".strip() + f" (n {r['a_n']})",
                  f"{num(r['b'])} {_ci(*r['b_ci'])}".strip() + f" (n {r['b_n']})",
                  f"{num(r['delta'])} ({_pct(r['delta_pct'])})", ratio]
        if gated:
            v = r.get("verdicts", {})
            cells += [BETTER[r["better"]], noise,
                      ", ".join(f"{k}: {x}" for k, x in v.get("a", {}).items()) or "—",
                      ", ".join(f"{k}: {x}" for k, x in v.get("b", {}).items()) or "—"]
        out.append(tuple(cells))
    return out


def _dimension(name: str) -> str:
    return "candidate" if name == "candidate_key" else name


def compare_page(cmp: dict[str, Any], pair: dict[str, Any], position: int,
                 plots: PlotCache) -> Page:
    """One pair's page from its comparison."""
    tid, a, b = pair["task_id"], pair["a"], pair["b"]
    role = "accepted block" if pair["b_is"] == "accepted" else "best other block"
    p = Page(compare_path(tid), "compare", f"Compare {tid}: {a} (baseline) vs {b} ({role})",
             position=position, summary=f"{tid}: baseline block {a} against {role} {b}",
             meta={"task_id": tid, "a": a, "b": b, "b_is": pair["b_is"]})
    p.add("p", text(strong("A:"), f" block {a} of ", link(task_path(tid), tid),
                    " (its baseline). ", strong("B:"), f" block {b} ({role})."))
    p.add("h", "What differed")
    diff = cmp["differing_dimensions"]
    if diff:
        p.add("table", ["dimension", "A", "B"],
              [(_dimension(d["dimension"]), dimension_value(d["dimension"], d["a"]) or "—",
                dimension_value(d["dimension"], d["b"]) or "—") for d in diff])
    else:
        p.add("p", "Nothing: the same deployment point and candidate.")
    p.add("h", "Gated metrics")
    if cmp["gated"]:
        p.add("table", ["metric", "gates", "A median [95 % CI]", "B median [95 % CI]",
                        "B − A (%)", "B / A [95 % CI]", "better", "beyond noise",
                        "verdicts A", "verdicts B"], _metric_rows(cmp["gated"], True))
    else:
        p.add("p", "No gate names a metric of these blocks.")
    if cmp.get("accuracy"):
        _accuracy_section(p, cmp["accuracy"])
    p.add("h", "Latency distributions")
    lat = cmp["latency"]
    rows = []
    for key, _ in LATENCIES:
        name, unit, ylabel = UNITS[key]
        da, db = lat[key]["a"], lat[key]["b"]
        series = [Cdf(f"{side} {blk} (n {d['n']})", tuple((x, f) for x, f in d["cdf"]))
                  for side, blk, d in (("A", a, da), ("B", b, db)) if d["cdf"]]
        if series:
            svg = plots.cdf_svg(series, xlabel=f"{name} ({unit})", ylabel=ylabel,
                                title=f"{tid}: {name} CDF, {a} vs {b}")
            if svg:
                p.add("svg", svg)
        rows += [(f"{name} ({unit})", side, d["n"], num(d["p50"]), num(d["p90"]),
                  num(d["p99"]), num(d["mean"])) for side, d in (("A", da), ("B", db))]
    p.add("table", ["latency", "side", "n", "p50", "p90", "p99", "mean"], rows)
    missing = [(side.upper(), m["run_id"], m["why"])
               for side in ("a", "b") for m in lat["missing"][side]]
    runs = lat["runs"]
    p.add("p", f"Per-request records: A {runs['a']['with_records']} of {runs['a']['runs']} "
               f"runs, B {runs['b']['with_records']} of {runs['b']['runs']} runs.")
    if missing:
        p.add("table", ["side", "run", "missing because"], missing)
    p.add("h", "Other metrics")
    if cmp["other_metrics"]:
        p.add("table", ["metric", "A median [95 % CI]", "B median [95 % CI]", "B − A (%)",
                        "B / A [95 % CI]"], _metric_rows(cmp["other_metrics"], False))
    else:
        p.add("p", "(none)")
    return p


SHOWN_ITEMS = 20  # item ids listed per gate and direction; the counts say the rest


def _ids(ids: list[Any]) -> str:
    more = f" … ({len(ids) - SHOWN_ITEMS} more)" if len(ids) > SHOWN_ITEMS else ""
    return ", ".join(str(i) for i in ids[:SHOWN_ITEMS]) + more if ids else "—"


def _accuracy_section(p: Page, rows: list[dict[str, Any]]) -> None:
    """Which accuracy items changed from A to B (projections.comparison.accuracy_changes)."""
    p.add("h", "Accuracy items")
    p.add("table", ["gate", "items", "A accuracy", "B accuracy", "lost", "gained",
                    "unchanged", "same documents"],
          [(r["gate"], r["items"], num(r["accuracy_a"]), num(r["accuracy_b"]),
            len(r["lost"]), len(r["gained"]), r["unchanged"],
            {True: "yes", False: "NO: not paired"}.get(r["same_documents"], "unknown"))
           for r in rows])
    p.add("table", ["gate", "lost (right in A, wrong in B)", "gained"],
          [(r["gate"], _ids(r["lost"]), _ids(r["gained"])) for r in rows])


def _kept(path: Path | None) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path else {}
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("v") == CACHE_VERSION \
        and isinstance(data.get("tasks"), dict)
    return data["tasks"] if ok else {}


def compare_pages(con: duckdb.DuckDBPyConnection, read: Read, position: int,
                  plots: PlotCache, cache: Path | None = None) -> list[Page]:
    """The pair pages and their index (nothing when no task has two measured blocks);
    comparisons kept in `cache` (see the module)."""
    pairs = task_pairs(con)
    if not pairs:
        return []
    # A page reflects its task's events (measurements, verdicts, decisions): its position.
    last = dict(con.execute("SELECT task_id, max(position) FROM events "
                            "WHERE task_id IS NOT NULL GROUP BY ALL").fetchall())
    shown = sorted(sorted(pairs, key=lambda x: -(last.get(x["task_id"]) or 0))[:MAX_PAGES],
                   key=lambda x: x["task_id"])
    kept, now = _kept(cache), {}
    pages = []
    for pair in shown:
        tid = pair["task_id"]
        at = last.get(tid) or position
        k = kept.get(tid)
        if isinstance(k, dict) and k.get("at") == at and k.get("pair") == pair:
            cmp = k["cmp"]
        else:  # as JSON keeps it: a kept comparison and a new one draw the same page
            cmp = json.loads(json.dumps(json_safe(
                comparison(con, f"{tid}/{pair['a']}", f"{tid}/{pair['b']}", read)),
                allow_nan=False))
        now[tid] = {"at": at, "pair": pair, "cmp": cmp}
        pages.append(compare_page(cmp, pair, at, plots))
    if cache is not None:
        write_if_changed(cache, json.dumps({"v": CACHE_VERSION, "tasks": now},
                                           sort_keys=True, separators=(",", ":")))
    idx = Page(INDEX, "index", "Compare blocks", position=max(p.position for p in pages),
               summary=f"{len(pairs)} tasks: baseline block against accepted or best block")
    idx.add("p", "Each task's baseline block side by side with its accepted block (else its "
                 "best other block by its primary metric): what differed, the gated metrics "
                 "with intervals and deltas, and the latency distributions. In the terminal: "
                 "forge compare TASK/BLOCK TASK/BLOCK.")
    by_task = {p.meta["task_id"]: p for p in pages}
    idx.add("table", ["task", "A", "B", "B is", "compare"],
            [(link(task_path(x["task_id"]), x["task_id"]), x["a"], x["b"], x["b_is"],
              link(by_task[x["task_id"]].path, f"{x['a']} vs {x['b']}"))
             for x in shown])
    if len(pairs) > len(shown):
        idx.add("p", f"{len(pairs) - len(shown)} older tasks are not drawn (at most "
                     f"{MAX_PAGES}); forge compare shows any of them.")
    return [idx, *pages]
