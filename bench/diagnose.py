"""Benchmark of `forge diagnose` and `forge monitor` (issue 15, items 2 and 3).

1. Diagnose wall time against a ~1 MB `/metrics` page (SGLang-shaped, padded with labelled
   series) served by the scripted server over real HTTP: one scrape and five back to back
   (interval 0.01 s), rules applied, a 1 MB log tail read, the event recorded; p50 of REPS.
   Also the parse+summarise cost of one page alone.
2. Monitor: the index's catch-up of one hour of 1 s scrapes of a normal-size page (≈40
   metrics), one summary per minute.

Usage:
  taskset -c 0,1 .venv/bin/python bench/diagnose.py [--reps 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from infer_forge.harness.diagnose import collect
from infer_forge.harness.diagnose.monitor import EndpointWindow, record_summary
from infer_forge.harness.testing.scripted_server import Script, ScriptedServer
from infer_forge.harness.testing.sglang_metrics import sglang_metrics
from infer_forge.ledger.workspace import init_workspace
from infer_forge.projections.index import open_index


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge-bench-diagnose-"))
    try:
        ws, _ = init_workspace(root / "home")
        page = sglang_metrics(pad_families=9_000)
        print(f"/metrics page: {len(page) / 1e6:.2f} MB, {page.count(chr(10))} lines")
        log = root / "server.log"
        log.write_text("".join(f"[2026-12-01 08:00:00] Decode batch. #running-req: 4, line {i}\n"
                               for i in range(16_000)))
        print(f"log: {log.stat().st_size / 1e6:.2f} MB")
        t = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            collect.to_scrape(0.0, page, "bench")
            t.append(time.perf_counter() - t0)
        print(f"parse+summarise one page: p50 {statistics.median(t) * 1000:.0f} ms")
        with ScriptedServer(Script(metrics=lambda k: page)) as s:
            for n in (1, 5):
                t = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    collect.diagnose(ws, s.url, samples=n, interval_s=0.01, log=log)
                    t.append(time.perf_counter() - t0)
                print(f"diagnose, {n} scrape(s) of the 1 MB page + 1 MB log: "
                      f"p50 {statistics.median(t) * 1000:.0f} ms (min {min(t) * 1000:.0f})")
        # An hour of monitoring at 1 s, a summary per minute, then the index's catch-up.
        small = collect.to_scrape(0.0, sglang_metrics(), "bench").values
        start = 1_764_576_000.0
        t0 = time.perf_counter()
        for w in range(60):
            win = EndpointWindow("http://bench:30000", 1.0, start + 60 * w)
            for i in range(60):
                win.add(start + 60 * w + i, dict(small))
            record_summary(ws, *win.summary(start + 60 * w + 59))
        rec = time.perf_counter() - t0
        t0 = time.perf_counter()
        with open_index(ws) as q:
            rows = q.con.execute("SELECT count(*) FROM endpoint_samples").fetchone()
        cat = time.perf_counter() - t0
        print(f"monitor hour: 60 summaries recorded in {rec:.2f} s; index catch-up "
              f"{cat:.2f} s for {rows[0] if rows else 0} sample rows")
        ws.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
