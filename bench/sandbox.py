"""Sandboxed vs plain tool call: `run_tool` of `true` as `forge run -- true` makes it (a task
with an open block, its scratch directory as cwd; the event built, outputs stored as
artifacts, not saved), in one process, the two modes interleaved call by call:

- sandboxed: `[guard] sandbox = "auto"` with bwrap here (allowlisted environment, bwrap);
- plain: `[guard] sandbox = "off"` (forge's whole environment, no bwrap: the old way).

    .venv/bin/python bench/sandbox.py [--calls 50] [--flags]

Goal: the sandbox adds ≤ 50 ms per call (difference of the medians). `--flags` also times bare
spawns of `bwrap ... true` with the issue-13 flag set and with each issue-27 addition
(interleaved): what the user and pid namespaces, the fresh /proc, the new session and the
dropped capabilities cost apart.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _manual_task import manual_task_dir, pct  # noqa: E402  (bench/ is on sys.path)
from infer_forge.harness.guard import sandbox as S
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import start_block
from infer_forge.harness.tool_calls.calls import run_tool
from infer_forge.ledger.workspace import init_workspace

REPO = Path(__file__).resolve().parent.parent

def task_dir(root: Path) -> Path:
    return manual_task_dir(root, "bench-sandbox", "bench the sandbox's overhead per tool call")


def spawn(argv: list[str], n: int) -> float:
    """Median wall time of starting and waiting for `argv` (no capture, no event)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1000


# The issue-13 flags, and what issue 27 added (each alone on top, then all of them).
_OLD = ["--ro-bind", "/", "/", "--dev", "/dev", "--unshare-net", "--unshare-ipc",
        "--die-with-parent"]
_ADDED = {"+ --unshare-user": ["--unshare-user"], "+ --unshare-pid": ["--unshare-pid"],
          "+ --unshare-pid --proc /proc": ["--unshare-pid", "--proc", "/proc"],
          "+ --new-session --cap-drop ALL": ["--new-session", "--cap-drop", "ALL"]}


def flag_costs(bwrap: str, n: int) -> None:
    """Median bare spawn of `bwrap <flags> -- true` per flag set, interleaved."""
    true = shutil.which("true") or "/bin/true"
    sets = {"issue-13 set": _OLD, **{k: _OLD + v for k, v in _ADDED.items()},
            "whole sandbox (bwrap_argv)": S.bwrap_argv(  # without bwrap and its "--"
                bwrap, [], cwd=Path("/"), writable=[], network=False, gpus=[])[1:-1]}
    times: dict[str, list[float]] = {k: [] for k in sets}
    for i in range(n + 3):
        for name, flags in sets.items():
            t0 = time.perf_counter()
            subprocess.run([bwrap, *flags, "--", true], check=True)
            if i >= 3:
                times[name].append((time.perf_counter() - t0) * 1000)
    for name, xs in times.items():
        print(f"bare spawn, {name:34} p50 {statistics.median(xs):6.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--flags", action="store_true", help="also time each flag set's spawn")
    args = ap.parse_args()
    bwrap, problem = S.find_bwrap()
    if bwrap is None:
        sys.exit(f"bench/sandbox.py: {problem}")
    with tempfile.TemporaryDirectory(prefix="forge-bench-sandbox-") as tmp:
        ws, _ = init_workspace(Path(tmp) / "home")
        with ws:
            define_task(ws, task_dir(Path(tmp) / "specs"))
            start_block(ws, "bench-sandbox", "bench")
            scratch = S.scratch_of(ws, "bench-sandbox")
            guard = ws.config.settings.guard
            modes = {}
            for mode in ("auto", "off"):
                settings = ws.config.settings.model_copy(
                    update={"guard": guard.model_copy(update={"sandbox": mode})})
                modes[mode] = dataclasses.replace(ws.config, settings=settings)
            times: dict[str, list[float]] = {"auto": [], "off": []}
            kinds: dict[str, set[str]] = {"auto": set(), "off": set()}
            fields = {"task_id": "bench-sandbox", "block_id": "b1"}
            for i in range(args.calls + 3):  # 3 warm-ups each
                for mode in ("auto", "off") if i % 2 == 0 else ("off", "auto"):
                    ws.config = modes[mode]
                    with contextlib.redirect_stderr(io.StringIO()):  # off's warning line
                        t0 = time.perf_counter()
                        run = run_tool(ws, ["true"], cwd=scratch, event_fields=fields)
                        took = time.perf_counter() - t0
                    assert run.returncode == 0, run.event.error
                    kinds[mode].add(run.event.sandbox["kind"])
                    if i >= 3:
                        times[mode].append(took * 1000)
            ws.config = modes["auto"]
            t0 = time.perf_counter()
            for _ in range(args.calls):
                S.prepare(ws, ["true"], cwd=scratch, task="bench-sandbox")
            prep_ms = (time.perf_counter() - t0) / args.calls * 1000
    true = shutil.which("true") or "/bin/true"
    raw_plain = spawn([true], args.calls)
    raw_bwrap = spawn(S.bwrap_argv(bwrap, [true], cwd=Path(tmp).parent, writable=[],
                                   network=False, gpus=[]), args.calls)
    box, plain = times["auto"], times["off"]
    mb, mp = statistics.median(box), statistics.median(plain)
    print(f"calls: {args.calls} each, interleaved (kinds: auto={sorted(kinds['auto'])}, "
          f"off={sorted(kinds['off'])})")
    print(f"{'':34} {'p50':>8} {'p90':>8} {'mean':>8}")
    for name, xs in (("run_tool(true), sandboxed (ms)", box), ("run_tool(true), plain (ms)",
                                                               plain)):
        print(f"{name:34} {statistics.median(xs):8.2f} {pct(xs, 0.9):8.2f} "
              f"{statistics.fmean(xs):8.2f}")
    print(f"difference of medians: {mb - mp:.2f} ms per call (goal <= 50 ms); "
          f"ratio {mb / mp:.2f}x")
    print(f"of which prepare() (allowlist, directories, argv): {prep_ms:.2f} ms; "
          f"bare spawn: true {raw_plain:.2f} ms, bwrap true {raw_bwrap:.2f} ms")
    if args.flags:
        flag_costs(bwrap, args.calls)


if __name__ == "__main__":
    main()
