"""The checks of `forge wiki lint` that need the whole record, not just the journal's files.

A *finding* is an accepted decision: its candidate, at its task's deployment point and runtime
profile (`service@rev`), with the effect it measured on each metric its verification gated
(the candidate block's median over the task's baseline block's median, minus one).

- **Contradictions** (errors): two findings of the same candidate on the same point whose
  effects on one gated metric differ by more than the point's noise allows: `K_BAND` times
  the metric's learned run-to-run CV there (`projections.noise.point_bands`), or times
  `DEFAULT_CV` where history supports no band. (Each effect is a ratio of two medians, each
  off by about one CV, so two effects differ by about 2·CV by chance; `K_BAND` = 4 asks for
  twice that.)
- **Stale claims** (warnings): a finding whose runtime profile service has a newer revision
  and that no passing verification re-checked on the newest one. A verification re-checks it
  when it ran on a point of the same service at that revision, and the profile's config with
  the verified candidate applied holds every `engine.<flag>` value of the finding's candidate
  (so a newer revision that folded the flag in, verified as its baseline, counts).
- **Concepts without a page** (warnings): concepts the record shows (`concepts_known`), and
  flag settings a handoff or a decision's reason mentions (`engine.<flag>=<value>`), that
  have no page in the concept catalog.

Reads the index (caught up first) and the noise bands (projections); writes nothing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..ledger.workspace import Workspace
from ..projections.index import open_index
from .concepts.model import concept_path, concept_slug

K_BAND = 4.0
DEFAULT_CV = 0.05  # the run-to-run CV assumed where history supports no learned band
ENGINE = "engine."

FINDINGS_SQL = """
SELECT d.decision_id, d.task_id, d.block_id, d.candidate_key, d.candidate, d.position,
       d.verification_event_id, t.point_hash, t.runtime_profile
FROM decisions d JOIN tasks t USING (task_id)
WHERE d.kind = 'accepted' AND d.candidate_key <> '{}'
ORDER BY d.position, d.decision_id
"""
GATED_SQL = """
SELECT DISTINCT verification_id, metric FROM gate_verdicts
WHERE metric IS NOT NULL AND verification_id IN (SELECT unnest($1::VARCHAR[]))
"""
MEDIANS_SQL = """
SELECT m.task_id, m.block_id, m.candidate_key, m.metric, m.median
FROM metric_summary m LEFT JOIN loop_blocks b USING (task_id, block_id)
WHERE m.task_id IN (SELECT unnest($1::VARCHAR[]))
ORDER BY m.task_id, b.block_index NULLS LAST, m.block_id, m.metric
"""
REVS_SQL = "SELECT service, rev, config FROM runtime_profiles"
MENTIONS_SQL = """
SELECT event_id, concat_ws(' ', state_reached, array_to_string(findings, ' '), next_sub_goal)
FROM handoffs WHERE event_id IS NOT NULL
UNION ALL
SELECT decision_id, reason FROM decisions
"""
# `engine.<flag>=<value>` written in a handoff or a decision's reason (values as JSON or bare)
MENTION = re.compile(r"(?<![\w.])(engine\.[A-Za-z0-9_]+)="
                     r"(\"[^\"\s]{1,80}\"|[A-Za-z0-9_.+\-]{1,80})")
VERIFIED_SQL = """
SELECT v.event_id, v.task_id, v.block_id, v.candidate, t.runtime_profile
FROM verifications v JOIN tasks t USING (task_id) WHERE v.passed
"""


@dataclass
class Finding:
    decision_id: str
    task_id: str
    block_id: str | None
    candidate_key: str
    candidate: dict[str, Any]
    point_hash: str | None
    runtime_profile: str | None
    position: int
    effects: dict[str, float] = field(default_factory=dict)  # gated metric -> relative effect
    medians: dict[str, tuple[float, float]] = field(default_factory=dict)  # (candidate, base)

    def brief(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "task_id": self.task_id,
                "block_id": self.block_id, "runtime_profile": self.runtime_profile}


@dataclass
class RecordReport:
    findings: int = 0
    contradictions: list[dict[str, Any]] = field(default_factory=list)
    stale_claims: list[dict[str, Any]] = field(default_factory=list)
    missing_concepts: list[dict[str, Any]] = field(default_factory=list)
    known_concepts: dict[str, str] = field(default_factory=dict)  # page path -> concept key


def _split(rp: str | None) -> tuple[str, int] | None:
    if not rp or "@" not in rp:
        return None
    service, _, rev = rp.rpartition("@")
    return (service, int(rev)) if rev.isdigit() else None


def _obj(v: Any) -> dict[str, Any]:
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return {}
    return v if isinstance(v, dict) else {}


def load_findings(con: Any) -> list[Finding]:
    """Every accepted decision with its effect on each metric its verification gated."""
    rows = con.execute(FINDINGS_SQL).fetchall()
    out = [Finding(str(r[0]), r[1], r[2], r[3], _obj(r[4]), r[7], r[8], int(r[5]))
           for r in rows]
    if not out:
        return out
    vids = [str(r[6]) for r in rows if r[6]]
    gated: dict[str, set[str]] = defaultdict(set)
    for vid, metric in con.execute(GATED_SQL, [vids]).fetchall():
        gated[vid].add(metric)
    med: dict[tuple[str, str | None, str], dict[str, float]] = defaultdict(dict)
    base: dict[str, dict[str, float]] = defaultdict(dict)
    for tid, bid, ckey, metric, median in con.execute(
            MEDIANS_SQL, [sorted({f.task_id for f in out})]).fetchall():
        if median is None:
            continue
        med[(tid, bid, ckey)][metric] = float(median)
        if ckey == "{}":
            base[tid].setdefault(metric, float(median))  # the first baseline block's
    for f, r in zip(out, rows, strict=True):
        mine = med.get((f.task_id, f.block_id, f.candidate_key), {})
        for metric in sorted(gated.get(str(r[6]), ())):
            b, c = base[f.task_id].get(metric), mine.get(metric)
            if b is not None and c is not None and b != 0:
                f.effects[metric] = c / b - 1.0
                f.medians[metric] = (c, b)
    return out


def contradictions(findings: list[Finding], cvs: dict[tuple[str, str], float | None]
                   ) -> list[dict[str, Any]]:
    """Pairs of findings (same point, same candidate) whose effects on one metric differ
    beyond `K_BAND` × the (point, metric) CV (`cvs`; None or missing: `DEFAULT_CV`). Pure."""
    groups: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        if f.point_hash:
            groups[(f.point_hash, f.candidate_key)].append(f)
    out = []
    for (ph, ckey), fs in sorted(groups.items()):
        for i, a in enumerate(fs):
            for b in fs[i + 1:]:
                for metric in sorted(set(a.effects) & set(b.effects)):
                    learned = cvs.get((ph, metric))
                    cv = learned if learned is not None else DEFAULT_CV
                    diff = abs(a.effects[metric] - b.effects[metric])
                    if diff > K_BAND * cv:
                        out.append({
                            "point_hash": ph, "candidate": ckey, "what": describe(a.candidate),
                            "concepts": flag_pages(a.candidate), "metric": metric,
                            "a": {**a.brief(), "effect": round(a.effects[metric], 4),
                                  "medians": a.medians.get(metric)},
                            "b": {**b.brief(), "effect": round(b.effects[metric], 4),
                                  "medians": b.medians.get(metric)},
                            "difference": round(diff, 4), "tolerance": round(K_BAND * cv, 4),
                            "band": "learned" if learned is not None else "default",
                            "cv": cv})
    return out


def flag_pages(candidate: dict[str, Any]) -> list[str]:
    """The concept pages (`flag:<key>=<value>`, as wiki/concepts/evidence.py names them) of a
    candidate's settings."""
    return [concept_path(concept_slug(
        "flag", f"{k}={v if isinstance(v, str) else orjson.dumps(v).decode()}"))
        for k, v in sorted(candidate.items())]


def describe(candidate: dict[str, Any]) -> str:
    """`engine.flag=value, …` (values as JSON), or `baseline`."""
    return ", ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in sorted(candidate.items())
                     ) or "baseline"


def _holds(config: dict[str, Any], verified: dict[str, Any], cand: dict[str, Any]) -> bool:
    """Does a profile's config with a verified candidate applied hold `cand`'s values?"""
    effective = {**{ENGINE + k: v for k, v in config.items()}, **verified}
    return all(effective.get(k) == v for k, v in cand.items())


def stale_claims(findings: list[Finding], revs: dict[str, dict[int, dict[str, Any]]],
                 verified: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings whose service has a newer revision that no passing verification re-checked
    them on (module contract). `revs`: service -> rev -> config; `verified`: passing
    verifications with their `runtime_profile` and `candidate`. Pure."""
    out = []
    for f in findings:
        sr = _split(f.runtime_profile)
        if sr is None or not revs.get(sr[0]):
            continue
        service, rev = sr
        latest = max(revs[service])
        if latest <= rev:
            continue
        config = revs[service][latest]
        checks = [v for v in verified if _split(v["runtime_profile"]) == (service, latest)
                  and _holds(config, v["candidate"], f.candidate)]
        if not checks:
            out.append({**f.brief(), "candidate": f.candidate_key,
                        "point_hash": f.point_hash, "latest": f"{service}@{latest}",
                        "reason": f"accepted on {f.runtime_profile}; {service} is at rev "
                                  f"{latest} and no passing verification there holds it"})
    return out


def mentions(rows: list[tuple[str, str | None]]) -> dict[str, str]:
    """Flag concepts (`flag:engine.<flag>=<value>`) written in texts, each with the first
    event mentioning it. Pure."""
    out: dict[str, str] = {}
    for eid, txt in rows:
        for key, raw in MENTION.findall(txt or ""):
            raw = raw.rstrip(".")
            try:
                v = orjson.loads(raw)
            except orjson.JSONDecodeError:
                v = raw
            setting = v if isinstance(v, str) else orjson.dumps(v).decode()
            out.setdefault(f"flag:{key}={setting}", str(eid))
    return out


def _revisions(con: Any) -> tuple[dict[str, dict[int, dict[str, Any]]], list[dict[str, Any]]]:
    revs: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for service, rev, config in con.execute(REVS_SQL).fetchall():
        revs[service][int(rev)] = _obj(config)
    verified = [{"event_id": r[0], "task_id": r[1], "block_id": r[2],
                 "candidate": _obj(r[3]), "runtime_profile": r[4]}
                for r in con.execute(VERIFIED_SQL).fetchall()]
    return revs, verified


def stale_by_decision(con: Any) -> dict[str, str]:
    """Decision id -> why it is a stale claim, for every stale finding (on an open index)."""
    revs, verified = _revisions(con)
    return {x["decision_id"]: x["reason"]
            for x in stale_claims(load_findings(con), revs, verified)}


def check_record(ws: Workspace, concept_pages: set[str] | None = None,
                 concepts_known: Any = None) -> RecordReport:
    """Contradictions, stale claims and (given the journal's concept page paths and a
    `concepts_known(con) -> {path: concept key}`) concepts without a page."""
    # In the function for start-up time: `forge wiki ask` reads stale claims here without
    # the noise bands (~25 ms).
    from ..projections.noise import point_bands

    rep = RecordReport()
    with open_index(ws) as s:
        findings = load_findings(s.con)
        revs, verified = _revisions(s.con)
        known = concepts_known(s.con) if concepts_known is not None else {}
        said = mentions(s.con.execute(MENTIONS_SQL).fetchall())
    rep.findings = len(findings)
    wanted: dict[str, set[str]] = defaultdict(set)
    for f in findings:
        if f.point_hash:
            wanted[f.point_hash] |= set(f.effects)
    cvs: dict[tuple[str, str], float | None] = {}
    for ph, metrics in sorted(wanted.items()):
        bands = point_bands(ws.ledger, ph, sorted(metrics))
        for m in metrics:
            cvs[(ph, m)] = bands[m].cv if m in bands else None
    rep.contradictions = contradictions(findings, cvs)
    rep.stale_claims = stale_claims(findings, revs, verified)
    rep.known_concepts = dict(known)
    if concept_pages is not None:
        rep.missing_concepts = [{"page": p, "concept": name, "mentioned_in": None}
                                for p, name in sorted(known.items()) if p not in concept_pages]
        shown = set(known) | concept_pages
        for key, eid in sorted(said.items()):
            kind, _, value = key.partition(":")
            path = concept_path(concept_slug(kind, value))
            if path not in shown:
                rep.missing_concepts.append({"page": path, "concept": key, "mentioned_in": eid})
    return rep
