"""`make demo`'s install from a cold pip cache: before (one recipe for the demo and the tests:
torch, then the package with the dev, PostgreSQL and Ray extras) and after (the demo's own:
torch and the package's core; `make test` adds the extras later).

    .venv/bin/python bench/demo_install.py [--pypi] [--before REV] [--order after,before]
                                           [--keep DIR]

Each variant runs `make` in this checkout on a virtual environment of its own (`VENV=` a new
folder) with an empty pip cache of its own (`PIP_CACHE_DIR=` a new folder); the rest of pip's
configuration (indexes, find-links) is the machine's, as `make demo` would see it. `--pypi`:
every package but torch from PyPI instead of the machine's local indexes (so each run
downloads; torch's CPU wheel still from the machine's find-links, as make finds it). Before:
the Makefile at REV (default afb6ecc, the last with the single recipe; `git show
REV:Makefile`), target `venv`. After: the working tree's Makefile, target `venv-demo`.
Prints each variant's wall time, the packages installed, the venv's size, and the ratio
before / after."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEFORE_REV = "afb6ecc"  # Makefile: `make demo` installed '.[dev,postgres,ray]'
CONSTRAINTS = "/etc/xdg/pip/constraints.txt"  # this machine's pip.conf names it


def size_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 1024


def install(name: str, makefile: Path, target: str, root: Path, pypi: bool = False
            ) -> dict[str, float | str]:
    venv, cache = root / f"venv-{name}", root / f"pip-cache-{name}"
    cache.mkdir()
    env = {**_env(), "PIP_CACHE_DIR": str(cache)}
    if pypi:
        # PyPI over the network for every package but torch (its CPU wheel from the
        # machine's find-links, as make finds it); the machine's constraints kept.
        env["PIP_CONFIG_FILE"] = os.devnull
        for k in ("PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
            env.pop(k, None)
        if Path(CONSTRAINTS).is_file():
            env["PIP_CONSTRAINT"] = CONSTRAINTS
    cmd = ["make", "-C", str(REPO), "-f", str(makefile), f"VENV={venv}", target]
    print(f"[{name}] {' '.join(cmd)}  (PIP_CACHE_DIR={cache})", flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"[{name}] make failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"],
                            capture_output=True, text=True, check=True, env=env).stdout
    out: dict[str, float | str] = {"variant": name, "wall_s": wall,
                                   "packages": len(listed.splitlines()),
                                   "venv_mb": size_mb(venv)}
    print(f"[{name}] {wall:.0f} s, {out['packages']} packages, venv {out['venv_mb']:.0f} MB",
          flush=True)
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("VIRTUAL_ENV", "PYTHONHOME"):  # the bench's own venv is not the one installed
        env.pop(k, None)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=BEFORE_REV, help="revision of the old Makefile")
    ap.add_argument("--order", default="after,before",
                    help="which runs first (the second finds the OS's file cache warmer)")
    ap.add_argument("--keep", type=Path, help="keep the venvs and caches in this folder")
    ap.add_argument("--pypi", action="store_true",
                    help="fetch from PyPI, not the machine's local indexes (torch excepted)")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="forge-install-"))
    root.mkdir(parents=True, exist_ok=True)
    old = root / "Makefile.before"
    old.write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{a.before}:Makefile"],
                                  capture_output=True, text=True, check=True).stdout)
    plans = {"before": (old, "venv"), "after": (REPO / "Makefile", "venv-demo")}
    results = {}
    try:
        for name in a.order.split(","):
            results[name] = install(name, *plans[name], root, a.pypi)
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print("| install | wall | packages | venv |")
    print("|---|---|---|---|")
    for name in ("before", "after"):
        r = results[name]
        print(f"| {name} | {r['wall_s']:.0f} s | {r['packages']} | {r['venv_mb']:.0f} MB |")
    ratio = float(results["before"]["wall_s"]) / float(results["after"]["wall_s"])
    print(f"\nratio before / after: {ratio:.2f}x (order: {a.order}"
          f"{'; from PyPI' if a.pypi else ''})")


if __name__ == "__main__":
    main()
