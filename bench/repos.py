"""MonoRepo benchmark: snapshot of a clean root, and task worktree creation.

    .venv/bin/python bench/repos.py [--files 50000] [--members 8] [--runs 5] [--keep DIR]

Builds 8 local members (one of ~50k small files: written, then one `git add -A` and one
commit in its seed repository; each seed cloned bare as the member's remote), makes a
MonoRepo from a manifest of them (`repos.commands.init`), then, in this one process:

1. `repos.snapshot.take` on the clean root (9 trees: the root and 8 members, run in
   parallel) against plain `git status --porcelain` run over the same 9 trees one after the
   other; median of `--runs` interleaved runs each, after one warm-up of each. Target: the
   snapshot under 1 s.
2. `repos.worktrees.ensure` for a new task on the 50k member against `git worktree add -b`
   of the same commit straight from git; median of 3 runs each, alternating which goes first
   (each worktree and branch is removed again between runs, and the disk synced, outside
   the timing).

The temporary directory goes at the end unless `--keep DIR` is given (then it is built in
DIR and left there; a DIR an earlier run built is used as it is).
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
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))

from infer_forge.ledger.workspace import init_workspace, open_workspace  # noqa: E402
from infer_forge.repos import commands as C  # noqa: E402
from infer_forge.repos import snapshot as snap  # noqa: E402
from infer_forge.repos import worktrees as W  # noqa: E402
from infer_forge.repos.git import git  # noqa: E402
from infer_forge.repos.root import MonoRepo  # noqa: E402

BIG = "big"


def seed(base: Path, name: str, n_files: int) -> Path:
    """A bare remote `base/remotes/<name>.git` whose main holds `n_files` small files in
    directories of 100 (written here, then one add and one commit)."""
    work = base / "seed" / name
    work.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], work)
    for i in range(n_files):
        d = work / "src" / f"d{i // 100:04d}"
        if i % 100 == 0:
            d.mkdir(parents=True)
        (d / f"f{i:06d}.py").write_text(f"# {name} file {i}\nVALUE = {i}\n")
    git(["config", "gc.auto", "0"], work)  # no background gc racing the rmtree below
    git(["add", "-A"], work)
    git(["commit", "-q", "-m", f"{name}: {n_files} files"], work)
    git(["repack", "-adq"], work)  # one pack, as a remote fetched from would hand out
    bare = base / "remotes" / f"{name}.git"
    git(["clone", "-q", "--bare", str(work), str(bare)], base)
    shutil.rmtree(work)  # only the remote is needed from here on
    return bare


def build(base: Path, n_files: int, n_members: int) -> float:
    """Remotes, a manifest and a workspace with the MonoRepo initialised; init's seconds."""
    import yaml

    members = []
    for i in range(n_members):
        name = BIG if i == 0 else f"m{i}"
        bare = seed(base, name, n_files if i == 0 else 200)
        members.append({"name": name, "url": str(bare), "branch": "main"})
    manifest = base / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"name": "bench", "members": members}, sort_keys=False))
    ws, _ = init_workspace(base / "home")
    try:
        t = time.perf_counter()
        C.init(ws, manifest)
        return time.perf_counter() - t
    finally:
        ws.close()


def timed(fn: Callable[..., object], *args: object, **kw: object) -> float:
    t = time.perf_counter()
    fn(*args, **kw)
    return time.perf_counter() - t


def git_status_all(mono: MonoRepo) -> None:
    """The baseline: plain `git status --porcelain` in each of the 9 trees, in turn."""
    for _, _, d in mono.repos():
        subprocess.run(["git", "status", "--porcelain"], cwd=d, check=True,
                       stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=50_000, help="Files in the big member.")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5, help="Timed snapshot runs (>= 5).")
    ap.add_argument("--keep", type=Path, help="Directory to build in and keep.")
    args = ap.parse_args()

    base = args.keep or Path(tempfile.mkdtemp(prefix="forge-repos-bench-"))
    try:
        run(base, args)
    finally:
        if not args.keep:  # a directory made for this run only goes with it
            shutil.rmtree(base, ignore_errors=True)


def run(base: Path, args: argparse.Namespace) -> None:
    if (base / "home" / "forge.toml").is_file():
        print(f"using the MonoRepo built in {base}")
    else:
        base.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        init_s = build(base, args.files, args.members)
        print(f"built {args.members} members ({args.files} files in {BIG!r}) in "
              f"{time.perf_counter() - t:.1f} s; `repos.commands.init` took {init_s:.1f} s")
    ws = open_workspace(base / "home")
    try:
        mono = C.open_monorepo(ws)
        big = mono.member_dir(BIG)
        n = int(subprocess.run(["git", "ls-files"], cwd=big, capture_output=True,
                               check=True).stdout.count(b"\n"))
        print(f"{len(mono.repos())} trees ({n} tracked files in {BIG}), "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")

        # 1. clean snapshot vs plain git status (one warm-up each, then interleaved)
        sid, states = snap.take(mono, ws.artifacts)
        assert not any(s.dirty for s in states), "the root is not clean"
        git_status_all(mono)
        t_snap, t_git = [], []
        for _ in range(max(5, args.runs)):
            t_snap.append(timed(snap.take, mono, ws.artifacts))
            t_git.append(timed(git_status_all, mono))
        ms, mg = statistics.median(t_snap), statistics.median(t_git)
        print(f"snapshot (clean, {sid}): median {ms * 1000:.0f} ms over {len(t_snap)} runs "
              f"(min {min(t_snap) * 1000:.0f}, max {max(t_snap) * 1000:.0f})"
              f"{'' if ms < 1.0 else '  OVER the 1 s target'}")
        print(f"git status --porcelain, 9 trees in turn: median {mg * 1000:.0f} ms "
              f"(min {min(t_git) * 1000:.0f}, max {max(t_git) * 1000:.0f})")
        print(f"ratio snapshot / git status: {ms / mg:.2f}")

        # 2. a task's worktree on the big member vs `git worktree add`
        wt_base = C.worktree_base(ws)
        pinned = subprocess.run(["git", "rev-parse", "HEAD"], cwd=big, capture_output=True,
                                text=True, check=True).stdout.strip()
        tag = f"bench-{os.getpid()}"

        def forge_worktree(i: int) -> float:
            task = f"{tag}-{i}"
            t = timed(W.ensure, mono, wt_base, BIG, task, pinned)
            W.release(mono, wt_base, task)
            git(["branch", "-q", "-D", W.task_branch(task)], big)
            return t

        def plain_worktree(i: int) -> float:
            path, branch = base / "plain-worktrees" / f"{tag}-{i}", f"plain/{tag}-{i}"
            t = timed(subprocess.run, ["git", "worktree", "add", "-q", "-b", branch, str(path),
                                       pinned], cwd=big, check=True)
            git(["worktree", "remove", "--force", str(path)], big)
            git(["branch", "-q", "-D", branch], big)
            return t

        times: dict[str, list[float]] = {"forge": [], "plain": []}
        for i in range(3):  # alternate which goes first; the disk settles before each
            order = [("forge", forge_worktree), ("plain", plain_worktree)]
            for key, fn in order if i % 2 == 0 else order[::-1]:
                os.sync()  # the last removal's 50k unlinks are written out, not timed
                times[key].append(fn(i))
        t_ens, t_add = times["forge"], times["plain"]
        me, ma = statistics.median(t_ens), statistics.median(t_add)
        print(f"worktrees.ensure (new task, {n} files): median {me * 1000:.0f} ms "
              f"({', '.join(f'{x * 1000:.0f}' for x in t_ens)})")
        print(f"git worktree add -b, same commit: median {ma * 1000:.0f} ms "
              f"({', '.join(f'{x * 1000:.0f}' for x in t_add)})")
        print(f"ratio ensure / git worktree add: {me / ma:.2f}")
    finally:
        ws.close()


if __name__ == "__main__":
    main()
