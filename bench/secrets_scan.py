"""`forge secrets scan` throughput: lines/s over a whole workspace (ledger, artifacts, index,
wiki, site), per source.

Either an existing workspace (`--home DIR`: e.g. the demo's, kept by `bench/demo.py --keep
DIR`), or a demo-like one built here: `--tasks N` loop tasks run to delivery with a command
evaluator (4 blocks of 3 runs each, the pattern of tests/harness/loop/test_loop.py), then the
index and the wiki (no embeddings). The scan is the one `forge secrets scan` runs
(`scan_workspace`), timed `--repeat` times; the first includes opening DuckDB and loading
the redaction rules.

    .venv/bin/python bench/secrets_scan.py [--home DIR | --tasks N] [--repeat 3]
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

EVAL = r'''
import json, os, sys
cand = json.load(sys.stdin)
r = int(os.environ.get("FORGE_REPEAT", "0"))
cb = cand.get("engine.continuous_batching", False)
eager = cand.get("engine.attn_implementation", "sdpa") == "eager"
tput = 100.0 * (1.02 if eager else 1.0) * (1.3 if cb else 1.0) * (1.0, 1.01, 0.99)[r % 3]
print("warming up")
print(json.dumps({"output_throughput": tput, "median_ttft_ms": 100.0 * (9 if cb and not eager
                  else 1), "token_match": 1.0, "completed": 64, "failed": 0}))
'''
TASK = """\
id: {task_id}
type: deployment-tuning
goal: Raise output throughput without breaking the TTFT SLO or the outputs
point: ../points/tiny-cpu.yaml
scope:
  engine.continuous_batching: [false, true]
  engine.attn_implementation: [sdpa, eager]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
    - {{name: ttft-slo, metric: median_ttft_ms, at_most: 500}}
    - {{name: stability, repeats: 3, max_cv: 0.10, max_failed_requests: 0}}
executor: {{kind: sweep}}
evaluator: {{kind: command, argv: [{python}, evalscript.py]}}
"""


def build(home: Path, tasks: int) -> None:
    from infer_forge.harness.loop.define import define_task
    from infer_forge.harness.loop.run import run_task
    from infer_forge.ledger.workspace import init_workspace
    from infer_forge.projections.index.session import update
    from infer_forge.wiki.build import build as build_wiki

    repo = Path(__file__).resolve().parent.parent
    specs = home.parent / (home.name + "-specs")
    for sub in ("points", "profiles", "tasks"):
        (specs / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(repo / "examples/points/tiny-cpu.yaml", specs / "points/tiny-cpu.yaml")
    shutil.copy(repo / "examples/profiles/tiny-cpu.yaml", specs / "profiles/tiny-cpu.yaml")
    (specs / "tasks/evalscript.py").write_text(EVAL)
    ws, _ = init_workspace(home)
    try:
        for i in range(tasks):
            f = specs / "tasks" / f"t{i}.yaml"
            f.write_text(TASK.format(task_id=f"t{i}", python=json.dumps(sys.executable)))
            define_task(ws, f)
            run_task(ws, f"t{i}")
        update(ws)
        build_wiki(ws, embeddings=False)
    finally:
        ws.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, help="An existing workspace to scan.")
    ap.add_argument("--tasks", type=int, default=10, help="Loop tasks in the built workspace.")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from infer_forge.harness.guard.secrets_scan import scan_workspace
    from infer_forge.ledger.workspace import open_workspace

    home = args.home
    if home is None:
        tmp = Path(tempfile.mkdtemp(prefix="forge-scan-bench-"))
        atexit.register(shutil.rmtree, tmp, True)
        home = tmp / "home"
        t = time.perf_counter()
        build(home, args.tasks)
        print(f"built {args.tasks} loop tasks + index + wiki in {time.perf_counter() - t:.1f}s")
    runs = []
    for _ in range(args.repeat):
        with open_workspace(home) as ws:
            runs.append(scan_workspace(ws))
    last = runs[-1]
    print(f"workspace {home}: {last.lines:,} lines, {last.bytes / 1e6:.2f} MB, "
          f"{len(last.hits)} finding(s)")
    print(f"{'source':<10} {'items':>7} {'lines':>9} {'MB':>7} {'ms':>7} {'lines/s':>10}")
    for name, c in last.sources.items():
        rate = c["lines"] / (c["ms"] / 1000) if c["ms"] else 0
        print(f"{name:<10} {c['items']:>7,} {c['lines']:>9,} {c['bytes'] / 1e6:>7.2f} "
              f"{c['ms']:>7,} {rate:>10,.0f}")
    secs = [r.seconds for r in runs]
    print(f"total: first {secs[0]:.2f}s, median {statistics.median(secs):.2f}s over "
          f"{len(secs)} scans: {last.lines / statistics.median(secs):,.0f} lines/s")


if __name__ == "__main__":
    main()
