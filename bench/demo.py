"""Demo wall time and where it goes: engine start, warm-up, greedy outputs, benchmark, gates.

Runs the real main job (`run_demo` + the wiki build, as `forge demo` does) in a fresh
temporary workspace, timestamps every progress line, and attributes the time between lines
to phases. Prints a table and the ratio of the wall time to the 5-minute budget.

    .venv/bin/python bench/demo.py [--keep DIR] [--no-wiki]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

BUDGET_S = 300.0

# (substring of the progress line that *starts* a phase, phase name)
PHASES = (
    ("pulling tiny-llama", "pull model"),
    ("pinning the deployment point", "define task"),
    ("launching hf engine", "engine start"),
    ("warming up", "warm-up"),
    ("collecting greedy outputs", "greedy outputs (token match)"),
    ("benchmarking:", "benchmark runs"),
    ("saved b", "ledger saves + gates"),
    ("engine run failed", "engine failure"),
    ("exited", "exit"),
)


def phase_of(line: str, current: str) -> str:
    if "run " in line and "/3:" in line:
        return "benchmark runs"
    for needle, name in PHASES:
        if needle in line:
            return name
    return current


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="Workspace directory to use and keep.")
    ap.add_argument("--no-wiki", action="store_true", help="Skip the index + wiki build.")
    args = ap.parse_args()

    from infer_forge.harness.demo import run_demo
    from infer_forge.ledger.workspace import init_workspace

    home = args.keep or Path(tempfile.mkdtemp(prefix="forge-demo-bench-"))
    if not args.keep:  # a workspace made for this run only goes with it
        atexit.register(shutil.rmtree, home, True)
    spent: dict[str, float] = defaultdict(float)
    state = {"phase": "init", "t": time.monotonic()}

    def echo(line: str) -> None:
        now = time.monotonic()
        spent[state["phase"]] += now - state["t"]
        state["phase"], state["t"] = phase_of(line, state["phase"]), now

    t0 = time.monotonic()
    ws, _ = init_workspace(home)
    with ws:
        run_demo(ws, echo=echo)
        echo("done")
        if not args.no_wiki:
            from infer_forge.wiki.build import build

            t = time.monotonic()
            build(ws)
            spent["index + wiki build"] += time.monotonic() - t
    wall = time.monotonic() - t0
    spent.pop("init", None)
    print(f"demo wall time {wall:.1f} s in {home}")
    print(f"{'phase':<32} {'seconds':>8} {'share':>7}")
    for name, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"{name:<32} {s:8.1f} {s / wall:7.1%}")
    print(f"ratio wall / 5-minute budget: {wall / BUDGET_S:.2f} (goal < 1.00)")


if __name__ == "__main__":
    main()
