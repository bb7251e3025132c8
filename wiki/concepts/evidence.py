"""The concepts the ledger shows, from the index: `load(con)` reads what they are made of in a
few bulk queries (an `Evidence`); `derive(ev)` is then pure and gives one `Draft` per concept
with its findings (claims with their citations), the events it is made of and the deployment
points its findings hold for.

Concepts (model.KINDS):
- flag `flag:<key>=<value>`: every loop block whose candidate sets that engine flag or kernel
  backend to that value — its decision, and its metric medians against its task's baseline.
- pairing `pairing:<model>@<accelerator>`: the tasks on that pairing, their accepted and
  rejected directions.
- failure `failure:gate:<gate>/<metric>` (a gate or a graph check failing in two or more
  verifications) and `failure:rule:<rule>` (a diagnosis rule firing in two or more diagnoses).
- direction `direction:<candidate key>` (a rejected candidate) and
  `direction:node:<graph>.<node>` (a rejected graph node): each rejection, how often it came
  back.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...ledger.streams import graph_of
from ...ledger.titles import candidate_title_of_key
from ...projections.index import tracked_position
from ..graphs import graph_path
from ..numbers import count
from ..pages import decision_path, task_path
from .model import Citation, PointRef, Section, concept_slug

RECURRING = 2  # a failure is recurring from its second occurrence
METRICS_SHOWN = 6  # metrics per block on a flag page (the gated ones first)
# After the gated metrics, the ones an engineer reads first; settings echoed back as metrics
# (the goodput thresholds) and run bookkeeping are never findings.
HEADLINE = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms",
            "median_itl_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "goodput",
            "token_match", "failed")
NOT_FINDINGS = ("goodput_slos_ms.", "completed", "concurrency", "duration")


def shown_metrics(got: Any, ref: Any, gated: Any) -> list[str]:
    """Which of a block's metrics its flag page shows (pure): gated, then headline, then
    the rest, each present in the baseline first; never an echoed setting."""
    order = {m: i for i, m in enumerate(HEADLINE)}
    keep = [m for m in got if not m.startswith(NOT_FINDINGS)]
    return sorted(keep, key=lambda m: (m not in gated, order.get(m, len(order)),
                                       m not in ref, m))[:METRICS_SHOWN]


def _rows(con: Any, sql: str, *args: Any) -> list[dict[str, Any]]:
    rel = con.execute(sql, *args)
    names = [d[0] for d in rel.description]
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


@dataclass
class Evidence:
    position: int
    tasks: dict[str, dict[str, Any]]
    blocks: list[dict[str, Any]]  # loop blocks with candidates, by position
    decisions: list[dict[str, Any]]
    verifications: dict[tuple[str, str], dict[str, Any]]  # (task, block) -> the latest
    failures: list[dict[str, Any]]  # failing gate verdicts
    medians: dict[tuple[str, str], dict[str, dict[str, Any]]]  # (task, block) -> metric -> row
    gated: dict[tuple[str, str], set[str]]  # (task, block) -> the metrics its gates judged
    node_rejections: list[dict[str, Any]]
    diagnoses: list[dict[str, Any]]
    latest_revs: dict[str, int]  # service -> its newest runtime profile revision
    task_events: dict[str, list[tuple[str, int, str]]]  # task -> TaskDefined/Exited events
    events: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # id -> pos,type,sha

    def citation(self, event_id: str) -> Citation | None:
        e = self.events.get(event_id)
        if e is None:
            return None
        return Citation(event_id=event_id, position=e[0], type=e[1], page=self._pages.get(
            event_id))

    _pages: dict[str, str] = field(default_factory=dict)


def event_sha(type_: str, payload: str | None) -> str:
    return hashlib.sha256(f"{type_}\n{payload or ''}".encode("utf-8", "surrogatepass")
                          ).hexdigest()


def load(con: Any) -> Evidence:
    pos = tracked_position(con)
    tasks = {r["task_id"]: r for r in _rows(
        con, """SELECT task_id, title, task_type, model, accelerator, engine, service, rev,
                       point_hash, exit_state FROM tasks ORDER BY task_id""")}
    blocks = _rows(con, """SELECT position, event_id, task_id, block_id, candidate,
                                  candidate_key FROM loop_blocks ORDER BY position""")
    decisions = _rows(con, "SELECT * FROM decisions ORDER BY position")
    verifications = {(r["task_id"], r["block_id"]): r for r in _rows(
        con, """SELECT event_id, position, task_id, block_id, verdict, point_hash
                FROM verifications ORDER BY position""")}
    failures = _rows(con, """SELECT g.verification_id, g.position, g.task_id, g.block_id,
                                    g.gate, g.metric, g.observed, g.threshold, g.reason
                             FROM gate_verdicts g WHERE g.verdict = 'fail'
                             ORDER BY g.position, g.gate""")
    gated: dict[tuple[str, str], set[str]] = defaultdict(set)
    for tid, bid, metric in con.execute(
            """SELECT DISTINCT task_id, block_id, metric FROM gate_verdicts
               WHERE metric IS NOT NULL AND task_id IS NOT NULL""").fetchall():
        gated[(tid, bid)].add(metric)
    medians: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in _rows(con, """SELECT task_id, block_id, metric, median(value) AS median,
                                  count(*) AS n, list(DISTINCT event_id ORDER BY event_id) AS ids
                           FROM valid_measurements WHERE task_id IS NOT NULL
                           GROUP BY ALL ORDER BY task_id, block_id, metric"""):
        medians[(r["task_id"], r["block_id"])][r["metric"]] = r
    rejected = _rows(con, """SELECT event_id, position, stream, payload FROM events
                             WHERE type = 'NodeRejected' ORDER BY position""")
    node_rejections = []
    for r in rejected:
        x = orjson.loads(r["payload"]) if r["payload"] else {}
        node_rejections.append({"event_id": r["event_id"], "position": r["position"],
                                "graph": graph_of(str(r["stream"])) or str(r["stream"]),
                                "node": x.get("node"), "reason": x.get("reason") or "",
                                "evidence": [str(e) for e in x.get("evidence") or []]})
    diagnoses = _rows(con, """SELECT event_id, position, task_id, url, rules_fired
                              FROM diagnoses WHERE len(rules_fired) > 0 ORDER BY position""")
    latest_revs = {s: int(r) for s, r in con.execute(
        "SELECT service, max(rev) FROM runtime_profiles GROUP BY ALL").fetchall()
        if s is not None and r is not None}
    task_events: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    for eid, tid, p, typ in con.execute(
            """SELECT event_id, task_id, position, type FROM events
               WHERE type IN ('TaskDefined', 'TaskExited') AND task_id IS NOT NULL
               ORDER BY position""").fetchall():
        task_events[tid].append((eid, p, typ))
    ev = Evidence(pos, tasks, blocks, decisions, verifications, failures, dict(medians),
                  dict(gated),
                  node_rejections, diagnoses, latest_revs, dict(task_events))
    wanted: set[str] = {b["event_id"] for b in blocks}
    wanted |= {d["decision_id"] for d in decisions} | {f["verification_id"] for f in failures}
    wanted |= {v["event_id"] for v in verifications.values()}
    wanted |= {e for m in medians.values() for r in m.values() for e in r["ids"]}
    wanted |= {r["event_id"] for r in node_rejections}
    wanted |= {e for r in node_rejections for e in r["evidence"]}
    wanted |= {d["event_id"] for d in diagnoses}
    wanted |= {e for es in task_events.values() for e, _, _ in es}
    ev.events.update(lookup(con, wanted))
    pages = {d["decision_id"]: decision_path(d) for d in decisions}
    for eid, tid, stream in con.execute(
            "SELECT event_id, task_id, stream FROM events WHERE event_id IN "
            "(SELECT unnest($1))", [sorted(wanted)]).fetchall():
        if eid in pages:
            continue
        if tid is not None and tid in tasks:
            pages[eid] = task_path(tid)
        elif (gid := graph_of(str(stream))) is not None:
            pages[eid] = graph_path(gid)
    ev._pages = pages
    return ev


def lookup(con: Any, ids: set[str] | list[str]) -> dict[str, tuple[int, str, str]]:
    """(position, type, sha256 of type and payload) of each of `ids` the index holds."""
    if not ids:
        return {}
    return {eid: (p, typ, event_sha(typ, payload)) for eid, p, typ, payload in con.execute(
        "SELECT event_id, position, type, payload FROM events WHERE event_id IN "
        "(SELECT unnest($1))", [sorted(ids)]).fetchall()}


def payloads(con: Any, ids: list[str]) -> dict[str, str]:
    """The stored payload text of each of `ids` the index holds (for the figure check)."""
    if not ids:
        return {}
    return dict(con.execute("SELECT event_id, payload FROM events WHERE event_id IN "
                            "(SELECT unnest($1))", [sorted(set(ids))]).fetchall())


# --- drafts (pure) ----------------------------------------------------------------------


@dataclass
class Finding:
    section: str
    text: str
    cites: list[str]
    row: tuple[str, ...] | None = None
    point: str | None = None
    outcome: str | None = None


@dataclass
class Draft:
    kind: str
    value: str
    title: str
    summary: str = ""
    sections: list[Section] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    points: dict[str, PointRef] = field(default_factory=dict)

    @property
    def concept(self) -> str:
        return f"{self.kind}:{self.value}"

    @property
    def slug(self) -> str:
        return concept_slug(self.kind, self.value)

    def sources(self) -> set[str]:
        return {e for f in self.findings for e in f.cites}

    def section(self, name: str, *columns: str) -> None:
        if all(s.name != name for s in self.sections):
            self.sections.append(Section(name=name, columns=tuple(columns)))

    def add(self, section: str, text_: str, cites: list[str],
            row: tuple[str, ...] | None = None, point: PointRef | None = None,
            outcome: str | None = None) -> None:
        cites = list(dict.fromkeys(c for c in cites if c))
        if cites:  # nothing uncited is published
            self.findings.append(Finding(section, text_, cites, row,
                                         point.point_hash if point else None, outcome))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


def _point(ev: Evidence, tid: str, point_hash: str | None = None) -> PointRef | None:
    t = ev.tasks.get(tid) or {}
    ph = point_hash or t.get("point_hash")
    if not ph:
        return None
    return PointRef(point_hash=ph, model=t.get("model"), accelerator=t.get("accelerator"),
                    engine=t.get("engine"), service=t.get("service"),
                    rev=int(t["rev"]) if t.get("rev") is not None else None)


def _where(p: PointRef | None) -> str:
    if p is None:
        return "-"
    parts = [x for x in (p.model, p.accelerator, p.engine) if x]
    prof = p.runtime_profile
    return " / ".join(parts) + (f" ({prof})" if prof else "") if parts else p.point_hash[:19]


def _setting(v: Any) -> str:
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def derive(ev: Evidence) -> dict[str, Draft]:
    """Every concept the evidence shows, by concept key (pure)."""
    drafts: dict[str, Draft] = {}

    def draft(kind: str, value: str, title: str) -> Draft:
        key = f"{kind}:{value}"
        if key not in drafts:
            drafts[key] = Draft(kind, value, title)
        return drafts[key]

    decided: dict[tuple[str, str], dict[str, Any]] = {}
    for dec in ev.decisions:
        if dec["block_id"] is not None:
            decided[(dec["task_id"], dec["block_id"])] = dec
    baseline: dict[str, str] = {}
    for b in ev.blocks:
        if b["candidate_key"] in (None, "{}") and b["task_id"] not in baseline:
            baseline[b["task_id"]] = b["block_id"]
    _flags(ev, draft, decided, baseline)
    _pairings(ev, draft)
    _failures(ev, draft)
    _directions(ev, draft)
    for d in drafts.values():
        d.summary = _summary(d)
    return {k: d for k, d in sorted(drafts.items()) if d.findings}


def _flags(ev: Evidence, draft: Any, decided: dict, baseline: dict[str, str]) -> None:
    for b in ev.blocks:
        cand = orjson.loads(b["candidate"]) if b["candidate"] else {}
        if not isinstance(cand, dict) or not cand:
            continue
        tid, bid = b["task_id"], b["block_id"]
        d = decided.get((tid, bid))
        v = ev.verifications.get((tid, bid))
        p = _point(ev, tid, v["point_hash"] if v else None)
        for key, val in sorted(cand.items()):
            setting = f"{key}={_setting(val)}"
            f = draft("flag", setting, f"{key} = {_setting(val)}")
            if p is not None:
                f.points.setdefault(p.point_hash, p)
            f.section("Decisions", "task", "block", "point", "decision", "why")
            f.section("Measured against the baseline", "task", "block", "metric",
                      "median", "baseline", "change")
            kind = d["kind"] if d else (v["verdict"] if v else "measured")
            why = (d["reason"] if d else "") or ""
            f.add("Decisions", f"{setting} was {kind} in task {tid} block {bid} on "
                  f"{_where(p)}: {why}", [d["decision_id"] if d else "",
                                          v["event_id"] if v else "", b["event_id"]],
                  (tid, bid, _where(p), kind, why), p, kind)
            base = baseline.get(tid)
            got = ev.medians.get((tid, bid), {})
            ref = ev.medians.get((tid, base), {}) if base and base != bid else {}
            shown = shown_metrics(got, ref, ev.gated.get((tid, bid), set()))
            for m in shown:
                r, r0 = got[m], ref.get(m)
                change = (f"{(r['median'] / r0['median'] - 1) * 100:+.1f}%"
                          if r0 and r0["median"] else "-")
                f.add("Measured against the baseline",
                      f"{m} median {_fmt(r['median'])} in {tid} block {bid}"
                      + (f" against {_fmt(r0['median'])} in its baseline block {base} "
                         f"({change})" if r0 else ""),
                      list(r["ids"]) + (list(r0["ids"]) if r0 else []),
                      (tid, bid, m, _fmt(r["median"]), _fmt(r0["median"]) if r0 else "-",
                       change), p)


def _pairings(ev: Evidence, draft: Any) -> None:
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in ev.decisions:
        by_task[d["task_id"]].append(d)
    for tid, t in ev.tasks.items():
        if not (t.get("model") and t.get("accelerator")):
            continue
        value = f"{t['model']}@{t['accelerator']}"
        f = draft("pairing", value, f"{t['model']} on {t['accelerator']}")
        p = _point(ev, tid)
        if p is not None:
            f.points.setdefault(p.point_hash, p)
        f.section("Tasks", "task", "type", "point", "exit", "accepted", "rejected")
        ds = by_task.get(tid, [])
        acc = sum(d["kind"] == "accepted" for d in ds)
        rej = sum(d["kind"] == "rejected" for d in ds)
        f.add("Tasks", f"task {tid} ({t.get('task_type')}) on {_where(p)}: exit "
              f"{t.get('exit_state') or 'none yet'}, {acc} accepted, {rej} rejected",
              [e for e, _, _ in ev.task_events.get(tid, [])] + [d["decision_id"] for d in ds],
              (tid, str(t.get("task_type")), _where(p), str(t.get("exit_state") or "-"),
               str(acc), str(rej)), p)
        for d in ds:
            sec = "Accepted" if d["kind"] == "accepted" else "Rejected directions"
            if d["kind"] not in ("accepted", "rejected"):
                continue
            f.section(sec)
            f.add(sec, f"{candidate_title_of_key(d['candidate_key'])} in {tid}: "
                       f"{d['reason'] or ''}",
                  [d["decision_id"], d["verification_event_id"] or ""], None, p, d["kind"])


def _failures(ev: Evidence, draft: Any) -> None:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in ev.failures:
        groups[f"{g['gate']}/{g['metric'] or '-'}"].append(g)
    for key, gs in groups.items():
        if len({(g["task_id"], g["block_id"]) for g in gs}) < RECURRING:
            continue
        gate, _, metric = key.partition("/")
        f = draft("failure", f"gate:{key}", f"Recurring failure: gate {gate} ({metric})")
        f.section("Occurrences", "task", "block", "point", "observed", "threshold", "reason")
        for g in gs:
            p = _point(ev, g["task_id"], (ev.verifications.get(
                (g["task_id"], g["block_id"])) or {}).get("point_hash"))
            if p is not None:
                f.points.setdefault(p.point_hash, p)
            f.add("Occurrences", f"gate {gate} failed in {g['task_id']} block "
                  f"{g['block_id']}: {g['reason'] or ''}", [g["verification_id"]],
                  (g["task_id"], g["block_id"], _where(p), _fmt(g["observed"]),
                   _fmt(g["threshold"]), g["reason"] or ""), p, "failed")
    rules: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for dg in ev.diagnoses:
        for r in dg["rules_fired"] or []:
            rules[r].append(dg)
    for rule, ds in rules.items():
        if len(ds) < RECURRING:
            continue
        f = draft("failure", f"rule:{rule}", f"Recurring failure: diagnosis rule {rule}")
        f.section("Occurrences", "endpoint", "task", "rules fired")
        for dg in ds:
            f.add("Occurrences", f"rule {rule} fired on {dg['url']}", [dg["event_id"]],
                  (str(dg["url"]), str(dg["task_id"] or "-"),
                   ", ".join(dg["rules_fired"] or [])))


def _directions(ev: Evidence, draft: Any) -> None:
    for d in ev.decisions:
        if d["kind"] != "rejected" or d["candidate_key"] in (None, "{}"):
            continue
        cand = candidate_title_of_key(d["candidate_key"])
        f = draft("direction", d["candidate_key"], f"Rejected direction: {cand}")
        p = _point(ev, d["task_id"], d.get("point_hash"))
        if p is not None:
            f.points.setdefault(p.point_hash, p)
        f.section("Rejections", "task", "block", "point", "why")
        f.add("Rejections", f"{cand} rejected in {d['task_id']} block "
              f"{d['block_id']} on {_where(p)}: {d['reason'] or ''}",
              [d["decision_id"], *(d["evidence"] or [])],
              (d["task_id"], str(d["block_id"]), _where(p), d["reason"] or ""), p, "rejected")
    task_decisions = {(d["task_id"], d["kind"]): d for d in ev.decisions}
    for r in ev.node_rejections:
        node = f"{r['graph']}.{r['node']}"
        f = draft("direction", f"node:{node}", f"Rejected direction: graph node {node}")
        f.section("Rejections", "graph", "node", "why")
        td = task_decisions.get((node, "rejected"))
        f.add("Rejections", f"graph node {r['node']} of {r['graph']} rejected: {r['reason']}",
              [r["event_id"], *r["evidence"], td["decision_id"] if td else ""],
              (r["graph"], str(r["node"]), r["reason"]), None, "rejected")


def _summary(d: Draft) -> str:
    n = {s.name: sum(f.section == s.name for f in d.findings) for s in d.sections}
    points = len(d.points)
    if d.kind == "flag":
        kinds = [f.row[3] for f in d.findings if f.section == "Decisions" and f.row]
        return (f"{count(len(kinds), 'block')}: {kinds.count('accepted')} accepted, "
                f"{kinds.count('rejected')} rejected, on {count(points, 'point')}")
    if d.kind == "pairing":
        return f"{count(n.get('Tasks', 0), 'task')} on {count(points, 'point')}"
    if d.kind == "failure":
        return count(n.get("Occurrences", 0), "occurrence")
    k = n.get("Rejections", 0)
    return (f"rejected {'once' if k == 1 else count(k, 'time')}"
            + (", and it keeps coming back" if k >= RECURRING else ""))
