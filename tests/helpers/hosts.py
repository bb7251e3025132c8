"""A simulated host on a shared ledger (tests/ledger/test_ledger_backends.py): one process with its
own node identity (`FORGE_NODE`, read through harness/nodes/identity.py `local_host()`) that
runs a scripted share of work through the real writers. Run from the repository root:

  python -m tests.helpers.hosts host HOME SPEC TASKS ROUNDS
      Opens the workspace and prints READY. On `go`: `work()` (TASKS manual tasks, each with a
      measurement on the shared `measurements` stream, an approval asked and granted on the
      shared `approvals` stream and a claim of one of its own GPUs on the shared `claims`
      stream), then WORKED. Then ROUNDS rounds in which every host, released at once by the
      test, claims the same GPU: it prints `WON` or `REFUSED <holder named>`; on `release`
      the winner gives it back and each prints RELEASED. On `quit`: its own GPUs released,
      then one JSON line of what it wrote.
  python -m tests.helpers.hosts project HOME
      Rebuilds HOME's DuckDB index from the ledger and prints one JSON line: the index's
      fingerprint and row counts, every task's Task Memory (digest), the approvals and the
      claims folds.

`run` is also called in-process (the same scripted run on each backend).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infer_forge.harness.guard.approvals import decide, person, request
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    exit_task,
    handoff_block,
    record_measurement,
    start_block,
    verify_block,
)
from infer_forge.harness.nodes import claims
from infer_forge.harness.nodes.identity import local_host
from infer_forge.harness.record import record_measurements
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import Workspace, open_workspace

METRICS = {"median_ttft_ms": 50.0, "token_match": 1.0, "completed": 64.0, "failed": 0.0}


def work(ws: Workspace, spec: Path, tasks: int) -> dict[str, Any]:
    """This host's tasks, shared measurements, approvals and claims; what it wrote."""
    host = local_host()
    out: dict[str, Any] = {"host": host, "tasks": [], "runs": [], "approvals": [],
                           "claims": [], "commands": []}
    for i in range(tasks):
        tid = f"{host}-t{i}"
        define_task(ws, spec, task_id=tid)
        start_block(ws, tid, "baseline")
        for m in range(2):
            record_measurement(ws, tid, {"output_throughput": 100.0 + i + m, **METRICS})
        verify_block(ws, tid)
        handoff_block(ws, tid, state_reached="baseline measured", findings=[f"on {host}"])
        exit_task(ws, tid, "follow-up-handoff", "scripted", handoff=f"next after {host}")
        out["tasks"].append(tid)
        run, cid = f"{host}-m{i}", f"{host}:measure:{i}"
        record_measurements(ws, [E.MeasurementRecorded(
            run_id=run, source="hosts", metrics={"output_throughput": 10.0 * i, **METRICS},
            meta={"host": host})], task_id=None, command_id=cid)
        out["runs"].append(run)
        out["commands"].append(cid)
        aid = request(ws, "cleanup", f"{host}/gpu:{i}", {"pids": [1000 + i]},
                      f"free GPU {i} of {host}", E.Actor.human(f"runner-{host}"))
        decide(ws, aid, True, "scripted", person("ops"))
        out["approvals"].append(aid)
        own = claims.claim(ws, [E.ResourceRef(host=host, kind="gpu", id=f"GPU-{host}-{i}")],
                           claim_id=f"{host}-own-{i}", purpose=f"task {tid}")
        out["claims"].append(own.claim_id)
    return out


def contend(ws: Workspace, round_: int) -> tuple[str | None, str]:
    """Claim the GPU every host wants in this round: (claim id, 'WON') or (None, 'REFUSED
    <why>', naming the holder)."""
    host = local_host()
    gpu = E.ResourceRef(host="shared", kind="gpu", id=f"GPU-shared-{round_}")
    try:
        c = claims.claim(ws, [gpu], claim_id=f"{host}-shared-{round_}", purpose="contended")
    except claims.ClaimConflict as e:
        return None, f"REFUSED {e}"
    return c.claim_id, "WON"


def run(ws: Workspace, spec: Path, tasks: int, rounds: int,
        step: Callable[[str, str], None] = lambda _said, _wait: None) -> dict[str, Any]:
    """The whole scripted run. `step(say, wait_for)` is where the host process talks to the
    test (prints `say`, waits for the line `wait_for`); in-process it does nothing."""
    step("READY", "go")
    out = work(ws, spec, tasks)
    out["won"] = []
    step("WORKED", "claim")
    for r in range(rounds):
        won, said = contend(ws, r)
        step(said, "release")
        if won is not None:
            claims.release(ws, won, "round over")
            out["won"].append(won)
        step("RELEASED", "claim" if r + 1 < rounds else "quit")
    for c in out["claims"]:
        claims.release(ws, c, "done")
    return out


def project(home: Path) -> dict[str, Any]:
    """What the read side makes of the ledger, from this home (index rebuilt here)."""
    from infer_forge.projections import index as I
    from infer_forge.projections.approvals import read_approvals
    from infer_forge.projections.memory import list_tasks, task_memory
    from infer_forge.projections.nodes import read_claims

    ws = open_workspace(home)
    with ws:
        with I.open_index(ws, rebuild=True) as s:
            index = {"fingerprint": I.fingerprint(s.con), "position": I.tracked_position(s.con),
                     "rows": {t: s.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                              for t in I.TABLES}}
        memories = {}
        for t in list_tasks(ws.ledger):
            mem = task_memory(ws.ledger, t["task_id"]).model_dump_json()
            memories[t["task_id"]] = hashlib.sha256(mem.encode()).hexdigest()
        book = read_approvals(ws.ledger)
        approvals = [a.as_dict(a.requested_at) for a in book.approvals.values()]
        held = [{"claim_id": c.claim_id, "resources": [str(r) for r in c.resources],
                 "holder": c.holder.model_dump(mode="json"), "state": c.state,
                 "claimed_at": c.claimed_at.isoformat(), "end_reason": c.end_reason,
                 "ended_at": c.ended_at.isoformat() if c.ended_at else None}
                for c in read_claims(ws.ledger).claims.values()]
    return {"index": index, "memories": memories, "approvals": approvals, "claims": held}


def main(argv: list[str]) -> None:
    cmd, home, *rest = argv
    if cmd == "project":
        print(json.dumps(project(Path(home))), flush=True)
        return
    if cmd != "host":
        raise SystemExit(f"unknown command {cmd!r}")
    spec, tasks, rounds = Path(rest[0]), int(rest[1]), int(rest[2])

    def step(say: str, wait_for: str) -> None:
        print(say, flush=True)
        got = sys.stdin.readline().strip()
        if got != wait_for:
            raise SystemExit(f"{local_host()}: expected {wait_for!r} from the test, got {got!r}")

    ws = open_workspace(home)
    with ws:
        out = run(ws, spec, tasks, rounds, step)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
