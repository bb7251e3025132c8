"""Peak memory of `forge bench import` on a large sglang.bench_serving JSONL file.

    .venv/bin/python bench/bench_import_memory.py [--lines 1000000] [--full-lines] [--json F]

Generates, in a temporary directory, a file of LINES result lines shaped like bench_serving's
(0.5.x keys, see tests/data/bench_serving/; by default the short form of the issue's 200 MB
file of 1.7M lines: the run arguments and the headline metrics, ~300 bytes; --full-lines
writes every key of a real 0.5.4 line, ~1.8 kB), imports it with the real CLI in a fresh
subprocess, and reads that process's peak RSS from `os.wait4` (ru_maxrss). Baselines from the
same run: `forge --help` (the interpreter and CLI) and an import of a 1,000-line file of the
same shape; the ratio large/1k says whether memory grows with the file. Goal:
under 300 MB for 1M lines. Before the streaming import, 1.7M short lines grew past 12 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FORGE = [sys.executable, "-m", "infer_forge.cli"]
FULL = json.loads((REPO / "tests/data/bench_serving/sglang-0.5.4.jsonl").read_text()
                  .splitlines()[0])


def result_line(rng: random.Random, i: int, full: bool) -> str:
    duration = 60 + rng.random() * 5
    completed = 320
    out_tok = 327_680
    short = {
        "backend": "sglang-oai", "dataset_name": "random", "request_rate": float("inf"),
        "max_concurrency": 64, "random_input_len": 1024, "random_output_len": 1024,
        "duration": duration, "completed": completed,
        "request_throughput": completed / duration, "output_throughput": out_tok / duration,
        "median_ttft_ms": 250 + rng.random() * 100, "p99_ttft_ms": 400 + rng.random() * 50,
        "median_tpot_ms": 11 + rng.random(), "p99_e2e_latency_ms": 11_800 + rng.random() * 100,
        "seed": i,
    }
    obj = {**FULL, **short} if full else short
    return json.dumps(obj)  # `request_rate: Infinity`, as bench_serving writes it


def write_file(path: Path, lines: int, full: bool) -> int:
    rng = random.Random(7)
    with path.open("w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(result_line(rng, i, full) + "\n")
    return path.stat().st_size


def run_one(args: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """(peak RSS in bytes, wall seconds, first stdout line) of one fresh `forge` process,
    reaped with os.wait4 so that ru_maxrss is that child's own."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([*FORGE, *args], env=env, cwd=str(REPO), stdout=out, stderr=err,
                             text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode != 0:
        raise SystemExit(f"forge {' '.join(args)} failed ({p.returncode}): {stderr[-800:]}")
    return usage.ru_maxrss * 1024, wall, stdout.strip().splitlines()[0] if stdout else ""


def measurements(home: Path) -> int:
    with sqlite3.connect(home / "ledger.sqlite") as c:
        return c.execute("SELECT count(*) FROM stored_events WHERE topic = "
                         "'MeasurementRecorded'").fetchone()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--baseline-lines", type=int, default=1000)
    ap.add_argument("--full-lines", action="store_true", help="every key of a real 0.5.4 line")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge-bench-import-"))
    try:
        env = dict(os.environ)
        figures: dict[str, object] = {"lines": args.lines, "full_lines": args.full_lines}
        rss_help, _, _ = run_one(["--help"], env)
        figures["help_rss_mb"] = rss_help / 2**20
        for name, n in (("baseline", args.baseline_lines), ("large", args.lines)):
            home = root / f"home-{name}"
            env_n = {**env, "FORGE_HOME": str(home)}
            run_one(["init"], env_n)
            f = root / f"{name}.jsonl"
            t0 = time.perf_counter()
            size = write_file(f, n, args.full_lines)
            gen = time.perf_counter() - t0
            rss, wall, first = run_one(["bench", "import", str(f), "--task", "bench"], env_n)
            got = measurements(home)
            if got != n:
                raise SystemExit(f"{name}: {got} measurements recorded, expected {n}")
            figures[name] = {"lines": n, "file_mb": size / 2**20, "generate_s": gen,
                             "import_s": wall, "peak_rss_mb": rss / 2**20,
                             "runs_per_s": n / wall, "measurements": got, "said": first}
            f.unlink()
            print(f"{name:>8}: {n:>9,} lines, {size / 2**20:8.1f} MB file, import "
                  f"{wall:7.1f} s ({n / wall:,.0f} runs/s), peak RSS {rss / 2**20:6.1f} MB, "
                  f"{got:,} measurements", flush=True)
        big = figures["large"]["peak_rss_mb"]  # type: ignore[index]
        small = figures["baseline"]["peak_rss_mb"]  # type: ignore[index]
        figures["ratio_large_vs_baseline"] = big / small
        figures["ratio_large_vs_help"] = big / figures["help_rss_mb"]  # type: ignore[operator]
        print(f"forge --help: peak RSS {figures['help_rss_mb']:.1f} MB")
        print(f"ratio {args.lines:,}-line / {args.baseline_lines:,}-line import: "
              f"{figures['ratio_large_vs_baseline']:.2f}x; vs forge --help: "
              f"{figures['ratio_large_vs_help']:.2f}x; goal: under 300 MB "
              f"({'met' if big < 300 else 'NOT met'})")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
