"""Deterministic pages from the index: one per task, deployment point, runtime profile, model
and decision; an index page per dimension; the home page and log.md (chronological).

`snapshot.load(con)` reads everything the pages need in a few bulk queries (a `Snapshot`);
`make_pages(snap)` is then a pure function of it: the same index gives the same pages (a
`PlotCache` only saves drawing the same plot again).

Throughput-vs-TTFT plots: one point per (task, block, candidate), labelled by its block,
coloured and shaped by its verdict (the task's decision on that block, else baseline for the
empty candidate, else unjudged); the TTFT SLO and throughput floor of the deployment point
(`scenario.slo`) and the task's absolute gates on those two metrics are drawn as lines.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

import orjson

from ..ledger.titles import candidate_title_of_key, task_title
from .artifacts import artifact_path
from .numbers import count, exact, metric_value, number
from .page import Page, Text, code, join, link, page_name, slug, sort_key, strong, text
from .plot import Line, PlotCache, Point
from .snapshot import Snapshot

DIMENSION_PAGES = [  # (column, title)
    ("model", "Models"), ("task_type", "Task types"), ("accelerator", "Accelerators"),
    ("engine", "Engines"), ("architecture", "Architectures"), ("parallelism", "Parallelism"),
    ("runtime_profile", "Runtime profiles"), ("scenario", "Scenarios"),
]
FACETS = ("model", "task_type", "accelerator", "engine", "runtime_profile")
NAV = [("index", "Home"), ("log", "Log"), ("search", "Search")] + [
    (f"dims/{slug(c)}", t) for c, t in DIMENSION_PAGES[:5]]
TRADEOFF_X, TRADEOFF_Y = "median_ttft_ms", "output_throughput"
MAX_LINES = 4  # SLO and gate lines on one plot; a page over tasks with more draws none


def facet_text(facets: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(facets.items()) if v)


def task_text(t: dict[str, Any]) -> str:
    """What a task is about, for embeddings (the wiki's related pages and retrieve)."""
    return (f"{t['title'] or t['task_id']}. {t['task_type']} task: {t['goal']}. "
            f"{facet_text({k: t.get(k) for k in FACETS})}")


def decision_text(d: dict[str, Any]) -> str:
    return (f"{d['kind']} direction {_cand(d['candidate_key'])}: {d['reason'] or ''}. "
            f"{facet_text({k: d.get(k) for k in FACETS})}")


# --- paths ------------------------------------------------------------------------------


# Every page name goes through `page_name` (injective; see page.py), so two tasks, models or
# profiles never share a page. Graph pages: graphs.py; the graph index is `graphs` (top level),
# so no graph id can take its place.


def task_path(tid: str) -> str:
    return f"tasks/{page_name(tid)}"


def decision_path(d: dict[str, Any]) -> str:
    # The whole decision id (an event id): a prefix of it could be shared within a task.
    name = f"{d['task_id']}-{d['kind']}-{d['decision_id']}"
    return f"decisions/{page_name(name)}"


def point_path(ph: str) -> str:
    return f"points/{page_name(ph.removeprefix('sha256:'))}"  # the whole hash: no prefix clash


def profile_path(rp: str) -> str:
    service, _, rev = rp.rpartition("@")  # "service@rev": the rev is an integer
    return f"profiles/{page_name(f'{service}-r{rev}' if service else rp)}"


def model_path(m: str) -> str:
    return f"models/{page_name(m)}"


def dim_value_link(col: str, value: Any) -> Any:
    if value is None:
        return "—"
    if col == "model":
        return link(model_path(value), str(value))
    if col == "runtime_profile":
        return link(profile_path(value), str(value))
    if col == "point_hash":
        return link(point_path(value), str(value)[:19])
    return str(value)


def _cand(key: str | None) -> str:
    """A candidate as a person reads it (ledger/titles.py: one spelling everywhere)."""
    return candidate_title_of_key(key)


# --- builders ---------------------------------------------------------------------------


def _dims_table(row: dict[str, Any], cols: list[str]) -> tuple:
    return ("table", ["dimension", "value"], [(c, dim_value_link(c, row.get(c))) for c in cols])


PREFERRED_METRICS = ["output_throughput", "request_throughput", "median_ttft_ms",
                     "p99_ttft_ms", "median_tpot_ms", "median_e2e_latency_ms", "token_match"]
MAIN_METRICS = 4  # metric columns shown at once: the gated ones first; the rest on demand


def gated_metrics(t: dict[str, Any] | None) -> list[str]:
    """The metrics a task's contract gates, in the contract's order."""
    gates = _at(_json((t or {}).get("definition")), "contract", "gates")
    out = [g.get("metric") for g in gates if isinstance(g, dict)] if isinstance(gates, list) \
        else []
    return list(dict.fromkeys(m for m in out if isinstance(m, str) and m))


def _metric_order(present: set[str], gated: list[str]) -> list[str]:
    first = [m for m in gated if m in present]
    first += [m for m in PREFERRED_METRICS if m in present and m not in first]
    return first + sorted(present - set(first))


def _metric_table(rows: list[dict[str, Any]], gated: Sequence[str] = ()) -> list[tuple]:
    """Medians pivoted: one row per (block, candidate), one column per metric, the gated
    metrics first (MAIN_METRICS columns); every metric in a table shown on demand."""
    metrics = _metric_order({m["metric"] for m in rows}, list(gated))
    grid: dict[tuple, dict[str, Any]] = {}
    for m in rows:
        cell = grid.setdefault((m["block_id"] or "", m["candidate_key"]), {"n": 0})
        cell[m["metric"]] = m["median"]
        cell["n"] = max(cell["n"], m["n"])
    ordered = sorted(grid.items(), key=lambda kv: sort_key(kv[0]))

    def table(ms: list[str]) -> tuple:
        return ("table", ["block", "candidate", "runs", *(f"{m} (median)" for m in ms)],
                [(b, _cand(c), v["n"], *(metric_value(m, v.get(m)) for m in ms))
                 for (b, c), v in ordered])

    out = [table(metrics[:MAIN_METRICS])]
    if len(metrics) > MAIN_METRICS:
        out.append(("details", f"All {count(len(metrics), 'metric')} (medians)",
                    [("table", ["metric", *(f"{b or '—'}: {_cand(c)}" for (b, c), _ in ordered)],
                      [(m, *(metric_value(m, v.get(m)) for _, v in ordered))
                       for m in metrics])]))
    return out


def _gate_table(rows: list[dict[str, Any]]) -> tuple:
    return ("table", ["block", "verification", "gate", "metric", "verdict", "observed",
                      "threshold", "reason"],
            [(g["block_id"], g["verification"], g["gate"], g["metric"], g["verdict"],
              _gate_value(g, g["observed"]), _gate_value(g, g["threshold"], True), g["reason"])
             for g in rows])


def _gate_value(g: dict[str, Any], v: Any, threshold: bool = False) -> str:
    """An observed value (the metric's, in its unit) or a threshold: in the metric's unit, or
    for a gate against the baseline a ratio of it ("1.05× baseline"), for a stability gate
    the coefficient of variation ("CV 0.15")."""
    detail = _json(g.get("detail"))
    kind = detail.get("kind") if isinstance(detail, dict) else None
    if kind == "stability":  # observed: the runs' CV, which the row keeps in its detail
        cv = v if threshold or v is not None else _number(detail.get("cv"))
        return "—" if cv is None else f"CV {number(cv)}"
    if v is None:
        return "—"
    if not g.get("metric"):
        return number(v)
    if threshold and (kind == "relative" or g.get("baseline") is not None):
        return f"{number(v)}× baseline"
    return metric_value(g["metric"], v)


def _json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            return None
    return v


def _at(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def slo_lines(snap: Snapshot, t: dict[str, Any]) -> list[Line]:
    """The lines of a task's throughput-vs-TTFT plot: its deployment point's TTFT SLO (each
    percentile given: the median must stay under any of them) and throughput floor, and its
    absolute gates on median TTFT (at_most) and output throughput (at_least)."""
    definition = _json(t.get("definition"))
    point = _json((snap.points_by_hash.get(t.get("point_hash", "")) or {}).get("point"))
    if not isinstance(point, dict):
        point = _at(definition, "point")
    slo = _at(point, "scenario", "slo")
    ttft = _at(slo, "ttft_ms")
    found: list[tuple[Literal["x", "y"], Any, str, str]] = [  # axis, value, label around it
        ("x", v, f"TTFT SLO {k} ", " ms")
        for k, v in sorted(ttft.items() if isinstance(ttft, dict) else [], key=str)]
    found.append(("y", _at(slo, "throughput_floor"), "throughput floor ", " tok/s"))
    gates = _at(definition, "contract", "gates")
    for g in gates if isinstance(gates, list) else []:
        if isinstance(g, dict) and not g.get("vs_baseline"):
            if g.get("metric") == TRADEOFF_X:
                found.append(("x", g.get("at_most"), f"gate {g.get('name')}: ≤ ", " ms"))
            elif g.get("metric") == TRADEOFF_Y:
                found.append(("y", g.get("at_least"), f"gate {g.get('name')}: ≥ ", " tok/s"))
    return [Line(axis, v, f"{before}{exact(v)}{after}") for axis, value, before, after in found
            if (v := _number(value)) is not None]


def verdict_of(snap: Snapshot, tid: str, bid: str | None, cand: str | None) -> str:
    """accepted | rejected (the task's latest decision on the block, or on the candidate when
    the decision names no block), else baseline (the empty candidate), else unjudged."""
    kind = snap.decided.get((tid, "block", bid)) if bid is not None else None
    kind = kind or snap.decided.get((tid, "candidate", cand))
    if kind in ("accepted", "rejected"):
        return kind
    return "baseline" if cand in (None, "{}") else "unjudged"


def _tradeoff_svg(snap: Snapshot, rows: list[dict[str, Any]], title: str, plots: PlotCache,
                  tasks: list[dict[str, Any]], one_task: bool = False) -> str:
    """Throughput vs TTFT, one point per (task, block, candidate): labelled by its block (by
    task/block when the plot shows several tasks), by verdict, shaped by runtime profile when
    it shows several; the SLO and gate lines of the tasks (when they have at most MAX_LINES
    between them)."""
    pts: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r.get("runtime_profile") or "?", r["task_id"], r["block_id"], r["candidate_key"])
        pts.setdefault(key, {})[r["metric"]] = r["median"]
    points = [Point(m[TRADEOFF_X], m[TRADEOFF_Y],
                    (bid or "—") if one_task else f"{tid}/{bid or '—'}",
                    verdict_of(snap, tid, bid, cand), str(rp))
              for (rp, tid, bid, cand), m in sorted(pts.items(), key=lambda kv: sort_key(kv[0]))
              if TRADEOFF_X in m and TRADEOFF_Y in m]
    if not points:
        return ""
    lines = list(dict.fromkeys(ln for t in tasks for ln in slo_lines(snap, t)))
    return plots.plot_svg(points, xlabel="median TTFT (ms)",
                          ylabel="output throughput (tok/s)", title=title,
                          lines=lines if len(lines) <= MAX_LINES else ())


def _add_tradeoff(p: Page, snap: Snapshot, tasks: list[dict[str, Any]], plots: PlotCache
                  ) -> None:
    """The throughput-vs-TTFT plot of these tasks' measurements, one shape per runtime
    profile, under its heading (nothing when no measurement has both metrics)."""
    rows = [m | {"runtime_profile": t["runtime_profile"], "task_id": t["task_id"]}
            for t in tasks for m in snap.metrics.get(t["task_id"], [])]
    svg = _tradeoff_svg(snap, rows, "Throughput vs TTFT per runtime profile", plots, tasks)
    if svg:
        p.add("h", "Throughput vs TTFT")
        p.add("svg", svg)


def task_page(snap: Snapshot, t: dict[str, Any], decisions: list[dict[str, Any]],
              plots: PlotCache) -> Page:
    tid = t["task_id"]
    p = Page(task_path(tid), "task", task_title(t["title"], t["goal"]) or tid,
             position=snap.task_positions.get(tid, t["last_position"] or 0),
             summary=f"{t['task_type']} task: {t['goal']}",
             facets={k: t.get(k) for k in FACETS}, embed=task_text(t))
    p.meta = {"task_id": tid, "task_type": t["task_type"], "status": t["status"],
              "exit_state": t["exit_state"], "model": t["model"],
              "accelerator": t["accelerator"], "engine": t["engine"],
              "runtime_profile": t["runtime_profile"], "point_hash": t["point_hash"],
              "definition_hash": t["definition_hash"]}
    p.add("p", text(strong("Goal:"), f" {t['goal']}"))
    status = f"{t['status']}" + (f" — {t['exit_state']}: {t['exit_reason']}"
                                 if t["exit_state"] else "")
    p.add("p", text(strong("Status:"), f" {status}"))
    p.add("h", "Deployment point")
    p.add(*_dims_table(t, ["model", "task_type", "accelerator", "engine", "runtime_profile",
                           "architecture", "parallelism", "scenario", "point_hash"]))
    if decisions:
        p.add("h", "Decisions")
        p.add("list", [text(link(decision_path(d), f"{d['kind']}: {_cand(d['candidate_key'])}"),
                            f" — {d['reason'] or ''}") for d in decisions])
    blocks = snap.blocks.get(tid, [])
    if blocks:
        p.add("h", "Loop blocks")
        p.add("table", ["block", "sub-goal", "candidate", "tier", "topology", "outcome",
                        "verdict", "measurements"],
              [(b["block_id"], b["sub_goal"], _cand(b["candidate_key"]), b["model_tier"],
                b["agent_topology"], b["outcome"], b["verdict"], b["measurements"])
               for b in blocks])
    metrics = snap.metrics.get(tid, [])
    if metrics:
        p.add("h", "Measurements")
        if len({(m["block_id"], m["candidate_key"]) for m in metrics}) > 1:  # else not drawn
            svg = _tradeoff_svg(snap, [{**m, "runtime_profile": t["runtime_profile"]}
                                       for m in metrics],
                                f"{tid}: throughput vs TTFT", plots, [t], one_task=True)
            if svg:
                p.add("svg", svg)
        for b in _metric_table(metrics, gated_metrics(t)):
            p.add(*b)
    steps = snap.steps.get(tid, [])
    if steps:
        p.add("h", "Verification steps")
        p.add("table", ["block", "step", "kind", "outcome", "detail"],
              [(x["block_id"], x["step"], x["kind"], *_step_outcome(snap, tid, x))
               for x in steps])
    gates = snap.gates.get(tid, [])
    if gates:
        p.add("h", "Gate verdicts")
        p.add(*_gate_table(gates))
    reviews = snap.reviews.get(tid, [])
    if reviews:  # the reviewer's words are plain text: they never form a link or markup
        p.add("h", "Reviews")
        p.add("table", ["block", "verdict", "reviewer", "family", "reasons (evidence)"],
              [(r["block_id"], r["verdict"], f"{r['tier']}: {r['model']}", r["family"],
                "; ".join(r["reasons"]) or "—") for r in reviews])
    hand = snap.handoffs.get(tid, [])
    if hand:
        p.add("h", "Handoffs")
        p.add("list", [f"{h['block_id'] or 'task'} ({h['outcome']}): {h['state_reached'] or ''}"
                       + (f"; findings: {'; '.join(h['findings'])}" if h["findings"] else "")
                       + (f"; next: {h['next_sub_goal']}" if h["next_sub_goal"] else "")
                       for h in hand])
    return p


def _step_outcome(snap: Snapshot, tid: str, x: dict[str, Any]) -> tuple[Any, Any]:
    """A step's outcome and detail. The `decide` step is recorded as deferred (it acts after
    the verification): shown as the decision the task then took on the block, if any."""
    if x["outcome"] == "deferred" and x["step"] == "decide":
        kind = snap.decided.get((tid, "block", x["block_id"]))
        if kind:
            return kind, f"{kind} on this verification's verdict"
        if any(b["block_id"] == x["block_id"] and b["candidate_key"] in (None, "{}")
               for b in snap.blocks.get(tid, [])):
            return "baseline", "the baseline: nothing to decide"
        return "no decision", "no decision recorded on this block"
    return x["outcome"], x["detail"]


def decision_page(snap: Snapshot, d: dict[str, Any], task: dict[str, Any] | None) -> Page:
    tid = d["task_id"]
    title = f"{d['kind'].capitalize()}: {_cand(d['candidate_key'])} in {tid}"
    p = Page(decision_path(d), "decision", title, position=d["position"],
             summary=f"{d['kind']} direction {_cand(d['candidate_key'])}: {d['reason'] or ''}",
             facets={k: d.get(k) for k in FACETS}, embed=decision_text(d))
    p.meta = {"decision_id": d["decision_id"], "kind": d["kind"], "task_id": tid,
              "block_id": d["block_id"], "candidate": orjson.loads(d["candidate"] or "{}"),
              "model": d["model"], "accelerator": d["accelerator"], "engine": d["engine"]}
    p.add("p", text(strong("Task:"), " ", link(task_path(tid), tid),
                    f" — {task['goal']}" if task else None))
    p.add("p", text(strong("Decision:"),
                    f" {d['kind']} — {d['reason'] or '(no reason recorded)'}"))
    p.add("p", text(strong("Candidate:"),
                    f" {_cand(d['candidate_key'])} (block {d['block_id'] or '—'})"))
    p.add("h", "Evidence")
    ev = []
    for e in d["evidence"] or []:
        typ, pos = snap.events_by_id.get(e, ("artifact or external", None))
        ev.append(f"{e} — {typ}" + (f" at ledger position {pos}" if pos else ""))
    p.add("list", ev or ["(no evidence recorded)"])
    vids = set(d["evidence"] or []) | ({d["verification_event_id"]}
                                       if d["verification_event_id"] else set())
    gates = [g for g in snap.gates.get(tid, []) if g["vid"] in vids]
    if gates:
        p.add("h", "Gate verdicts")
        p.add(*_gate_table(gates))
    rows = [m for m in snap.metrics.get(tid, [])
            if m["block_id"] == d["block_id"] or m["candidate_key"] == "{}"]
    gated = gated_metrics(task)
    if rows:
        p.add("h", "Measurements behind it (baseline and candidate)")
        for b in _metric_table(rows, gated):
            p.add(*b)
    if task:
        p.add("h", "Deployment point")
        p.add(*_dims_table(task, ["model", "accelerator", "engine", "runtime_profile",
                                  "point_hash"]))
    chain = snap.traces.get(d["decision_id"])
    if chain:
        _add_trace(p, chain, gated, snap.previews)
    return p


def _exit(x: dict[str, Any]) -> Any:
    """A tool call's exit: an engine that forge stopped (SIGTERM, or a clean exit) "stopped"."""
    e = x["exit_code"]
    if str(x["tool"]).startswith("engine ") and e in (0, -15):
        return "stopped"
    if isinstance(e, int) and e < 0:
        return f"signal {-e}"
    return "—" if e is None else e


def _output(x: dict[str, Any], previews: dict[str, Any]) -> Any:
    """A tool call's output cell: a link to the artifact's page (its redacted excerpt), or
    the digest when the build could not read it."""
    digest = x.get("stdout")
    if not digest:
        return "—"
    if digest in previews:
        return link(artifact_path(digest), "output")
    return code(digest)


def _add_trace(p: Page, c: dict[str, Any], gated: Sequence[str] = (),
               previews: dict[str, Any] | None = None) -> None:
    """The decision's traceable path (`forge trace`, projections/trace.py): block and routing,
    tool calls, measurements, gates, handoff, graph edges fed, artifacts. Every value is
    plain text or code: argv, reasons and findings never form a link or markup."""
    # In the function for start-up time: the trace reads (~20 ms) load for a decision's page,
    # not for every user of the pages' paths (`forge wiki ask`, retrieval).
    from ..projections.trace import gate_line

    p.add("h", "Traceable path")
    b, r, h = c.get("block"), c.get("routing") or {}, c.get("handoff")
    facts = [text(strong("Task:"), " ", link(task_path(c["task"]["task_id"]),
                                             c["task"]["task_id"]),
                  f" — {c['task'].get('goal') or ''}")]
    if b:
        facts.append(text(strong("Block:"), f" {b['block_id']} (#{b['index']}): {b['sub_goal']}"))
    facts.append(text(strong("Routing:"), " " + (", ".join(f"{k} {v}" for k, v in
                                                          sorted(r.items())) or "—")))
    if h:
        facts.append(text(strong("Handoff:"), f" {h['outcome']}: {h['state_reached'] or '—'}",
                          " (", code(h["event_id"]), ")"))
    p.add("list", facts)
    previews = previews or {}
    if c["tool_calls"]:
        p.add("p", text(strong("Tool calls")))
        p.add("table", ["event", "tool", "argv", "exit", "repo snapshot", "output"],
              [(code(x["event_id"][:8]), x["tool"], code(" ".join(x["argv"])), _exit(x),
                code(x["repo_snapshot"]) if x["repo_snapshot"] else "—",
                _output(x, previews)) for x in c["tool_calls"]])
        for x in c["tool_calls"]:  # the first lines of each output, redacted
            pv = previews.get(x.get("stdout") or "")
            if pv is not None and pv.head:
                p.add("details", f"{pv.what} ({x['event_id'][:8]}): first lines",
                      [("code", pv.head),
                       ("p", text(link(artifact_path(pv.digest), "the whole output"),
                                  " (redacted), file ", code(pv.relative)))])
    if c["measurements"]:
        p.add("p", text(strong("Measurements")))
        ms = c["measurements"]
        names = _metric_order({k for m in ms for k in m["metrics"]}, list(gated))
        main = [k for k in names if k in gated][:MAIN_METRICS] or names[:MAIN_METRICS]
        p.add("table", ["event", "run", "source", *main, "records", "host"],
              [(code(m["event_id"][:8]), m["run_id"], m["source"],
                *(metric_value(k, m["metrics"].get(k)) for k in main),
                code(m["artifact"]) if m["artifact"] else "—", _host_cell(m)) for m in ms])
        if len(names) > len(main):
            p.add("details", f"All {count(len(names), 'metric')} of these runs",
                  [("table", ["metric", *(m["run_id"] for m in ms)],
                    [(k, *(metric_value(k, m["metrics"].get(k)) for m in ms))
                     for k in names])])
    v = c.get("verification")
    if v:
        p.add("p", text(strong("Verification"), f" {v['verdict']} (", code(v["event_id"]), ")"))
        p.add("list", [gate_line(g) for g in v["gates"]] or ["(no gates)"])
    if c["graph_edges"]:
        p.add("p", text(strong("Graph edges fed")))
        # graphs.graph_path's form (graphs.py imports this module, not the other way)
        p.add("list", [text(link(f"graphs/{page_name(e['graph'])}", e["graph"]),
                            f": {e['src']} -> {e['dst']} (attempt {e['attempt']})")
                       for e in c["graph_edges"]])
    if c["artifacts"]:
        p.add("p", text(strong("Artifacts")))
        p.add("list", [text(code(a["digest"]), f" {a['what']}: ", code(a["relative"]))
                       for a in c["artifacts"]])


def _host_cell(m: dict[str, Any]) -> str:
    """A run's host state (projections/trace.py `host_line`) and, when it contaminated the
    run, why; "—" for a run recorded without one."""
    if not m.get("host"):
        return "—"
    dirty = m.get("contaminated") or []
    return m["host"] + (f" — CONTAMINATED: {'; '.join(dirty)}" if dirty else "")


def _task_list(tasks: list[dict[str, Any]]) -> tuple:
    return ("table", ["task", "type", "status", "model", "accelerator", "engine", "profile"],
            [(link(task_path(t["task_id"]), t["task_id"]), t["task_type"],
              t["exit_state"] or t["status"], dim_value_link("model", t["model"]),
              t["accelerator"], t["engine"],
              dim_value_link("runtime_profile", t["runtime_profile"])) for t in tasks])


def group_page(snap: Snapshot, path: str, kind: str, title: str, tasks: list[dict[str, Any]],
               head: list[tuple], extra_meta: dict[str, Any], plots: PlotCache) -> Page:
    pos = max([snap.task_positions.get(t["task_id"], 0) for t in tasks] or [0])
    p = Page(path, kind, title, position=pos, summary=title, meta=extra_meta)
    for b in head:
        p.add(*b)
    _add_tradeoff(p, snap, tasks, plots)
    p.add("h", f"Tasks ({len(tasks)})")  # a count in a heading: no noun to agree
    p.add(*_task_list(tasks))
    return p


def make_pages(snap: Snapshot, plots: PlotCache | None = None) -> list[Page]:
    plots = plots if plots is not None else PlotCache()
    pages: list[Page] = []
    by_task_dec: dict[str, list] = defaultdict(list)
    for d in snap.decisions:
        by_task_dec[d["task_id"]].append(d)
    tasks_by_id = {t["task_id"]: t for t in snap.tasks}
    for t in snap.tasks:
        pages.append(task_page(snap, t, by_task_dec.get(t["task_id"], []), plots))
    for d in snap.decisions:
        pages.append(decision_page(snap, d, tasks_by_id.get(d["task_id"])))
    groups: dict[str, dict[Any, list]] = {c: defaultdict(list) for c, _ in DIMENSION_PAGES}
    groups["point_hash"] = defaultdict(list)
    for t in snap.tasks:
        for c in groups:
            groups[c][t.get(c)].append(t)
    points = {p["point_hash"]: p for p in snap.points}
    for ph in sorted(set(groups["point_hash"]) - {None} | set(points)):
        tasks = groups["point_hash"].get(ph, [])
        src = points.get(ph) or (tasks[0] if tasks else {})
        head: list[tuple] = [("p", text("Deployment point ", code(ph),
                           f" ({src['name']})" if src.get("name") else None)),
                _dims_table(src, ["model", "modality", "scenario", "architecture",
                                  "parallelism", "runtime_profile", "accelerator",
                                  "accelerator_count"])]
        if src.get("point"):
            head.append(("code", orjson.dumps(orjson.loads(src["point"]),
                                              option=orjson.OPT_INDENT_2
                                              | orjson.OPT_SORT_KEYS).decode()))
        pages.append(group_page(snap, point_path(ph), "point",
                                f"Point {src.get('name') or ph[7:19]}", tasks, head,
                                {"point_hash": ph, "name": src.get("name")}, plots))
    profiles = {f"{r['service']}@{r['rev']}": r for r in snap.profiles}
    for rp in sorted(set(groups["runtime_profile"]) - {None} | set(profiles)):
        tasks = groups["runtime_profile"].get(rp, [])
        prof = profiles.get(rp)
        head = []
        if prof:
            cfg = orjson.loads(prof["config"] or "{}")
            head += [("p", text("Engine ", strong(prof["engine"]), ", profile hash ",
                                code(prof["profile_hash"]),
                                f", image {prof['image']}" if prof["image"] else None)),
                     ("table", ["flag", "value"], [(k, orjson.dumps(v).decode())
                                                   for k, v in sorted(cfg.items())])]
        pages.append(group_page(snap, profile_path(rp), "profile", f"Runtime profile {rp}",
                                tasks, head, {"runtime_profile": rp,
                                              "engine": prof["engine"] if prof else None},
                                plots))
    for m in sorted(set(groups["model"]) - {None}):
        tasks = groups["model"][m]
        rps = sorted({t["runtime_profile"] for t in tasks if t["runtime_profile"]})
        head = [("p", text("Model ", strong(m), "; runtime profiles: ",
                           join(", ", (link(profile_path(r), r) for r in rps)) or "none"))]
        pages.append(group_page(snap, model_path(m), "model", f"Model {m}", tasks, head,
                                {"model": m}, plots))
    for col, title in DIMENSION_PAGES:
        p = Page(f"dims/{slug(col)}", "dimension", title, position=snap.position,
                 summary=f"index of tasks by {col}", meta={"dimension": col})
        vals = sorted(groups[col].items(), key=lambda kv: str(kv[0]))
        p.add("table", [col, "tasks", "accepted", "rejected"],
              [(dim_value_link(col, v), len(ts), sum(t["accepted"] for t in ts),
                sum(t["rejected"] for t in ts)) for v, ts in vals])
        for v, ts in vals:
            p.add("h", f"{col} = {v if v is not None else '—'}")
            p.add("list", [text(link(task_path(t["task_id"]), t["task_id"]),
                                f" — {t['exit_state'] or t['status']}") for t in ts])
        pages.append(p)
    pages.append(home_page(snap, groups, plots))
    pages.append(log_page(snap))
    return pages


def home_page(snap: Snapshot, groups: dict[str, dict[Any, list]], plots: PlotCache) -> Page:
    p = Page("index", "index", "infer-forge journal", position=snap.position,
             summary="home of the journal")
    acc = sum(1 for d in snap.decisions if d["kind"] == "accepted")
    p.add("p", text(f"{count(len(snap.tasks), 'task')}, "
                    f"{count(len(snap.decisions), 'decision')} ({acc} "
                    f"accepted, {len(snap.decisions) - acc} rejected), as of ledger position "
                    f"{snap.position}. See the ", link("log", "log"), " for the chronology."))
    p.add("h", "Browse by dimension")
    p.add("list", [text(link(f"dims/{slug(c)}", t), f" ({count(len(groups[c]), 'value')})")
                   for c, t in DIMENSION_PAGES])
    p.add("h", "Latest decisions")
    p.add("list", [text(link(decision_path(d), f"{d['kind']}: {_cand(d['candidate_key'])}"),
                        " in ", link(task_path(d["task_id"]), d["task_id"]),
                        f" — {d['reason'] or ''}")
                   for d in snap.decisions[-20:][::-1]] or ["(none)"])
    p.add("h", "Latest tasks")
    recent = sorted(snap.tasks, key=lambda t: -(t["defined_position"] or 0))[:20]
    p.add(*_task_list(recent))
    _add_tradeoff(p, snap, snap.tasks[:2000], plots)
    return p


def log_page(snap: Snapshot) -> Page:
    entries: list[tuple[int, Text]] = []
    for pt in snap.points:
        label = pt["name"] or pt["point_hash"][:19]
        entries.append((pt["position"],
                        text("point pinned: ", link(point_path(pt["point_hash"]), label))))
    for pr in snap.profiles:
        rp = f"{pr['service']}@{pr['rev']}"
        entries.append((pr["position"],
                        text("runtime profile revised: ", link(profile_path(rp), rp))))
    for t in snap.tasks:
        tl = link(task_path(t["task_id"]), t["task_id"])
        entries.append((t["defined_position"] or 0,
                        text("task defined: ", tl, f" ({t['task_type']})")))
        if t["exit_state"]:
            entries.append((t["last_position"] or 0,
                            text("task exited: ", tl, f" — {t['exit_state']}")))
    for d in snap.decisions:
        entries.append((d["position"], text(link(decision_path(d), d["kind"]),
                                            f": {_cand(d['candidate_key'])} in {d['task_id']}")))
    entries.sort(key=lambda e: sort_key(e[0]))
    p = Page("log", "log", "Log", position=snap.position, summary="chronological log")
    p.add("list", [text(f"{pos}: ", line) for pos, line in entries] or ["(empty)"])
    return p
