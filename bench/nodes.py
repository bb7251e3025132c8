"""Benchmark of the Node Registry (issue 14).

1. A day of a cluster: HOSTS hosts x 8 GPUs sampled every 10 s (8,640 samples per host),
   summarised every 5 min, with jobs starting and ending on the GPUs (about a dozen compute-
   process changes per GPU per day), written through the real writer (`registry`: an
   artifact and an event per window, an event per change). Prints the ledger's growth
   (events, bytes) and the artifacts' bytes, against the baseline of one ledger event per
   sample (measured by writing one host-hour that way in the same run and scaling it).
2. Index catch-up of that day (samples loaded from the artifacts) and query times
   (p50 of repeated runs) for what an engineer asks: one GPU's hourly utilisation over the
   day, the cluster's GPUs idle over the last 30 min, hosts by mean CPU.
3. Claim + heartbeat cost with ACTIVE claims already held, against a plain ledger append
   of one event in the same run.

Usage:
  taskset -c 0,1 .venv/bin/python bench/nodes.py [--hosts 64] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from infer_forge.harness.nodes import claims as C
from infer_forge.harness.nodes import registry
from infer_forge.harness.nodes.observe import GpuSample, Probe, Sample, Window
from infer_forge.harness.testing.fake_nvml import FakeNvml
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.index import open_index

INTERVAL, WINDOW, DAY, GPUS = 10.0, 300.0, 86400, 8
START = datetime(2026, 11, 30, tzinfo=UTC).timestamp()


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _ledger_bytes(home: Path) -> int:
    """The ledger file's size after a WAL checkpoint (the WAL would count writes twice)."""
    import sqlite3
    con = sqlite3.connect(home / "ledger.sqlite")
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    return sum(p.stat().st_size for p in home.glob("ledger.sqlite*"))


def _jobs(rnd: random.Random, seconds: int) -> list[tuple[float, float, int]]:
    """(start, end, pid) of jobs on one GPU over `seconds`: ~6 a day, 1-4 h each."""
    out, t = [], rnd.uniform(0, 3600)
    while t < seconds:
        d = rnd.uniform(3600, 4 * 3600)
        out.append((t, min(seconds, t + d), rnd.randrange(1000, 4_000_000)))
        t += d + rnd.uniform(300, 7200)
    return out


def simulate(ws, hosts: int, seconds: int, seed: int = 7) -> dict[str, int]:
    rnd = random.Random(seed)
    n_samples = int(seconds // INTERVAL)
    changes = summaries = 0
    for h in range(hosts):
        host = f"node{h:03d}"
        fake = FakeNvml(GPUS, host_tag=f"{h:03d}")
        registry.register_host(ws, host, Probe(nvml=fake).inventory())
        uuids = [g.uuid for g in fake.gpus]
        jobs = {u: _jobs(rnd, seconds) for u in uuids}
        nxt = {u: 0 for u in uuids}
        win = Window(host, INTERVAL, START)
        for k in range(n_samples):
            t = k * INTERVAL
            gpus = {}
            for u in uuids:
                js = jobs[u]
                while nxt[u] < len(js) and js[nxt[u]][1] <= t:
                    nxt[u] += 1
                busy = nxt[u] < len(js) and js[nxt[u]][0] <= t
                gpus[u] = GpuSample(rnd.uniform(80, 100) if busy else 0.0,
                                    70000 if busy else 0,
                                    (js[nxt[u]][2],) if busy else ())
            ch = win.add(Sample(START + t, rnd.uniform(5, 60), rnd.randrange(100000, 900000),
                                gpus))
            registry.record_changes(ws, ch)
            changes += len(ch)
            if t + INTERVAL - (win.start - START) >= WINDOW:
                ev, cols = win.summary(START + t)
                registry.record_summary(ws, ev, cols)
                summaries += 1
                win = win.next(START + t + INTERVAL)
    return {"changes": changes, "summaries": summaries, "samples": hosts * n_samples}


def per_sample_baseline(home: Path) -> float:
    """Ledger bytes per sample if every sample were an event (one host-hour, 8 GPUs)."""
    ws, _ = init_workspace(home)
    before = _ledger_bytes(home)
    n = 360
    rnd = random.Random(1)
    for k in range(n):
        gpus = tuple(E.GpuWindow(uuid=f"GPU-{i}", samples=1, util_mean=rnd.uniform(0, 100),
                                 util_max=0.0, mem_used_max_mib=70000, busy_samples=1,
                                 last_pids=(1234,)) for i in range(GPUS))
        ws.ledger.append("nodes", [E.HostSummarized(
            host="node000", start=datetime.fromtimestamp(START + k * 10, UTC),
            end=datetime.fromtimestamp(START + k * 10, UTC), interval_s=10, samples=1,
            cpu_pct_mean=rnd.uniform(0, 100), gpus=gpus)])
    ws.close()
    return (_ledger_bytes(home) - before) / n


def p50(fn, n: int = 15) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--active", type=int, default=200, help="claims held during the timing")
    ap.add_argument("--quick", action="store_true", help="4 hosts, 6 hours, 50 claims")
    a = ap.parse_args()
    if a.quick:
        a.hosts, a.hours, a.active = 4, 6.0, 50
    root = Path(tempfile.mkdtemp(prefix="bench-nodes-"))
    try:
        home = root / "home"
        ws, _ = init_workspace(home)
        base_ledger = _ledger_bytes(home)
        t0 = time.perf_counter()
        sim = simulate(ws, a.hosts, int(a.hours * 3600))
        wall = time.perf_counter() - t0
        events = ws.ledger.max_position()
        led = _ledger_bytes(home) - base_ledger
        arts = _size(home / "artifacts")
        per_sample = per_sample_baseline(root / "baseline")
        as_events = per_sample * sim["samples"]
        print(f"day of {a.hosts} hosts x {GPUS} GPUs over {a.hours:g} h at {INTERVAL:g}s: "
              f"{sim['samples']:,} host samples ({sim['samples'] * GPUS:,} GPU samples), "
              f"written in {wall:.1f}s")
        print(f"  ledger: {events:,} rows (incl. save markers), {sim['summaries']:,} summaries, "
              f"{sim['changes']:,} GPU process changes, +{led / 1e6:.1f} MB; artifacts "
              f"{arts / 1e6:.1f} MB")
        print(f"  baseline (an event per sample): {per_sample:.0f} B/sample -> "
              f"{as_events / 1e6:.0f} MB; ledger growth ratio {led / as_events:.3f}x "
              f"(ledger + artifacts {(led + arts) / as_events:.3f}x)")
        t0 = time.perf_counter()
        with open_index(ws) as s:
            catch = time.perf_counter() - t0
            con = s.con
            rows = con.execute("SELECT count(*) FROM gpu_samples").fetchone()
            print(f"  index catch-up: {catch:.1f}s for {rows[0]:,} GPU sample rows "
                  f"({rows[0] / catch:,.0f} rows/s); index {s.path.stat().st_size / 1e6:.1f} MB")
            uuid = con.execute("SELECT gpu_uuid FROM gpu_samples LIMIT 1").fetchone()[0]
            q = {
                "one GPU, hourly utilisation over the day": (
                    "SELECT date_trunc('hour', t) h, avg(util) FROM gpu_samples "
                    "WHERE gpu_uuid = ? GROUP BY h ORDER BY h", [uuid]),
                "GPUs idle over the last 30 min (cluster)": (
                    "SELECT host, gpu_uuid FROM gpu_samples WHERE t >= (SELECT max(t) FROM "
                    "gpu_samples) - INTERVAL 30 MINUTE GROUP BY ALL HAVING max(procs) = 0",
                    []),
                "hosts by mean CPU (windows)": (
                    "SELECT host, avg(cpu_pct_mean) c FROM host_windows GROUP BY host "
                    "ORDER BY c DESC", []),
            }
            for name, (sql, params) in q.items():
                t = p50(lambda sql=sql, params=params: con.execute(sql, params).fetchall())
                print(f"  query p50 {t * 1000:7.1f} ms  {name}")
        # Claims.
        held = [C.claim(ws, [E.ResourceRef(host=f"c{i // 8:03d}", kind="gpu",
                                           id=f"GPU-{i:05d}")]) for i in range(a.active)]
        k = [0]

        def one_claim() -> None:
            k[0] += 1
            C.claim(ws, [E.ResourceRef(host="bench", kind="port", id=str(k[0]))])

        def one_heartbeat() -> None:
            C.heartbeat(ws, held[k[0] % len(held)].claim_id)

        def plain_append() -> None:
            ws.ledger.append("bench-plain", [E.ClaimHeartbeat(claim_id="x")])

        base = p50(plain_append, 40)
        tc, th = p50(one_claim, 40), p50(one_heartbeat, 40)
        print(f"claims with {a.active} active: claim p50 {tc * 1000:.1f} ms "
              f"({tc / base:.1f}x a plain append of {base * 1000:.1f} ms), heartbeat p50 "
              f"{th * 1000:.1f} ms ({th / base:.1f}x)")
        ws.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
