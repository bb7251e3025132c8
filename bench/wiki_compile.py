"""LLM-wiki compile (issue 17): the deterministic compile of the 39-node graph's ledger, and the
incremental recompile (`--stale`) after one new decision. Prints figures for bench/RESULTS.md.

    .venv/bin/python bench/wiki_compile.py [--home DIR] [--repeats 5]

1. Runs examples/graphs/serving-project.yaml (39 task nodes) in a fresh workspace, or uses
   `--home`, a workspace where it already ran (its ledger is left as it is only if it holds
   no task `dtype-only-tiny-cpu`: the bench adds that task).
2. Full compile (deterministic), best of `--repeats`; baseline in the same run: reading the
   evidence from the index alone (`evidence.load`, what every compile starts with), and the
   record pages' `forge wiki build --force` (no embeddings).
3. One new decision: a task on the demo's point trying bfloat16 alone (scripted numbers, one
   rejected block); then `compile --stale`: pages touched, and their count against a full
   compile's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))

from infer_forge.harness.loop.define import define_task  # noqa: E402
from infer_forge.harness.loop.run import run_task  # noqa: E402
from infer_forge.ledger.workspace import init_workspace  # noqa: E402
from infer_forge.projections.index import open_index  # noqa: E402
from infer_forge.wiki.build import build  # noqa: E402
from infer_forge.wiki.concepts import evidence  # noqa: E402
from infer_forge.wiki.concepts.compiler import compile_wiki  # noqa: E402
from infer_forge.wiki.concepts.model import load_catalog  # noqa: E402

FORGE = [sys.executable, "-m", "infer_forge.cli"]


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def forge(home: Path, *args: str) -> None:
    env = {**os.environ, "FORGE_HOME": str(home), "PYTHONPATH": str(REPO.parent)}
    r = subprocess.run([*FORGE, *args], env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"forge {' '.join(args)} failed: {r.stderr[-2000:]}")


def run_graph(home: Path) -> float:
    forge(home, "init")
    mono = home.parent / "monorepo-example"
    shutil.copytree(REPO / "examples" / "monorepo", mono,
                    ignore=shutil.ignore_patterns("remotes", "__pycache__"))
    subprocess.run([sys.executable, str(mono / "make_remotes.py")], check=True,
                   capture_output=True)
    forge(home, "repos", "init", str(mono / "local.yaml"))
    forge(home, "graph", "new", str(REPO / "examples" / "graphs" / "serving-project.yaml"))
    t = time.perf_counter()
    forge(home, "graph", "run", "-j", "2")
    return time.perf_counter() - t


def one_decision(ws, tmp: Path) -> None:
    sys.path.insert(0, str(REPO))
    from tests.test_demo import ScriptedEvaluator

    task = REPO / "examples" / "tasks" / "demo-tiny-cpu.yaml"
    text = task.read_text().replace("id: demo-tune-tiny-cpu", "id: dtype-only-tiny-cpu")
    text = text.replace("point: ../points/demo-tiny-cpu.yaml",
                        f"point: {REPO / 'examples' / 'points' / 'demo-tiny-cpu.yaml'}")
    text = re.sub(r"scope:\n(  .*\n)+", "scope:\n  engine.dtype: [bfloat16]\n", text)
    f = tmp / "dtype-only.yaml"
    f.write_text(text)
    tid = define_task(ws, f)["task_id"]
    run_task(ws, tid, evaluator=ScriptedEvaluator())


def best(fn, repeats: int) -> tuple[float, float]:
    xs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return min(xs), statistics.median(xs)


def main() -> None:
    # the example's toy SGLang parts (no release fetched): these numbers are the graph
    # runner's, comparable across runs; tests/harness/graph/test_graph_run.py runs the real ones
    os.environ.setdefault("FORGE_SERVING_PROJECT", "fast")
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-wiki-compile-"))
    try:
        home = a.home or tmp / "home"
        if a.home is None:
            print(f"serving-project graph run (-j 2): {run_graph(home):.1f} s, {load()}")
        ws, _ = init_workspace(home)
        with ws:
            with open_index(ws) as s:  # catch up outside the timings
                n = s.con.execute("SELECT count(*) FROM events").fetchone()[0]
                tasks = s.con.execute("SELECT count(*) FROM tasks").fetchone()[0]
            print(f"ledger: {n} events, {tasks} tasks")

            def read() -> None:
                with open_index(ws) as s:
                    evidence.load(s.con)

            r_min, r_med = best(read, a.repeats)
            print(f"baseline, evidence read alone: best {r_min * 1000:.0f} ms, median "
                  f"{r_med * 1000:.0f} ms, {load()}")
            reports = []
            c_min, c_med = best(lambda: reports.append(compile_wiki(ws, deterministic=True)),
                                a.repeats)
            full = reports[-1]
            print(f"full compile (deterministic): {full.pages} pages, best {c_min * 1000:.0f} "
                  f"ms, median {c_med * 1000:.0f} ms = {c_min / r_min:.2f}x the read, {load()}")
            b_min, b_med = best(lambda: build(ws, embeddings=False, force=True),
                                max(1, a.repeats // 2))
            print(f"baseline, forge wiki build --force (record pages, no embeddings): best "
                  f"{b_min * 1000:.0f} ms; compile/build {c_min / b_min:.2f}, {load()}")
            before = load_catalog(home / "wiki")
            one_decision(ws, tmp)
            with open_index(ws) as s:
                pass  # catch up the new task outside the timing
            t = time.perf_counter()
            inc = compile_wiki(ws, stale=True, deterministic=True)
            t_inc = time.perf_counter() - t
            after = load_catalog(home / "wiki")
            new = sorted(set(after.pages) - set(before.pages))
            print(f"one new decision, compile --stale: {len(inc.compiled)} of {inc.pages} "
                  f"pages touched ({len(inc.compiled) - len(new)} stale recompiled, "
                  f"{len(new)} new), {t_inc * 1000:.0f} ms = {t_inc / c_min:.2f}x the full "
                  f"compile, {load()}")
            print(f"  states before: {inc.states}")
            for slug in inc.compiled:
                print(f"  {after.pages[slug].concept}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
