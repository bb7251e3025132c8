"""Benchmark of the index, queries and wiki.

Builds a synthetic ledger with a realistic mix (per task: a definition, loop blocks with
tool calls, engine launches, repeated measurements of ten metrics, a verification and a
handoff, a decision and an exit; one save — and one CommandHandled marker — per step),
then, in the same run:
  1. the raw notification read rate of that ledger (the baseline);
  2. catch-up into a fresh index (events/s; the ratio against 1);
  3. `filter` and `compare` latency, in-process after catch-up (p50/p90 of many calls);
  4. `forge wiki build` on its task pages, and `retrieve` latency with a warm retriever.

Usage:
  taskset -c 0,1 .venv/bin/python bench/index.py --events 1000000 [--keep /tmp/bench-ledger]
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.clock import digest
from infer_forge.ledger.payloads import Digest
from infer_forge.ledger.workspace import init_workspace, open_workspace
from infer_forge.projections import index as I
from infer_forge.projections import queries as Q

MODELS = ["Qwen3-30B-A3B", "Qwen3-235B-A22B", "DeepSeek-V3", "Llama-3.1-8B", "Llama-3.1-70B",
          "GLM-4.6", "Kimi-K2", "tiny-llama"]
ACCS = [("nvidia", "H200"), ("nvidia", "H20"), ("nvidia", "B200"), ("amd", "MI300X"),
        ("cpu", "x86_64")]
ARCHS = ["colocated", "pd", "epd"]
TYPES = ["deployment-tuning", "kernel", "communication", "engine-integration", "evaluation"]
FLAGS = [("chunked_prefill_size", [4096, 8192, 16384]), ("moe_runner_backend",
         ["deep_gemm", "triton", "cutlass"]), ("attention_backend", ["fa3", "flashinfer",
         "triton"]), ("schedule_policy", ["lpm", "fcfs"]), ("enable_two_batch_overlap",
         [True, False]), ("cuda_graph_max_bs_decode", [64, 128, 256])]
METRICS = ["output_throughput", "request_throughput", "input_throughput", "median_ttft_ms",
           "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
           "median_e2e_latency_ms", "token_match"]
BLOCKS, REPEATS, TOOLS = 8, 3, 3


def stored(ev_type: type[E.Event], stream: str, version: int, fields: dict,
           rnd: random.Random, ts: str, cid: str | None = None) -> StoredEvent:
    """The event as `Ledger.save` stores it: validated, then the codec's own `encode` (so
    every field is present in its stored form, the command id filled in, as in a real
    ledger; the fast check sees the form it sees there)."""
    ev = ev_type.model_validate({
        "event_id": UUID(int=rnd.getrandbits(128), version=4), "occurred_at": ts,
        "actor": {"kind": "tool", "name": "bench", "model": None}, **fields})
    return codec.encode(stream, version, ev, None, cid)


def synth(ws, n_events: int, seed: int = 0) -> dict:
    """Append ~n_events (plus one CommandHandled per save): each event validated and
    encoded by the codec as `Ledger.save` does, inserted by the recorder in large batches
    (no lock or version read per save); a sample is decoded back through the codec."""
    rnd = random.Random(seed)
    rec = ws.ledger.recorder
    ts = "2026-11-29T12:00:00.000000+00:00"
    points, profiles = [], []
    ws_events: list[StoredEvent] = []
    v0 = ws.ledger.version("workspace")
    for i in range(60):
        vendor, acc = ACCS[i % len(ACCS)]
        service, rev = f"svc-{i % 20}", 1 + i // 20
        prof = {"service": service, "rev": rev,
                "engine": "hf" if vendor == "cpu" else "sglang",
                "config": {"tp_size": 1 + i % 4, "chunked_prefill_size": 8192}}
        ph = digest(prof)
        profiles.append((service, rev))
        ws_events.append(stored(E.RuntimeProfileRevised, "workspace", v0 + len(ws_events) + 1, {
            "service": service, "rev": rev, "profile_hash": ph, "profile": prof,
            "previous_hash": None, "changes": {}}, rnd, ts))
        point = {"model": {"name": MODELS[i % len(MODELS)], "source": MODELS[i % len(MODELS)],
                           "revision": "main"},
                 "scenario": {"modality": "text", "traffic": {
                     "input_len": [512, 1024, 4096][i % 3], "output_len": 256,
                     "concurrency": [8, 32, 64, 128][i % 4]}},
                 "topology": {"architecture": ARCHS[i % 3],
                              "parallelism": {"tp": 1 + i % 8, "pp": 1, "dp": 1, "ep": 1}},
                 "runtime_profile": {"service": service, "rev": rev},
                 "accelerator": {"vendor": vendor, "model": acc, "count": 8}}
        pth = digest(point)
        points.append(pth)
        ws_events.append(stored(E.DeploymentPointPinned, "workspace", v0 + len(ws_events) + 1, {
            "name": f"point-{i}", "point_hash": pth, "point": point, "source": None}, rnd, ts))
    rec.insert_events(ws_events)
    total, tasks, batch = len(ws_events), 0, []

    def save(stream: str, version: int, evs: list[tuple[type[E.Event], dict]]) -> int:
        nonlocal total
        cid = f"{stream}:{version}"
        saved = [stored(cls, stream, version + k, f, rnd, ts, cid)
                 for k, (cls, f) in enumerate(evs)]
        batch.extend(saved)
        batch.append(stored(E.CommandHandled, "command:" + cid, 1, {
            "appended": {stream: [version, version + len(evs) - 1]},
            "seal": codec.seal([e.topic for e in saved], [e.state for e in saved])},
            rnd, ts, cid))
        total += len(evs)
        if len(batch) >= 2000:
            rec.insert_events(batch)
            batch.clear()
        return version + len(evs)

    while total < n_events:
        tid = f"task-{tasks:06d}"
        pi = rnd.randrange(len(points))
        ph = points[pi]
        common = {"task_id": tid, "input_digests": {Digest.POINT: ph,
                                                    Digest.REPO_SNAPSHOT: f"sha256:r{pi}"}}
        ttype = TYPES[tasks % len(TYPES)]
        flag, values = FLAGS[tasks % len(FLAGS)]
        goal = (f"{ttype}: improve {MODELS[pi % len(MODELS)]} output throughput on "
                f"{ACCS[pi % len(ACCS)][1]} by tuning {flag} without breaking the SLO")
        v = save(f"task:{tid}", 1, [(E.TaskDefined, {
            **common, "title": tid, "task_type": ttype, "goal": goal,
            "definition": {"type": ttype, "goal": goal, "point": f"point-{pi}"},
            "definition_hash": f"sha256:{tasks}", "point_hash": ph, "profile_hash": None})])
        base = 1000.0 + 50 * (pi % 20)
        for b in range(1, BLOCKS + 1):
            bid = f"b{b}"
            cand = {} if b == 1 else {f"engine.{flag}": values[b % len(values)]}
            evs: list[tuple[type[E.Event], dict]] = [(E.LoopBlockStarted, {
                **common, "block_id": bid, "index": b, "sub_goal": f"measure {flag} block {b}",
                "routing": {"model_tier": ["none", "small", "large"][b % 3],
                            "agent_topology": "single", "executor": "sweep"},
                "candidate": cand})]
            for t in range(TOOLS):
                evs.append((E.ToolInvoked, {**common, "block_id": bid, "tool": "bench",
                                            "argv": ["forge", "bench", str(t)], "cwd": None,
                                            "env_digest": None, "exit_code": 0,
                                            "duration_s": 1.0 + t, "stdout_digest": None,
                                            "stderr_digest": None, "repo_digest": None,
                                            "error": None}))
            evs.append((E.EngineLaunched, {**common, "block_id": bid, "engine": "sglang",
                                           "command": ["python", "-m", "sglang.launch_server"],
                                           "url": "http://127.0.0.1:30000", "pid": 1,
                                           "server_info": {}, "log_digest": None}))
            gain = 1.0 + rnd.uniform(-0.1, 0.2) * (b > 1)
            for r in range(REPEATS):
                tput = base * gain * rnd.uniform(0.97, 1.03)
                metrics = {m: round(rnd.uniform(10, 1000), 3) for m in METRICS}
                metrics.update(output_throughput=round(tput, 2),
                               median_ttft_ms=round(200000 / tput * rnd.uniform(0.9, 1.1), 2),
                               token_match=1.0 if rnd.random() > 0.1 else 0.6)
                evs.append((E.MeasurementRecorded, {
                    **common, "block_id": bid, "run_id": f"{tid}-{bid}-{r}",
                    "source": "forge-bench", "metrics": metrics, "candidate": cand,
                    "repeat": r, "success": True, "error": None, "artifact_digest": None,
                    "meta": {}}))
            verdict = "pass" if gain > 1.05 else "fail"
            evs.append((E.VerificationRecorded, {
                **common, "block_id": bid, "contract_hash": "sha256:c", "point_hash": ph,
                "candidate": cand, "passed": verdict == "pass", "verdict": verdict,
                "gates": [{"name": "throughput", "kind": "relative", "verdict": verdict,
                           "passed": verdict == "pass", "metric": "output_throughput",
                           "median": base * gain, "threshold": 1.05, "direction": "at_least",
                           "baseline_median": base, "reason": f"ratio {gain:.3f}"},
                          {"name": "correctness", "kind": "absolute", "verdict": "pass",
                           "passed": True, "metric": "token_match", "median": 1.0,
                           "threshold": 0.99, "direction": "at_least",
                           "reason": "token match 1.0"}],
                "evidence": []}))
            evs.append((E.EngineStopped, {**common, "block_id": bid, "engine": "sglang",
                                          "url": "http://127.0.0.1:30000", "exit_code": 0,
                                          "reason": "teardown", "log_digest": None}))
            evs.append((E.LoopBlockHandedOff, {
                **common, "block_id": bid, "outcome": "progress" if gain > 1.05 else
                "no-progress", "state_reached": f"{flag} block {b}: ratio bucket "
                f"{round(gain, 1)}", "findings": [f"{flag} at {values[b % len(values)]}"],
                "next_sub_goal": f"try the next {flag} value"}))
            v = save(f"task:{tid}", v, evs)
        accepted = tasks % 3 == 0
        dec = (E.DeliverableAccepted, {**common, "block_id": "b8", "candidate": cand,
                                       "summary": f"{flag} raised throughput within the SLO",
                                       "verification_event_id": None, "evidence": []}) \
            if accepted else (E.DirectionRejected, {
                **common, "block_id": "b8", "candidate": cand,
                "reason": f"{flag} on {ACCS[pi % len(ACCS)][1]} did not pass the "
                          "throughput gate", "evidence": []})
        v = save(f"task:{tid}", v, [dec, (E.TaskExited, {
            **common, "state": "delivered" if accepted else "follow-up-handoff",
            "reason": "done", "evidence": [], "handoff": None if accepted else
            f"retry {flag} with a larger batch"})])
        tasks += 1
    if batch:
        rec.insert_events(batch)
    # The synthetic form is the codec's form: decode a sample through the real codec.
    for n in ws.ledger.notifications(1, 3000, page=3000):
        codec.decode(str(n.originator_id), n.originator_version, n.topic, n.state)
    return {"events": total, "notifications": ws.ledger.max_position(), "tasks": tasks}


def stages(ws, home: Path, n_notes: int, rows_rate: float, batch: int) -> None:
    """Each side of the catch-up pipeline alone, on the same batches: the reading thread's
    work (read, Arrow columns, key counts, check and projection, Arrow tables of the rows)
    and the writer's (DuckDB inserts, commits, the final CHECKPOINT, one DuckDB thread as
    in catch-up, no other thread). Their sum is the catch-up's CPU work: two cores cannot
    run it faster than half of it, nor faster than its longer side. Then the GIL effect:
    the writer's first three batches beside a Python thread that only counts, at Python's
    default switch interval and at catch-up's. Last, DuckDB's floor: `events` (payloads
    included) and the SQL path's tool calls and handoffs alone, straight from the batches'
    stored rows with no other table and no Python per row, on one DuckDB thread and on two:
    what storing those rows costs this machine before any projecting."""
    import gc
    import sys
    import threading

    from infer_forge.projections.index import catchup as C
    from infer_forge.projections.index.projector import Projector

    work = Path(tempfile.mkdtemp(prefix="forge-bench-stages-"))
    try:
        con = I.connect(work / "index.duckdb")
        gc.disable()
        t0, c0 = time.perf_counter(), time.process_time()
        proj, cur = Projector(con), con.cursor()
        batches, pos = [], 1
        while pos <= n_notes:
            rows = list(ws.ledger.rows(pos, min(n_notes, pos + batch - 1), page=batch))
            batches.append((C.prepare_batch(proj, cur, rows), pos, rows[-1][0]))
            pos = rows[-1][0] + 1
            del rows
        reader_s, reader_cpu = time.perf_counter() - t0, time.process_time() - c0
        cur.close()
        gc.enable()

        def write(into: Path, todo: list, busy: float | None = None,
                  checkpoint: bool = False, threads: int = 1) -> float:
            """Seconds to commit `todo` into a fresh index (then CHECKPOINT, as catch-up
            does at its end); `busy`: beside a counting Python thread, at that switch
            interval."""
            wc = I.connect(into)
            wc.execute(f"SET checkpoint_threshold = '{C.CATCH_UP_CHECKPOINT_THRESHOLD}'")
            wc.execute(f"SET threads = {threads}")
            stop, old = [False], sys.getswitchinterval()

            def count() -> None:
                n = 0
                while not stop[0]:
                    n += 1

            spinner = threading.Thread(target=count) if busy is not None else None
            if spinner is not None:
                sys.setswitchinterval(busy)  # type: ignore[arg-type]
                spinner.start()
            t = time.perf_counter()
            try:
                for ops, first, last in todo:
                    C._commit_batch(wc, ops, first, last, None)
                if checkpoint:
                    wc.execute("SET threads = 2")  # as catch-up's final CHECKPOINT
                    wc.execute("CHECKPOINT")
                return time.perf_counter() - t
            finally:
                stop[0] = True
                if spinner is not None:
                    spinner.join()
                sys.setswitchinterval(old)
                wc.close()

        writer_s = write(work / "w.duckdb", batches, checkpoint=True)
        total = reader_cpu + writer_s
        goal_s = n_notes / (0.3 * rows_rate)
        bound = max(reader_s, writer_s, total / 2)
        print(f"stages: reading thread alone {reader_s:.2f}s ({reader_cpu:.2f} CPU s), writer "
              f"alone {writer_s:.2f}s ({n_notes / writer_s:,.0f}/s = "
              f"{n_notes / writer_s / rows_rate:.2f}x of the raw row read); CPU work "
              f"{total:.2f}s: on 2 cores at best {bound:.2f}s = {n_notes / bound:,.0f}/s = "
              f"{n_notes / bound / rows_rate:.2f}x; 0.3x needs {goal_s:.2f}s "
              f"({goal_s * 2:.2f} CPU s on 2 cores)")
        three = batches[:3]
        alone = write(work / "a.duckdb", three)
        slow = write(work / "d.duckdb", three, busy=0.005)
        fast = write(work / "f.duckdb", three, busy=C.CATCH_UP_SWITCH_INTERVAL)
        print(f"GIL: the writer's first {len(three)} batches alone {alone:.2f}s, beside a "
              f"busy Python thread {slow:.2f}s at the default 5 ms "
              f"switch interval, {fast:.2f}s at catch-up's "
              f"{C.CATCH_UP_SWITCH_INTERVAL * 1e3:g} ms")
        floor_todo = [([(op[0], op[1], None) for op in ops if op[0] == "raw"], first, last)
                      for ops, first, last in batches]
        one = write(work / "floor1.duckdb", floor_todo, checkpoint=True)
        two = write(work / "floor2.duckdb", floor_todo, checkpoint=True, threads=2)
        print(f"DuckDB's floor (events with payloads, tool calls, handoffs; no Python, no "
              f"other table): {one:.2f}s on one DuckDB thread = "
              f"{n_notes / one / rows_rate:.2f}x of the raw row read at best, {two:.2f}s "
              f"on two; 0.3x needs all of catch-up in {goal_s:.2f}s")
        con.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def floor(home: Path, n_notes: int, n_events: int, rows_rate: float, catch_up_s: float,
          batch: int) -> None:
    """The native floor (bench/index_floor.py) next to catch-up, both against the raw row
    read of this run: sequential and pipelined, each its wall time and its CPU seconds halved
    (the bound if both cores were busy all the time); the faster of two runs each."""
    from index_floor import native_floor

    # Each way twice, the faster counted: a first run pays first uses (Parquet, JSON reader).
    goal_s = n_notes / (0.3 * rows_rate)
    events_goal_s = n_events / 150_000
    for pipelined in (False, True):
        f = min((native_floor(home / "ledger.sqlite", n_notes, batch, pipelined=pipelined)
                 for _ in range(2)), key=lambda x: x["wall_s"])
        by = ", ".join(f"{k} {v:.2f}s" for k, v in f["by"].items())
        way = "pipelined (read, extract, write in 3 threads)" if pipelined else "sequential"
        print(f"native floor, {way} ({f['read_with']}; {f['batches']} batches; "
              f"{f['bytes'] / 1e6:.0f} MB of segments): {f['wall_s']:.2f}s wall = "
              f"{n_notes / f['wall_s'] / rows_rate:.2f}x of the raw row read, "
              f"{n_events / f['wall_s']:,.0f} events/s ({by}); {f['cpu_s']:.2f} CPU s, so >= "
              f"{f['cpu_s'] / 2:.2f}s on 2 cores = {2 * n_notes / f['cpu_s'] / rows_rate:.2f}x "
              f"at best; load average {os.getloadavg()[0]:.1f}")
    print(f"catch-up took {catch_up_s:.2f}s ({n_notes / catch_up_s / rows_rate:.2f}x); 0.3x "
          f"allows {goal_s:.2f}s, 150k events/s {events_goal_s:.2f}s; floor rows {f['rows']}")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, help="Reuse/keep the synthetic ledger here.")
    ap.add_argument("--batch", type=int, default=I.DEFAULT_BATCH)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--no-wiki", action="store_true")
    ap.add_argument("--no-embeddings", action="store_true")
    ap.add_argument("--reuse-index", action="store_true",
                    help="Keep an index built by an earlier run (time the queries only).")
    ap.add_argument("--stages", action="store_true",
                    help="Also time the reading thread's work and the writer's work alone on "
                         "the same batches (the CPU budget of catch-up on this machine), and "
                         "the writer beside a busy Python thread (the GIL's share).")
    ap.add_argument("--floor", action="store_true",
                    help="Also run the native floor (bench/index_floor.py): the idealised "
                         "pipeline with no Python per event and Parquet segments, and print "
                         "its ratio to the raw row read of this run next to catch-up's.")
    ap.add_argument("--python-path", action="store_true",
                    help="Also catch up a second fresh index with every event through the "
                         "projector's Python handlers (catch_up(sql_path=False), the SQL "
                         "path's reference) and print the speed-up and whether the rows are "
                         "the same, in the same run (both paths warmed up first).")
    args = ap.parse_args()
    home = args.keep or Path(tempfile.mkdtemp(prefix="forge-bench-index-"))
    if not args.keep:  # a ledger made for this run only goes with it
        atexit.register(shutil.rmtree, home, True)
    fresh = not (home / "ledger.sqlite").exists()
    ws, _ = init_workspace(home)
    if fresh:
        t = time.perf_counter()
        info = synth(ws, args.events)
        print(f"synthetic ledger: {info} in {time.perf_counter() - t:.1f}s at {home}")
    ws.close()
    ws = open_workspace(home)
    n_notes = ws.ledger.max_position()
    print(f"cores available: {len(os.sched_getaffinity(0))}; notifications: {n_notes}")

    # 1. raw read rate (baseline)
    t = time.perf_counter()
    n = sum(1 for _ in ws.ledger.notifications(1, page=args.batch))
    raw_s = time.perf_counter() - t
    print(f"raw notification read: {n} in {raw_s:.2f}s = {n / raw_s:,.0f}/s")
    t = time.perf_counter()
    nr = sum(1 for _ in ws.ledger.rows(1, page=I.DEFAULT_BATCH))
    rows_s = time.perf_counter() - t
    print(f"raw row read (`Ledger.rows`, what catch-up reads): {nr} in {rows_s:.2f}s = "
          f"{nr / rows_s:,.0f}/s")

    # 2. catch-up into a fresh index
    for p in (I.index_path(home), Path(str(I.index_path(home)) + ".wal")):
        if p.exists() and not args.reuse_index:
            p.unlink()
    if args.python_path:  # both paths warm (imports, kernels) before either is timed
        for sql_path in (True, False):
            warm = Path(tempfile.mkdtemp(prefix="forge-bench-warm-"))
            wc = I.connect(warm / "index.duckdb")
            I.catch_up(wc, ws.ledger, stop=min(n_notes, 5000), sql_path=sql_path)
            wc.close()
            shutil.rmtree(warm, ignore_errors=True)
    con = I.connect(I.index_path(home))
    con.execute("SET threads = 2")
    r = I.catch_up(con, ws.ledger, batch=args.batch)
    print(f"catch-up: {r.events} notifications ({r.projected} events) in {r.seconds:.2f}s = "
          f"{r.rate:,.0f} events/s; {r.rate / (n / raw_s):.2f}x of the raw notification read "
          f"rate, {r.rate / (nr / rows_s):.2f}x of the raw row read rate; load average "
          f"{os.getloadavg()[0]:.1f}")
    if args.python_path:
        ref_path = Path(str(I.index_path(home)) + ".python-path")
        for p in (ref_path, Path(str(ref_path) + ".wal")):
            p.unlink(missing_ok=True)
        ref = I.connect(ref_path)
        ref.execute("SET threads = 2")
        rp = I.catch_up(ref, ws.ledger, batch=args.batch, sql_path=False)
        same = I.fingerprint(ref) == I.fingerprint(con)
        ref.close()
        for p in (ref_path, Path(str(ref_path) + ".wal")):
            p.unlink(missing_ok=True)
        print(f"catch-up, every event projected in Python: {rp.seconds:.2f}s = "
              f"{rp.rate:,.0f} events/s ({rp.rate / (nr / rows_s):.2f}x of the raw row read); "
              f"SQL path {r.rate / rp.rate:.2f}x faster; same rows: {same}; load average "
              f"{os.getloadavg()[0]:.1f}")
    if args.stages:
        stages(ws, home, n_notes, nr / rows_s, args.batch)
    if args.floor:
        floor(home, n_notes, r.projected, nr / rows_s, r.seconds, args.batch)
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("measurements", "tasks", "decisions", "handoffs")}
    print(f"rows: {counts}")

    # 3. filter / compare, in-process
    rnd = random.Random(1)
    tasks = [x[0] for x in con.execute("SELECT task_id FROM tasks").fetchall()]
    profiles = [x[0] for x in con.execute(
        "SELECT DISTINCT runtime_profile FROM tasks WHERE runtime_profile IS NOT NULL "
        "ORDER BY 1").fetchall()]
    ft, ct = [], []
    for i in range(args.queries):
        t = time.perf_counter()
        Q.filter_measurements(con, model=[MODELS[i % 8], MODELS[(i + 3) % 8]],
                              gpu=[ACCS[i % 5][1]], metric=["output_throughput",
                                                            "median_ttft_ms"], limit=1000)
        ft.append(time.perf_counter() - t)
        a, b = (rnd.sample(tasks, 2) if i % 2 == 0 else rnd.sample(profiles, 2))
        t = time.perf_counter()
        Q.compare(con, a, b)
        ct.append(time.perf_counter() - t)
    print(f"filter: p50 {statistics.median(ft) * 1e3:.1f} ms, p90 {pct(ft, .9) * 1e3:.1f} ms; "
          f"compare: p50 {statistics.median(ct) * 1e3:.1f} ms, p90 {pct(ct, .9) * 1e3:.1f} ms "
          f"({args.queries} calls each; load average {os.getloadavg()[0]:.1f})")
    con.close()

    if args.no_wiki:
        return
    # 4. wiki build and retrieve
    from infer_forge.wiki.build import build
    from infer_forge.wiki.retrieve import Retriever

    shutil.rmtree(home / "wiki", ignore_errors=True)
    shutil.rmtree(home / "site", ignore_errors=True)
    rep = build(ws, embeddings=not args.no_embeddings)
    print(f"wiki build (cold): {rep.pages} pages in {rep.seconds:.1f}s {rep.timings}")
    rep = build(ws, embeddings=not args.no_embeddings, force=True)
    print(f"wiki build (forced, embeddings cached): {rep.pages} pages, {rep.written} written,"
          f" in {rep.seconds:.1f}s {rep.timings}")
    if args.no_embeddings:
        return
    t = time.perf_counter()
    retr = Retriever.from_index(ws)
    load_s = time.perf_counter() - t
    qs = ["why was deep_gemm rejected on H20", "chunked prefill raised throughput",
          "which attention backend failed the throughput gate on B200",
          "schedule policy handoff", "two batch overlap on MI300X"]
    retr.search(qs[0])  # warm-up
    lat = []
    for i in range(args.queries):
        t = time.perf_counter()
        retr.search(qs[i % len(qs)], k=10)
        lat.append(time.perf_counter() - t)
    print(f"retrieve: corpus {len(retr.docs)} docs (loaded in {load_s:.1f}s); "
          f"p50 {statistics.median(lat) * 1e3:.1f} ms, p90 {pct(lat, .9) * 1e3:.1f} ms")
    ws.close()


if __name__ == "__main__":
    main()
