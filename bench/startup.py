"""Startup cost of the CLI: wall and CPU time of `forge --help`, and which heavy libraries
importing the CLI loads.

    .venv/bin/python bench/startup.py [--runs 9] [REV ...]

Measures the working tree and each git revision REV (exported with `git archive` into a
temporary directory and imported through PYTHONPATH), runs interleaved so that load from other
work on the machine hits each alike. Every tree is byte-compiled first, as an installed
package is: with PYTHONDONTWRITEBYTECODE set, each run would compile the package's sources
again and measure the compiler. CPU time (user + system, from the child's rusage) moves less
with the machine's load than wall time; both are reported as min and median.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("pyarrow", "numpy", "duckdb", "torch", "transformers", "sentence_transformers",
         "matplotlib", "markdown_it", "networkx", "aiohttp", "detect_secrets")
SKIP = re.compile(r"/(tests|notebooks|examples|bench|\.venv|\.git|\.forge)/")


def export(rev: str, into: Path) -> Path:
    """The tree at `rev` as an importable `infer_forge` under `into`; returns the folder to
    put on PYTHONPATH."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    compileall.compile_dir(str(tree), quiet=1, rx=SKIP)
    pkg = into / "pkg"
    pkg.mkdir()
    (pkg / "infer_forge").symlink_to(tree)
    return pkg


def _short(rev: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def run_once(env: dict[str, str]) -> tuple[float, float]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "infer_forge.cli", "--help"], check=True,
                   stdout=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def heavy_loaded(env: dict[str, str]) -> str:
    code = ("import infer_forge.cli, sys\n"
            f"print(', '.join(m for m in {HEAVY!r} if m in sys.modules) or 'none')")
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, env=env, cwd=tempfile.gettempdir()).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("revs", nargs="*", help="git revisions to measure beside the working tree")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="forge-startup-"))
    try:
        trees = {f"{rev} ({_short(rev)})": export(rev, tmp / str(i))
                 for i, rev in enumerate(args.revs)}
        compileall.compile_dir(str(REPO), quiet=1, rx=SKIP)
        envs = {name: dict(os.environ, PYTHONPATH=str(pkg)) for name, pkg in trees.items()}
        envs["working tree"] = dict(os.environ)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in envs}
        for env in envs.values():
            run_once(env)  # warm the file cache
        for _ in range(args.runs):
            for name, env in envs.items():
                times[name].append(run_once(env))
        print(f"`forge --help`, {args.runs} runs each (s)")
        print("| tree | wall min | wall median | CPU min | CPU median | heavy libraries loaded |")
        print("|---|---|---|---|---|---|")
        for name, env in envs.items():
            wall = [w for w, _ in times[name]]
            cpu = [c for _, c in times[name]]
            print(f"| {name} | {min(wall):.3f} | {statistics.median(wall):.3f} | "
                  f"{min(cpu):.3f} | {statistics.median(cpu):.3f} | {heavy_loaded(env)} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
