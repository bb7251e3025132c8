"""`forge retrieve`'s first query on the demo workspace: a new process, as a person types it.

    .venv/bin/python bench/retrieve_first_query.py [--home DIR] [--runs 5] [--before REV]

The workspace is `--home` (a demo's, e.g. `.forge` after `make demo`), else one `forge demo`
makes in a temporary folder (the real engine: a few minutes). Each run copies it afresh (the
embedding cache as the demo's wiki build left it) and times `python -m infer_forge.cli
retrieve "why was bfloat16 rejected" --json` from spawn to exit, for the tree at REV (before;
default afb6ecc: the model loaded through sentence-transformers and torch) and the working
tree (after), interleaved, each tree exported with `git archive`, byte-compiled and imported
through PYTHONPATH (bench/startup.py's `export`). Prints per tree the wall time (min, median),
what retrieve itself reports (`load_s`, `search_s`), the bytes written on stderr, the top
hits, whether both trees return the same hits in the same order, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import REPO, export  # noqa: E402  (the bench folder is no package)

BEFORE_REV = "afb6ecc"
QUERY = "why was bfloat16 rejected"
TARGET_S = 2.0


def demo_home(root: Path) -> Path:
    home = root / "demo"
    print(f"making a demo workspace in {home} (forge demo, the real engine) …", flush=True)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "infer_forge.cli", "--home", str(home), "demo"],
                       capture_output=True, text=True, cwd=REPO)
    if r.returncode not in (0, 1):  # 1: it did not deliver; the workspace is still a demo's
        sys.exit(f"forge demo failed ({r.returncode}): {r.stderr[-2000:]}")
    print(f"  {time.perf_counter() - t0:.0f} s, exit {r.returncode}", flush=True)
    return home


def run_once(pkg: Path, home: Path, scratch: Path) -> dict[str, Any]:
    """One first query on a fresh copy of `home`, with the tree on PYTHONPATH `pkg`."""
    copy = scratch / "home"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(home, copy)
    env = {**os.environ, "PYTHONPATH": str(pkg), "FORGE_HOME": str(copy)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "infer_forge.cli", "retrieve", QUERY, "--json"],
                       capture_output=True, text=True, env=env, cwd=scratch)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"forge retrieve failed ({r.returncode}): {r.stderr[-2000:]}")
    out = json.loads(r.stdout)
    return {"wall": wall, "load_s": out["load_s"], "search_s": out["search_s"],
            "stderr": len(r.stderr.encode()),
            "hits": [(x["kind"], x["id"]) for x in out["results"]],
            "scores": [x["score"] for x in out["results"]]}


def which_tree(pkg: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    return subprocess.run([sys.executable, "-c", "import infer_forge; print(infer_forge.__file__)"],
                          capture_output=True, text=True, env=env, check=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, help="a demo workspace (default: make one)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", default=BEFORE_REV)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge-retrieve-"))
    try:
        home = a.home or demo_home(root)
        # After: the working tree's files, not HEAD's (what is measured may be uncommitted).
        trees = {"before": export(a.before, root / "before"),
                 "after": _working_tree(root / "after")}
        for name, pkg in trees.items():
            print(f"{name}: {which_tree(pkg)}", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for i in range(a.runs):
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[name].append(run_once(trees[name], home, root / "scratch"))
                print(f"  run {i + 1} {name}: {runs[name][-1]['wall']:.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| tree | first query wall, min / median | retrieve's load_s (median) | "
          "search_s | stderr bytes |")
    print("|---|---|---|---|---|")
    med = {}
    for name in ("before", "after"):
        rs = runs[name]
        walls = [r["wall"] for r in rs]
        med[name] = statistics.median(walls)
        print(f"| {name} | {min(walls):.2f} / {med[name]:.2f} s | "
              f"{statistics.median(r['load_s'] for r in rs):.2f} s | "
              f"{statistics.median(r['search_s'] for r in rs):.4f} s | "
              f"{max(r['stderr'] for r in rs)} |")
    same = all(r["hits"] == runs["before"][0]["hits"] for n in runs for r in runs[n])
    print(f"\ntop hits (before): {runs['before'][0]['hits']}")
    print(f"scores before: {runs['before'][0]['scores']}")
    print(f"scores after:  {runs['after'][0]['scores']}")
    print(f"same hits, same order in every run of both trees: {same}")
    print(f"ratio of medians before / after: {med['before'] / med['after']:.1f}x; "
          f"after {'within' if med['after'] <= TARGET_S else 'OVER'} the {TARGET_S:g} s target")


def _working_tree(into: Path) -> Path:
    """The working tree's tracked and untracked (not ignored) files, as `export` lays out."""
    import compileall

    tree = into / "tree"
    tree.mkdir(parents=True)
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard",
                            "-z"], capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src, dst = REPO / f.decode(), tree / f.decode()
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    compileall.compile_dir(str(tree), quiet=1)
    pkg = into / "pkg"
    pkg.mkdir()
    (pkg / "infer_forge").symlink_to(tree)
    return pkg


if __name__ == "__main__":
    main()
