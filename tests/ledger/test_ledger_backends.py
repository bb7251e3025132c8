"""SQLite and PostgreSQL, side by side, beyond the store contract (tests/ledger/test_ledger_store.py
runs that on both): a multi-process graph run ends in the same state on each; several hosts
(processes with their own node identity) writing one PostgreSQL ledger lose and duplicate
nothing, and every process projects the same read side from it; one scripted run leaves the
same history on both backends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from infer_forge.harness.graph.commands import define_graph
from infer_forge.harness.graph.run import run_graph
from infer_forge.ledger import events as E
from infer_forge.ledger.check import check_workspace
from infer_forge.ledger.streams import (
    APPROVALS_STREAM,
    CLAIMS_STREAM,
    MEASUREMENTS_STREAM,
    WORKSPACE_STREAM,
    graph_stream,
    task_stream,
)
from infer_forge.ledger.workspace import Workspace, init_workspace
from infer_forge.projections.approvals import read_approvals
from infer_forge.projections.memory import task_memory

from tests.conftest import REPO
from tests.helpers import hosts

from ..harness.graph.test_graph_run import final_states, layered_graph
from ..harness.loop.test_loop import make_task_dir


def _workspace(home: Path, url: str | None) -> Workspace:
    return init_workspace(home, ledger_url=url)[0]


def _positions(ws: Workspace) -> list[int]:
    """Global positions, checked unique and increasing (PostgreSQL may skip values)."""
    positions = [r[0] for r in ws.ledger.rows()]
    assert positions == sorted(set(positions))
    return positions


# --- one multi-process graph run on each backend ------------------------------------------


def test_a_multi_worker_graph_run_ends_the_same_on_sqlite_and_postgres(tmp_path, pg_url,
                                                                       monkeypatch):
    yaml_path = layered_graph(tmp_path)
    monkeypatch.setenv("RENDEZVOUS", "2")  # two first-layer nodes must overlap
    ends = {}
    for backend, url in (("sqlite", None), ("postgres", pg_url)):
        with _workspace(tmp_path / f"home-{backend}", url) as ws:
            assert ws.config.backend == backend
            define_graph(ws, yaml_path)
            s = run_graph(ws, "layered", jobs=3)
            assert s.outcome == "completed", s
            assert s.peak_in_flight >= 2  # the worker processes really ran side by side
            evs = [r.event for r in ws.ledger.stream(graph_stream("layered"))]
            per_node = Counter((getattr(e, "node", None) or getattr(e, "edge", None), e.TYPE)
                               for e in evs if not isinstance(e, E.GraphRunStarted
                                                              | E.GraphRunFinished))
            # Every node started, verified and delivered exactly once, every handoff made
            # once: no lost or doubled claim of a node by the racing workers.
            assert len({n for n, t in per_node if t == "NodeStarted"}) == 16
            assert set(per_node.values()) == {1}, per_node
            ids = [r.event.event_id for r in ws.ledger.log()]
            assert len(ids) == len(set(ids))
            _positions(ws)
            report = check_workspace(ws)
            assert report.ok, report.problems
            ends[backend] = (final_states(ws, "layered"), per_node)
    assert len(ends["sqlite"][0]) == 16 + 26  # every task node and every edge
    assert ends["sqlite"] == ends["postgres"]


# --- several hosts, one PostgreSQL ledger ------------------------------------------------

HOSTS, TASKS, ROUNDS = 3, 2, 3


def _say(procs: list[subprocess.Popen], line: str) -> None:
    for p in procs:
        p.stdin.write(line + "\n")
        p.stdin.flush()


def _lines(procs: list[subprocess.Popen], errs: list[Path]) -> list[str]:
    """Each host's next line (a host that ended instead fails the test with its stderr)."""
    out = []
    for p, err in zip(procs, errs, strict=True):
        line = p.stdout.readline().strip()
        if not line:
            p.wait()
            raise AssertionError(f"host exited ({p.returncode}): {err.read_text()[-2000:]}")
        out.append(line)
    return out


def _hear(procs: list[subprocess.Popen], errs: list[Path], word: str) -> None:
    lines = _lines(procs, errs)
    assert lines == [word] * len(procs), lines


def test_hosts_writing_one_postgres_ledger_lose_nothing_and_project_alike(pg_home, pg_url,
                                                                          tmp_path):
    spec = make_task_dir(tmp_path / "specs", "spec")
    names = [f"host-{k}" for k in range(HOSTS)]
    errs = [tmp_path / f"{n}.err" for n in names]
    procs = []
    for name, err in zip(names, errs, strict=True):
        with err.open("w") as ef:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.hosts", "host", str(pg_home), str(spec),
                 str(TASKS), str(ROUNDS)], cwd=str(REPO), text=True, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=ef, env={**os.environ, "FORGE_NODE": name}))
    try:
        _hear(procs, errs, "READY")  # every host has its ledger open before any writes
        _say(procs, "go")
        _hear(procs, errs, "WORKED")
        for r in range(ROUNDS):
            _say(procs, "claim")  # all at once, on the same GPU
            said = _lines(procs, errs)
            won = [k for k, line in enumerate(said) if line == "WON"]
            # Exactly one host's claim lands; each other is refused naming the holder.
            assert len(won) == 1, said
            winner = f"{names[won[0]]}-shared-{r}"
            for k, line in enumerate(said):
                if k != won[0]:
                    assert line.startswith("REFUSED refused: shared/gpu:GPU-shared-"), line
                    assert f"claim {winner} " in line and f"on {names[won[0]]}," in line
            _say(procs, "release")
            _hear(procs, errs, "RELEASED")
        _say(procs, "quit")
        results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1])
                   for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * HOSTS
    assert [r["host"] for r in results] == names  # each wrote as its own node

    with _workspace(pg_home, None) as ws:
        ledger = ws.ledger
        log = list(ledger.log())
        assert len({r.event.event_id for r in log}) == len(log)
        _positions(ws)
        for r in results:
            for cid in r["commands"]:
                assert ledger.command_done(cid), cid
            for tid in r["tasks"]:
                mem = task_memory(ledger, tid)
                assert (mem.status, mem.exit_state) == ("exited", "follow-up-handoff")
                assert [b.block_id for b in mem.execution_record] == ["b1"]
                assert len(mem.execution_record[0].measurements) == 2
                versions = [x.version for x in ledger.stream(task_stream(tid))]
                assert versions == list(range(1, len(versions) + 1))
        # Every shared stream holds each host's writes exactly once, versions gap-free.
        shared = {s: ledger.stream(s) for s in (MEASUREMENTS_STREAM, APPROVALS_STREAM,
                                                CLAIMS_STREAM, WORKSPACE_STREAM)}
        for s, recs in shared.items():
            assert [x.version for x in recs] == list(range(1, len(recs) + 1)), s
        runs = Counter(x.event.run_id for x in shared[MEASUREMENTS_STREAM])
        assert runs == Counter(run for r in results for run in r["runs"])
        kinds = Counter(x.type for x in shared[APPROVALS_STREAM])
        assert kinds == Counter({"ApprovalRequested": HOSTS * TASKS,
                                 "ApprovalGranted": HOSTS * TASKS})
        book = read_approvals(ledger)
        assert {a for r in results for a in r["approvals"]} == set(book.approvals)
        assert {a.decision for a in book.approvals.values()} == {"granted"}
        claimed = Counter(x.event.claim_id for x in shared[CLAIMS_STREAM]
                          if isinstance(x.event, E.ResourceClaimed))
        released = Counter(x.event.claim_id for x in shared[CLAIMS_STREAM]
                           if isinstance(x.event, E.ClaimReleased))
        assert claimed == released == Counter(c for r in results
                                              for c in r["claims"] + r["won"])
        assert sorted(c.rsplit("-", 1)[1] for r in results for c in r["won"]) == [
            str(k) for k in range(ROUNDS)]  # one winner per round
        # The hosts shared one deployment point and profile: pinned once, however they raced.
        pins = Counter(x.type for x in shared[WORKSPACE_STREAM])
        assert pins["DeploymentPointPinned"] == pins["RuntimeProfileRevised"] == 1, pins
        report = check_workspace(ws)  # every save whole, every stream replays
        assert report.ok, report.problems
        events_in_log = len(log)

    # The read side, built by two separate processes from two fresh homes on the same ledger.
    readers = []
    for name in ("reader-a", "reader-b"):
        _workspace(tmp_path / name, pg_url).close()  # joins: its init is already recorded
        readers.append(subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.hosts", "project", str(tmp_path / name)],
            cwd=str(REPO), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    views = []
    for p in readers:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        views.append(json.loads(out.strip().splitlines()[-1]))
    assert views[0] == views[1]
    assert views[0]["index"]["rows"]["events"] == events_in_log
    assert set(views[0]["memories"]) == {t for r in results for t in r["tasks"]}
    assert len(views[0]["approvals"]) == HOSTS * TASKS
    assert len(views[0]["claims"]) == HOSTS * TASKS + ROUNDS
    assert {c["state"] for c in views[0]["claims"]} == {"released"}


# --- one scripted run, two backends, one history -----------------------------------------

# A UUID, dashed (event ids) or as 32 hex digits (generated command ids); not a 64-digit
# content digest, which must be equal as it is.
_UUID = re.compile(r"(?<![0-9a-f])(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                   r"[0-9a-f]{12}|[0-9a-f]{32})(?![0-9a-f])")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")


def history(ws: Workspace) -> list[tuple[Any, ...]]:
    """Every stored row in global order as (stream, version, type, payload), with what is
    random or a clock reading by design made comparable: a UUID (event ids, generated command
    ids, in payloads and stream names) becomes its order of first appearance, so the same id
    stays the same token; a timestamp becomes `<time>`; the home's path `<home>`; the
    backend's own name (WorkspaceInitialized.ledger_backend) `<backend>`; a save's seal (a
    hash of its payloads, ids and times included) `<sha256>`."""
    ids: dict[str, str] = {}

    def token(m: re.Match[str]) -> str:
        return ids.setdefault(m.group(0).replace("-", ""), f"<id{len(ids)}>")

    def norm(text: str) -> str:
        text = text.replace(str(ws.home), "<home>")
        return _TIME.sub("<time>", _UUID.sub(token, text))

    out = []
    for r in ws.ledger.log(include_bookkeeping=True):
        payload = r.event.model_dump(mode="json")
        if isinstance(r.event, E.WorkspaceInitialized):
            payload["ledger_backend"] = "<backend>"
        if isinstance(r.event, E.CommandHandled) and r.event.seal is not None:
            # The seal hashes the save's payloads as stored, ids and times included.
            payload["seal"] = "<sha256>" if len(r.event.seal) == 71 else r.event.seal
        out.append((norm(r.stream), r.version, r.type,
                    norm(json.dumps(payload, sort_keys=True))))
    return out


def test_sqlite_and_postgres_give_identical_histories_for_one_scripted_run(
        tmp_path, pg_url, monkeypatch):
    monkeypatch.setenv("FORGE_NODE", "host-a")
    spec = make_task_dir(tmp_path / "specs", "spec")
    runs = {}
    for backend, url in (("sqlite", None), ("postgres", pg_url)):
        with _workspace(tmp_path / f"home-{backend}", url) as ws:
            assert ws.config.backend == backend
            hosts.run(ws, spec, TASKS, ROUNDS)
            runs[backend] = history(ws)
    sqlite, postgres = runs["sqlite"], runs["postgres"]
    types = Counter(t for _, _, t, _ in sqlite)
    assert types["TaskDefined"] == TASKS and types["ResourceClaimed"] == TASKS + ROUNDS
    assert types["CommandHandled"] > 10 and len(sqlite) > 50
    assert sqlite == postgres
