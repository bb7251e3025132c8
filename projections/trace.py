"""The traceable path (`forge trace ID`): from a deliverable, decision, measurement, tool call
or verification back through everything that led to it, and forward to what it fed.

Contract:
- `find_event(ledger, ident)`: the event whose id is `ident` or starts with it (at least
  `MIN_PREFIX` characters); `NotFoundError` with one line when none is, or when the prefix is
  not unique, or when the event is not of a kind that has a path (`TRACEABLE`).
- `trace(ws, ident)`: the chain as one dict (what `--json` prints): `task` → `block` (with
  its `routing`) → `tool_calls` (argv, cwd, exit code, repo snapshot id and digest, sandbox
  kind, stdout/stderr artifacts) → `measurements` (metrics, artifacts, invalidations) →
  `verification` (each gate with its numbers, each step) → `decision` → `handoff` →
  `graph_edges` (the HandoffDelivered events on graph streams whose verification is this
  task's, or a graph node's whose `task-loop` check names this task) and `artifacts` (every
  digest named, with its path under FORGE_HOME/artifacts and whether it is there).
  `focus` names the traced event; `kind` what it is.
- `traces_for(ws, decisions)`: the same chain for many decisions (the wiki's decision pages),
  each task stream read once and the graph streams once.
- `chain_lines(chain)`: the human rendering, one line per fact.

Reads only (Task Memory, the task's stream, the graph streams' handoffs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..ledger import codec
from ..ledger import events as E
from ..ledger.errors import NotFoundError
from ..ledger.ids import shown
from ..ledger.payloads import Digest
from ..ledger.store import Ledger, Recorded
from ..ledger.streams import ENGINES_STREAM, task_of, task_stream
from ..ledger.workspace import Workspace
from .memory import BlockRecord, TaskMemory, build_memory

MIN_PREFIX = 8
TRACEABLE = {E.DeliverableAccepted.TYPE: "deliverable", E.DirectionRejected.TYPE: "decision",
             E.MeasurementRecorded.TYPE: "measurement", E.ToolInvoked.TYPE: "tool-call",
             E.VerificationRecorded.TYPE: "verification"}
_ID = re.compile(r"[0-9a-f-]+")



def host_line(h: dict[str, Any]) -> str:
    """One line of a run's host state (its meta's `host`, harness/nodes/host_state.py)."""
    def num(v: Any, fmt: str = ".2g") -> str:
        return "?" if v is None else format(v, fmt)

    parts = [f"load {num(h.get('load1'))} on {h.get('cores', '?')} cores",
             f"others' CPU {num(h.get('foreign_cpu'))}"]
    if h.get("psi_cpu_some_avg10") is not None:
        parts.append(f"cpu pressure {h['psi_cpu_some_avg10']:g}%")
    for g in h.get("gpus") or []:
        parts.append(f"GPU {g.get('index')}: SM {num(g.get('sm_clock_mhz'), 'd')} MHz, "
                     f"{num(g.get('power_w'), 'g')}/{num(g.get('power_cap_w'), 'g')} W, "
                     f"{num(g.get('temperature_c'), 'd')} C"
                     + (f", {'+'.join(g['throttle'])}" if g.get("throttle") else "")
                     + (f", {len(g['foreign'])} foreign" if g.get("foreign") else ""))
    return "; ".join(parts)

def find_event(ledger: Ledger, ident: str) -> Recorded:
    ident = ident.strip().lower()
    if len(ident.replace("-", "")) < MIN_PREFIX or not _ID.fullmatch(ident):
        raise NotFoundError(f"{shown(ident)} is not an event id or a prefix of one (at least "
                            f"{MIN_PREFIX} hex digits; forge task memory TASK shows them)")
    needle = b'"event_id":"' + ident.encode()
    found: list[tuple[int, str, int, str, bytes]] = []
    for row in ledger.rows(types=list(TRACEABLE)):
        if needle in row[4]:
            found.append(row)
            if len(found) > 1:
                break
    if not found:
        raise NotFoundError(f"no deliverable, decision, measurement, tool call or "
                            f"verification has id {shown(ident)}")
    if len(found) > 1:
        raise NotFoundError(f"event id prefix {shown(ident)} is not unique: give more of it")
    pos, stream, version, topic, state = found[0]
    return Recorded(pos, stream, version, codec.decode(stream, version, topic, state))


def trace(ws: Workspace, ident: str) -> dict[str, Any]:
    rec = find_event(ws.ledger, ident)
    task_id = task_of(rec.stream) or rec.event.task_id
    if task_id is None:
        raise NotFoundError(f"event {rec.event.event_id} is not in a task stream "
                            f"({rec.stream}): it has no path to trace")
    events = [r.event for r in ws.ledger.stream(task_stream(task_id))]
    feeds = _graph_feeds(ws.ledger)
    engines = _engine_events(ws.ledger).get(task_id, [])
    return _chain(ws, task_id, events, build_memory(events), rec.event, feeds, engines)


def traces_for(ws: Workspace, decisions: Iterable[tuple[str, str]], stop: int | None = None
               ) -> dict[str, dict[str, Any]]:
    """(task id, decision event id) pairs -> their chains, from the ledger up to position
    `stop` (the wiki: the index's position, so its pages agree); undecodable events are left
    out."""
    by_task: dict[str, set[str]] = {}
    for tid, did in decisions:
        by_task.setdefault(tid, set()).add(did)
    if not by_task:
        return {}
    feeds = _graph_feeds(ws.ledger, stop)
    engines = _engine_events(ws.ledger, stop)
    out: dict[str, dict[str, Any]] = {}
    for tid, ids in by_task.items():
        events = [r.event for r in ws.ledger.stream_log(task_stream(tid), stop,
                                                        on_error=lambda u: None)]
        mem = build_memory(events)
        for ev in events:
            if str(ev.event_id) in ids:
                out[str(ev.event_id)] = _chain(ws, tid, events, mem, ev, feeds,
                                               engines.get(tid, []))
    return out


# --- the chain ----------------------------------------------------------------------------


def _artifact(ws: Workspace, digest: str | None, what: str,
              seen: dict[str, dict[str, Any]]) -> str | None:
    if not digest:
        return None
    if digest not in seen and digest.startswith("sha256:") and len(digest) == 71:
        h = digest.removeprefix("sha256:")
        path = Path(ws.artifacts.root) / "sha256" / h[:2] / h[2:]
        try:
            relative = str(path.relative_to(ws.home))
        except ValueError:  # an artifact store outside FORGE_HOME
            relative = str(path)
        seen[digest] = {"digest": digest, "what": what, "path": str(path),
                        "relative": relative, "exists": path.is_file()}
    return digest


def _tool_call(ws: Workspace, ev: E.ToolInvoked, arts: dict[str, dict[str, Any]]
               ) -> dict[str, Any]:
    sandbox = getattr(ev, "sandbox", None) or {}
    return {"event_id": str(ev.event_id), "tool": ev.tool, "argv": list(ev.argv),
            "cwd": ev.cwd, "exit_code": ev.exit_code, "duration_s": ev.duration_s,
            "error": ev.error, "repo_snapshot": ev.input_digests.get(Digest.REPO_SNAPSHOT),
            "repo_digest": ev.repo_digest, "env_digest": ev.env_digest,
            "sandbox": sandbox.get("kind") if isinstance(sandbox, dict) else None,
            "stdout": _artifact(ws, ev.stdout_digest, f"stdout of {ev.tool}", arts),
            "stderr": _artifact(ws, ev.stderr_digest, f"stderr of {ev.tool}", arts)}


def _engine_events(ledger: Ledger, stop: int | None = None) -> dict[str, list[E.Event]]:
    """Engine launches and stops a task's evaluator recorded on the `engines` stream (they
    name the task and block), by task."""
    out: dict[str, list[E.Event]] = {}
    for r in ledger.stream_log(ENGINES_STREAM, stop, on_error=lambda u: None):
        if r.event.task_id is not None:
            out.setdefault(r.event.task_id, []).append(r.event)
    return out


def _chain(ws: Workspace, task_id: str, events: list[E.Event], mem: TaskMemory,
           focus: E.Event, feeds: list[dict[str, Any]], engine_events: Iterable[E.Event] = ()
           ) -> dict[str, Any]:
    arts: dict[str, dict[str, Any]] = {}
    block_id = focus.block_id
    if block_id is None and isinstance(focus, E.DeliverableAccepted | E.DirectionRejected):
        block_id = _block_of_verification(events, focus)
    blk: BlockRecord | None = mem.block(block_id) if block_id else None
    # The block's events, with the engines it launched (on their own stream), in time order.
    in_block = sorted((e for e in [*events, *engine_events]
                       if block_id is not None and e.block_id == block_id),
                      key=lambda e: e.occurred_at)
    d = mem.definition
    chain: dict[str, Any] = {
        "focus": str(focus.event_id), "kind": TRACEABLE.get(focus.TYPE, focus.TYPE),
        "task": {"task_id": task_id, "title": d.get("title"), "type": d.get("type"),
                 "goal": d.get("goal"), "status": mem.status, "exit_state": mem.exit_state,
                 "definition_hash": mem.definition_hash, "point_hash": mem.point_hash,
                 "profile_hash": mem.profile_hash},
        "block": None, "routing": {}, "tool_calls": [], "measurements": [],
        "verification": None, "decision": None, "handoff": None, "graph_edges": [],
    }
    if blk is not None:
        chain["block"] = {"block_id": blk.block_id, "index": blk.index,
                          "sub_goal": blk.sub_goal, "candidate": blk.candidate,
                          "started_at": blk.started_at, "status": blk.status,
                          "config_digest": blk.config_digest}
        chain["routing"] = dict(blk.routing)
    invalid = {str(e.measurement_event_id): e.reason for e in in_block
               if isinstance(e, E.MeasurementInvalidated)}
    verification: E.VerificationRecorded | None = None
    engines: dict[str, dict[str, Any]] = {}  # url -> its launch, as a tool call
    for e in in_block:
        if isinstance(e, E.ToolInvoked):
            chain["tool_calls"].append(_tool_call(ws, e, arts))
        elif isinstance(e, E.EngineLaunched):  # the engine a block measured: a tool call too
            engines[e.url] = call = {
                "event_id": str(e.event_id), "tool": f"engine {e.engine}",
                "argv": list(e.command), "cwd": None, "exit_code": None, "duration_s": None,
                "error": None, "repo_snapshot": e.input_digests.get(Digest.REPO_SNAPSHOT),
                "repo_digest": None, "env_digest": None, "sandbox": None,
                "stdout": _artifact(ws, e.log_digest, f"log of engine {e.engine}", arts)}
            chain["tool_calls"].append(call)
        elif isinstance(e, E.EngineStopped) and e.url in engines:
            engines[e.url]["exit_code"] = e.exit_code
            engines[e.url]["stdout"] = _artifact(ws, e.log_digest, f"log of engine {e.engine}",
                                                 arts) or engines[e.url]["stdout"]
        elif isinstance(e, E.MeasurementRecorded):
            chain["measurements"].append({
                "event_id": str(e.event_id), "run_id": e.run_id, "repeat": e.repeat,
                "source": e.source, "success": e.success, "error": e.error,
                "metrics": dict(e.metrics),
                "repo_snapshot": e.input_digests.get(Digest.REPO_SNAPSHOT),
                "artifact": _artifact(ws, e.artifact_digest, f"records of {e.run_id}", arts),
                "invalidated": invalid.get(str(e.event_id)),
                **({"host": host_line(e.meta["host"]),
                    "contaminated": list(e.meta.get("contaminated") or [])}
                   if isinstance(e.meta.get("host"), dict) else {})})
            for k, v in sorted(e.meta.items()):  # server info, greedy outputs, stdout …
                if k.endswith("_digest") and isinstance(v, str):
                    _artifact(ws, v, f"{k.removesuffix('_digest')} of {e.run_id}", arts)
        elif isinstance(e, E.VerificationRecorded):
            verification = e  # the block's latest
        elif isinstance(e, E.DeliverableAccepted | E.DirectionRejected):
            chain["decision"] = _decision(e)
        elif isinstance(e, E.LoopBlockHandedOff):
            chain["handoff"] = {"event_id": str(e.event_id), "outcome": e.outcome,
                                "state_reached": e.state_reached, "findings": list(e.findings),
                                "next_sub_goal": e.next_sub_goal}
    if isinstance(focus, E.DeliverableAccepted | E.DirectionRejected):
        chain["decision"] = _decision(focus)
    if isinstance(focus, E.DeliverableAccepted) and focus.verification_event_id is not None:
        # The verification the acceptance names (a block may have been verified again).
        verification = next((e for e in events if isinstance(e, E.VerificationRecorded)
                             and e.event_id == focus.verification_event_id), verification)
    if isinstance(focus, E.VerificationRecorded):
        verification = focus
    if isinstance(focus, E.ToolInvoked) and block_id is None:  # a task-level tool call
        chain["tool_calls"].append(_tool_call(ws, focus, arts))
    if verification is not None:
        chain["verification"] = {
            "event_id": str(verification.event_id), "verdict": verification.verdict,
            "passed": verification.passed, "contract_hash": verification.contract_hash,
            "gates": [g.model_dump(exclude_defaults=True) for g in verification.gates],
            "steps": [s.model_dump() for s in verification.steps],
            "evidence": list(verification.evidence)}
    vids = {str(e.event_id) for e in events if isinstance(e, E.VerificationRecorded)}
    chain["graph_edges"] = [f for f in feeds
                            if f["verification_event_id"] in vids or task_id in f["tasks"]]
    chain["artifacts"] = list(arts.values())
    return chain


def _decision(e: E.DeliverableAccepted | E.DirectionRejected) -> dict[str, Any]:
    if isinstance(e, E.DeliverableAccepted):
        return {"event_id": str(e.event_id), "kind": "accepted", "candidate": dict(e.candidate),
                "summary": e.summary, "evidence": list(e.evidence),
                "verification_event_id": str(e.verification_event_id or "") or None}
    return {"event_id": str(e.event_id), "kind": "rejected", "candidate": dict(e.candidate),
            "reason": e.reason, "evidence": list(e.evidence)}


def _block_of_verification(events: list[E.Event], decision: E.Event) -> str | None:
    vid = getattr(decision, "verification_event_id", None)
    for e in events:
        if isinstance(e, E.VerificationRecorded) and e.event_id == vid:
            return e.block_id
    return None


def _graph_feeds(ledger: Ledger, stop: int | None = None) -> list[dict[str, Any]]:
    """Every delivered handoff on a graph stream, with the tasks whose work it carried
    (`tasks`: the node's own task, and the loop task its `task-loop` check judged)."""
    verified: dict[str, tuple[str | None, list[str]]] = {}
    delivered: list[tuple[str, E.HandoffDelivered]] = []
    for r in ledger.log(1, stop, types=[E.NodeVerified.TYPE, E.HandoffDelivered.TYPE],
                        on_error=lambda u: None):
        ev = r.event
        if isinstance(ev, E.NodeVerified) and ev.verification_event_id is not None:
            verified[str(ev.verification_event_id)] = (
                ev.task_id, [c.task for c in ev.checks if c.task])
        elif isinstance(ev, E.HandoffDelivered):
            delivered.append((r.stream, ev))
    out: list[dict[str, Any]] = []
    for stream, ev in delivered:
        vid = str(ev.verification_event_id) if ev.verification_event_id else ""
        node_task, loops = verified.get(vid, (None, []))
        graph = stream.split(":", 1)[1] if ":" in stream else stream
        out.append({"graph": graph, "edge": ev.edge, "src": ev.src, "dst": ev.dst,
                    "attempt": ev.attempt, "event_id": str(ev.event_id),
                    "deliverable_digest": ev.deliverable_digest,
                    "verification_event_id": vid,
                    "tasks": [t for t in [node_task, *loops] if t]})
    return out


# --- the human rendering ------------------------------------------------------------------


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def gate_line(g: dict[str, Any]) -> str:
    """One gate with its numbers: `throughput pass: median 130 over 3 (baseline 100, ratio
    1.3 [1.2, 1.4]) vs threshold 1.05 (at_least)`."""
    parts = [f"{g.get('name')} {g.get('verdict')}:"]
    if g.get("metric"):
        parts.append(g["metric"])
    if g.get("median") is not None:
        parts.append(f"median {_num(g['median'])} over {g.get('n', 0)}")
    if g.get("baseline_median") is not None:
        parts.append(f"(baseline {_num(g['baseline_median'])}"
                     + (f", ratio {_num(g['ratio'])}" if g.get("ratio") is not None else "")
                     + (f" CI [{', '.join(_num(x) for x in g['ci'])}]" if g.get("ci") else "")
                     + ")")
    if g.get("cv") is not None:
        parts.append(f"cv {_num(g['cv'])}")
    if g.get("threshold") is not None:
        parts.append(f"vs {g.get('direction') or 'threshold'} {_num(g['threshold'])}")
    if g.get("failed_runs"):
        parts.append(f"{g['failed_runs']} failed runs")
    if g.get("task"):
        parts.append(f"task {g['task']}")
    if g.get("reason"):
        parts.append(f"— {g['reason']}")
    return " ".join(parts)


def chain_lines(c: dict[str, Any]) -> list[str]:
    t = c["task"]
    out = [f"trace {c['focus']} ({c['kind']})",
           f"task {t['task_id']}: {t.get('type') or ''} — {t.get('goal') or ''} "
           f"[{t['status']}{' ' + t['exit_state'] if t.get('exit_state') else ''}]",
           f"  definition {t.get('definition_hash')}  point {t.get('point_hash')}  "
           f"profile {t.get('profile_hash')}"]
    b = c.get("block")
    if b is None:
        out.append("block: (none)")
    else:
        out.append(f"block {b['block_id']} (#{b['index']}): {b['sub_goal']}; candidate "
                   f"{b['candidate'] or '{} (baseline)'}")
        r = c.get("routing") or {}
        out.append("  routing: " + (", ".join(f"{k} {v}" for k, v in sorted(r.items()))
                                   or "(none)"))
    out.append(f"  tool calls: {len(c['tool_calls'])}")
    for x in c["tool_calls"]:
        out.append(f"    {x['event_id'][:8]} {x['tool']}: {' '.join(x['argv'])}  exit "
                   f"{x['exit_code']}" + (f", {x['duration_s']:.3f}s" if x["duration_s"]
                                          is not None else "")
                   + (f", sandbox {x['sandbox']}" if x.get("sandbox") else ""))
        out.append(f"      snapshot {x['repo_snapshot'] or '—'}  repo {x['repo_digest'] or '—'}"
                   f"  stdout {x['stdout'] or '—'}")
    out.append(f"  measurements: {len(c['measurements'])}")
    # The metrics the gates judged first; a run's other metrics are in --json.
    judged = {g.get("metric") for g in (c.get("verification") or {}).get("gates", [])} - {None}
    for m in c["measurements"]:
        shown = {k: v for k, v in m["metrics"].items() if k in judged} or m["metrics"]
        metrics = ", ".join(f"{k} {_num(v)}" for k, v in sorted(shown.items()))
        if len(shown) < len(m["metrics"]):
            metrics += f" (+{len(m['metrics']) - len(shown)} more in --json)"
        out.append(f"    {m['event_id'][:8]} {m['run_id']} (repeat {m['repeat']}, "
                   f"{m['source']}{'' if m['success'] else ', failed'}): {metrics}"
                   + (f"  [invalidated: {m['invalidated']}]" if m.get("invalidated") else "")
                   + (f"  [contaminated: {'; '.join(m['contaminated'])}]"
                      if m.get("contaminated") else ""))
    v = c.get("verification")
    if v is None:
        out.append("  verification: (none)")
    else:
        out.append(f"  verification {v['event_id'][:8]}: {v['verdict']}")
        for g in v["gates"]:
            out.append(f"    gate {gate_line(g)}")
        for s in v["steps"]:
            out.append(f"    step {s.get('name')} ({s.get('kind')}): {s.get('outcome')}")
    dec = c.get("decision")
    if dec is None:
        out.append("  decision: (none)")
    else:
        why = dec.get("summary") if dec["kind"] == "accepted" else dec.get("reason")
        out.append(f"  decision {dec['event_id'][:8]}: {dec['kind']} {dec['candidate'] or '{}'}"
                   f" — {why or ''}")
    h = c.get("handoff")
    out.append("  handoff: (none)" if h is None else
               f"  handoff {h['event_id'][:8]}: {h['outcome']}, {h['state_reached'] or '—'}"
               + (f"; next: {h['next_sub_goal']}" if h.get("next_sub_goal") else ""))
    out.append(f"  graph edges fed: {len(c['graph_edges'])}")
    for e in c["graph_edges"]:
        out.append(f"    graph {e['graph']}: {e['src']} -> {e['dst']} (attempt {e['attempt']},"
                   f" {e['event_id'][:8]})")
    if c["artifacts"]:
        out.append("  artifacts:")
        for a in c["artifacts"]:
            out.append(f"    {a['digest']} {a['what']}: {a['path']}"
                       + ("" if a["exists"] else " (missing)"))
    return out
