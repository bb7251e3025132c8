"""Build cache: `forge build` of one member, a miss (the build runs) against a hit (the
cached outcome of the same inputs). Prints figures for bench/RESULTS.md.

    .venv/bin/python bench/build_cache.py [--runs 10] [--files 4]

A member (a local bare remote, a MonoRepo root made by `forge repos init`, all in a temporary
directory removed at the end) whose build compiles `--files` small C files with `cc -O2`
into build/app (without a C compiler: `python -m compileall` over 25x as many files). Each
round runs, in this process: the bare build command (`subprocess`, no forge: the baseline), a
miss (`harness.tool_calls.build.build` with an environment variable set to the round's number, so
that the key is new), and a hit (the same inputs again). Reported: min and median seconds of
each, the ratio miss/hit and the miss's cost over the bare command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))

from infer_forge.harness.tool_calls.build import build  # noqa: E402
from infer_forge.ledger.workspace import init_workspace  # noqa: E402
from infer_forge.repos import commands as C  # noqa: E402
from infer_forge.repos.git import git  # noqa: E402


def c_source(i: int) -> str:
    fns = "\n".join(f"int f{i}_{k}(int x) {{ int s = 0; for (int j = 0; j < x; j++) "
                    f"s += (j * {k + 1}) ^ {i}; return s; }}" for k in range(40))
    main = "int main(void) { return f0_0(3) > 0 ? 0 : 1; }\n" if i == 0 else ""
    return fns + "\n" + main


def make_member(base: Path, files: int) -> tuple[Path, str, str]:
    """(bare remote, build command, what it builds)."""
    work = base / "seed"
    work.mkdir(parents=True)
    if shutil.which("cc"):
        for i in range(files):
            (work / "src").mkdir(exist_ok=True)
            (work / "src" / f"m{i}.c").write_text(c_source(i))
        command = "mkdir -p build && cc -O2 -o build/app src/*.c"
        what = f"cc -O2 of {files} C files (40 functions each)"
    else:
        n = files * 25
        for i in range(n):
            (work / "src").mkdir(exist_ok=True)
            (work / "src" / f"m{i}.py").write_text(
                "\n".join(f"def f{k}(x):\n    return x * {k}\n" for k in range(40)))
        command = f"{sys.executable} -m compileall -q -f src"
        what = f"compileall of {n} Python files"
    (work / ".gitignore").write_text("build/\n__pycache__/\n")
    git(["init", "-q", "-b", "main"], work)
    git(["add", "-A"], work)
    git(["commit", "-q", "-m", "bench member"], work)
    bare = base / "app.git"
    git(["clone", "-q", "--bare", str(work), str(bare)], base)
    return bare, command, what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--files", type=int, default=4)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-build-"))
    saved_env = dict(os.environ)
    try:
        bare, command, what = make_member(tmp, args.files)
        (tmp / "manifest.yaml").write_text(
            f"name: bench\nmembers:\n  - name: app\n    url: {bare}\n"
            f"    build: {command!r}\n")
        ws, _ = init_workspace(tmp / "home")
        C.init(ws, tmp / "manifest.yaml")
        mono = C.open_monorepo(ws)
        app = mono.member_dir("app")
        bare_s: list[float] = []
        miss_s: list[float] = []
        hit_s: list[float] = []
        for i in range(args.runs):
            os.environ["FORGE_BENCH_ROUND"] = str(i)  # a new key: a real miss
            t0 = time.perf_counter()
            subprocess.run(["bash", "-c", command], cwd=app, check=True,
                           stdout=subprocess.DEVNULL)
            bare_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            miss = build(ws, mono, "app", app)
            miss_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hit = build(ws, mono, "app", app)
            hit_s.append(time.perf_counter() - t0)
            if miss.cached or not miss.success or not hit.cached or hit.key != miss.key:
                raise SystemExit(f"round {i}: expected a successful miss then a hit")
        ws.close()

        def row(name: str, xs: list[float]) -> str:
            return (f"| {name} | {min(xs) * 1000:.1f} | {statistics.median(xs) * 1000:.1f} |")

        print(f"build: {what}; {args.runs} rounds (bare command, miss, hit interleaved)")
        print("| figure | min ms | median ms |\n|---|---|---|")
        print(row("bare build command (no forge)", bare_s))
        print(row("`build`, miss (the build runs)", miss_s))
        print(row("`build`, hit (cached outcome)", hit_s))
        med = {k: statistics.median(v) for k, v in
               (("bare", bare_s), ("miss", miss_s), ("hit", hit_s))}
        print(f"ratio miss/hit (medians): {med['miss'] / med['hit']:.1f}x; miss over the "
              f"bare command: {(med['miss'] - med['bare']) * 1000:.1f} ms")
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
