"""A journal of N tasks (issue 16, item 3): wiki builds, retrieve, the site's search, queries.

On a synthetic ledger of N tasks (bench/index.py's mix, ~91 events a task: 10k tasks ≈ 1M
events), in one run:
  1. `filter` / `compare` p50 / p90, in-process on the caught-up index;
  2. a full wiki build (no wiki or site files; the drawing and embedding caches kept in the
     ledger dir, so only a first run draws and embeds everything) and, after each of two small
     appends (one decision on an existing task; one new task), an incremental build: seconds
     and pages rewritten;
  3. retrieve with the model loaded (a warm `Retriever`): p50 / p90 over the whole corpus,
     the corpus load, and one `forge retrieve` CLI call (a new process: imports, model,
     corpus);
  4. the static site's search in headless Chromium: the sharded index (meta + the shards a
     query needs) against the one-file `search.json` read by a page as the site had it
     before (the baseline, same site, same run): bytes fetched, gzip size, time to the first
     answer.
Every figure prints the load average next to it (the machine is shared).

Usage:
  .venv/bin/python bench/journal.py --tasks 10000 --keep /tmp/journal-10k [--no-embeddings]
  .venv/bin/python bench/journal.py --quick     # 300 tasks, temp dir, no CLI retrieve call
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index import ACCS, MODELS, pct, synth  # noqa: E402  (bench/index.py: the ledger mix)
from infer_forge.ledger import events as E  # noqa: E402
from infer_forge.ledger.store import Append  # noqa: E402
from infer_forge.ledger.streams import task_stream  # noqa: E402
from infer_forge.ledger.workspace import init_workspace, open_workspace  # noqa: E402
from infer_forge.projections import queries as Q  # noqa: E402
from infer_forge.projections.index import open_index  # noqa: E402

EVENTS_PER_TASK = 91  # bench/index.py's synth: a definition, 8 blocks of 11, decision, exit
REPO = Path(__file__).resolve().parent.parent
QUERIES = ["why was deep_gemm rejected on H20", "chunked prefill raised throughput",
           "which attention backend failed the throughput gate on B200",
           "schedule policy handoff", "two batch overlap on MI300X"]


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def queries(ws, n: int) -> None:
    with open_index(ws) as s:
        con = s.con
        rnd = random.Random(1)
        tasks = [x[0] for x in con.execute("SELECT task_id FROM tasks").fetchall()]
        profiles = [x[0] for x in con.execute(
            "SELECT DISTINCT runtime_profile FROM tasks WHERE runtime_profile IS NOT NULL "
            "ORDER BY 1").fetchall()]
        ft, ct = [], []
        for i in range(n):
            t = time.perf_counter()
            Q.filter_measurements(con, model=[MODELS[i % 8], MODELS[(i + 3) % 8]],
                                  gpu=[ACCS[i % 5][1]],
                                  metric=["output_throughput", "median_ttft_ms"], limit=1000)
            ft.append(time.perf_counter() - t)
            a, b = rnd.sample(tasks, 2) if i % 2 == 0 else rnd.sample(profiles, 2)
            t = time.perf_counter()
            Q.compare(con, a, b)
            ct.append(time.perf_counter() - t)
    print(f"filter: p50 {statistics.median(ft) * 1e3:.1f} ms, p90 {pct(ft, .9) * 1e3:.1f} ms; "
          f"compare: p50 {statistics.median(ct) * 1e3:.1f} ms, p90 {pct(ct, .9) * 1e3:.1f} ms "
          f"({n} calls each, in-process; {load()})")


def append_decision(ws, tid: str) -> None:
    """One rejection on an existing task's last block (a real save, as the loop makes it)."""
    actor = E.Actor.tool("bench-journal")
    ws.ledger.save(Append(task_stream(tid), [E.DirectionRejected(
        candidate={"engine.schedule_policy": "fcfs"}, reason="fcfs lost 4% throughput",
        evidence=[], block_id="b8", task_id=tid, actor=actor)]),
        command_id=f"bench-journal:{tid}:{time.time_ns()}")


def append_task(ws, tid: str, point_hash: str) -> None:
    """A new task: definition, one block of three measurements and a verification, a
    decision and an exit."""
    actor = E.Actor.tool("bench-journal")
    common = {"task_id": tid, "actor": actor, "input_digests": {"point": point_hash}}
    goal = "deployment-tuning: check fcfs scheduling on the appended task"
    definition = {"type": "deployment-tuning", "goal": goal}
    led, stream = ws.ledger, task_stream(tid)
    led.save(Append(stream, [E.TaskDefined(
        title=tid, task_type="deployment-tuning", goal=goal, definition=definition,
        definition_hash="sha256:bench-journal", point_hash=point_hash, **common)]),
        command_id=f"{tid}:define")
    cand = {"engine.schedule_policy": "fcfs"}
    evs: list[E.Event] = [E.LoopBlockStarted(
        index=1, sub_goal="measure fcfs", routing={"model_tier": "none",
                                                  "agent_topology": "single",
                                                  "executor": "sweep"},
        candidate=cand, block_id="b1", **common)]
    for r in range(3):
        evs.append(E.MeasurementRecorded(
            run_id=f"{tid}-b1-r{r}", source="forge-bench", repeat=r, candidate=cand,
            metrics={"output_throughput": 1000.0 + r, "median_ttft_ms": 200.0 - r,
                     "token_match": 1.0}, block_id="b1", **common))
    evs.append(E.LoopBlockHandedOff(outcome="progress", state_reached="fcfs measured",
                                    findings=["fcfs within 1%"], next_sub_goal=None,
                                    block_id="b1", **common))
    led.save(Append(stream, evs), command_id=f"{tid}:b1")
    led.save(Append(stream, [
        E.DirectionRejected(candidate=cand, reason="fcfs within noise", evidence=[],
                            block_id="b1", **common),
        E.TaskExited(state="follow-up-handoff", reason="done", handoff=None, **common)]),
        command_id=f"{tid}:exit")


def wiki(ws, home: Path, embeddings: bool, full: bool = True) -> None:
    from infer_forge.wiki.build import build

    if full:
        for d in ("wiki", "site"):  # a full build: no pages, no records; the caches are kept
            keep = {"_plots.json", "_embeddings.npz"} if d == "wiki" else set()
            for f in list((home / d).iterdir()) if (home / d).is_dir() else []:
                if f.name not in keep:
                    shutil.rmtree(f) if f.is_dir() else f.unlink()
    rep = build(ws, embeddings=embeddings, force=True)  # forced: a changed build settles here
    full_s = rep.seconds
    print(f"wiki build ({'full: no pages, drawing/embedding caches kept' if full else 'forced'}"
          f"): {rep.pages} pages, {rep.written} written in {rep.seconds:.1f}s {rep.timings}; "
          f"{load()}")
    rep = build(ws, embeddings=embeddings)
    print(f"wiki build (nothing new): fresh={rep.fresh} in {rep.seconds:.2f}s")
    with open_index(ws) as s:
        tid, = s.con.execute("SELECT task_id FROM tasks ORDER BY task_id LIMIT 1 OFFSET "
                             "(SELECT count(*) // 2 FROM tasks)").fetchone()
        ph, = s.con.execute("SELECT point_hash FROM points ORDER BY 1 LIMIT 1").fetchone()
    for what, append in ((f"one decision on {tid}", lambda: append_decision(ws, tid)),
                         ("one new task (3 saves)",
                          lambda: append_task(ws, f"appended-{time.time_ns()}", ph))):
        append()
        rep = build(ws, embeddings=embeddings)
        print(f"wiki build (incremental, after {what}): {rep.written} of {rep.pages} pages "
              f"rewritten ({rep.unchanged} unchanged, {rep.removed} removed; "
              f"{rep.traced} decisions traced afresh) in "
              f"{rep.seconds:.1f}s" + (f" = {rep.seconds / full_s:.2f}x the full build "
                                        if full else " ") +
              f"{rep.timings}; {load()}")


def retrieve(ws, home: Path, n: int, cli: bool) -> None:
    from infer_forge.wiki.retrieve import Retriever

    t = time.perf_counter()
    r = Retriever.from_index(ws)
    load_s = time.perf_counter() - t
    r.search(QUERIES[0])  # the model's first call
    lat = []
    for i in range(n):
        t = time.perf_counter()
        r.search(QUERIES[i % len(QUERIES)], k=10)
        lat.append(time.perf_counter() - t)
    print(f"retrieve (warm Retriever): corpus {len(r.docs)} docs, loaded in {load_s:.1f}s; "
          f"p50 {statistics.median(lat) * 1e3:.1f} ms, p90 {pct(lat, .9) * 1e3:.1f} ms "
          f"({n} queries, k=10; {load()})")
    if cli:
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "infer_forge.cli", "--home", str(home),
                            "retrieve", QUERIES[0], "-k", "3"], capture_output=True,
                           text=True, cwd=REPO)
        print(f"`forge retrieve` CLI call (a new process): {time.perf_counter() - t:.1f}s "
              f"wall, rc {p.returncode}; {load()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--keep", type=Path, help="Reuse/keep the ledger (and caches) here.")
    ap.add_argument("--quick", action="store_true", help="300 tasks, fewer calls.")
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--no-embeddings", action="store_true",
                    help="Builds without embeddings; no retrieve figures.")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["queries", "wiki", "full", "retrieve"],
                    help="Leave a part out: `wiki` (time retrieve and search on the site "
                         "an earlier run built), `full` (no full build: the incremental ones "
                         "on that site).")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.queries = 300, 10
    home = args.keep or Path(tempfile.mkdtemp(prefix="forge-bench-journal-"))
    if not args.keep:
        atexit.register(shutil.rmtree, home, True)
    fresh = not (home / "ledger.sqlite").exists()
    ws, _ = init_workspace(home)
    if fresh:
        t = time.perf_counter()
        info = synth(ws, args.tasks * EVENTS_PER_TASK - EVENTS_PER_TASK // 2)
        print(f"synthetic ledger: {info} in {time.perf_counter() - t:.1f}s at {home}")
    ws.close()
    ws = open_workspace(home)
    t = time.perf_counter()
    with open_index(ws) as s:
        ntasks = s.con.execute("SELECT count(*) FROM tasks").fetchone()[0]
    print(f"{ntasks} tasks, {ws.ledger.max_position()} notifications; index caught up in "
          f"{time.perf_counter() - t:.1f}s; cores {len(os.sched_getaffinity(0))}; {load()}")
    if "queries" not in args.skip:
        queries(ws, args.queries)
    if "wiki" not in args.skip:
        wiki(ws, home, not args.no_embeddings, full="full" not in args.skip)
    if not args.no_embeddings and "retrieve" not in args.skip:
        retrieve(ws, home, args.queries, cli=not args.quick)
    if not args.no_browser:
        from browser_search import search_in_browser

        search_in_browser(home / "site", QUERIES[1], echo=print)
    ws.close()


if __name__ == "__main__":
    main()
