"""MCP round trip of `forge mcp`: `task_memory` and `measure` called by a real MCP client
(the SDK's stdio client, this process) on a `forge mcp --task` subprocess, against the same
registry call in this process without MCP (`tools.call`), interleaved call by call so both
see the same ledger (the task's stream grows with every `measure`).

    .venv/bin/python bench/mcp_roundtrip.py [--calls 300]

Goal: MCP p50 < 20 ms for both tools.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _manual_task import manual_task_dir, pct  # noqa: E402  (bench/ is on sys.path)
from infer_forge.harness.agents import tool_registry as tools
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import start_block
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import init_workspace

REPO = Path(__file__).resolve().parent.parent

def task_dir(root: Path) -> Path:
    return manual_task_dir(root, "bench-mcp", "bench the MCP round trip")


async def run(home: Path, calls: int) -> dict[str, list[float]]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation

    ws, _ = init_workspace(home)
    define_task(ws, task_dir(home.parent / "specs"))
    start_block(ws, "bench-mcp", "baseline")
    ctx = tools.ToolContext(ws, E.Actor(kind="agent", name="bench/1", model="none"), "bench-mcp",
                            tools=TOOLS)
    args = {"task_memory": {"task_id": "bench-mcp"},
            "measure": {"task_id": "bench-mcp", "metrics": {"output_throughput": 100.0}}}
    t: dict[str, list[float]] = {f"{w} {n}": [] for n in args for w in ("direct", "mcp")}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "infer_forge.cli", "mcp", "--task", "bench-mcp"],
        env={**os.environ, "FORGE_HOME": str(home)}, cwd=str(REPO))
    async with Client(params, client_info=Implementation(name="bench", version="1"),
                      cache=None) as c:
        for name in args:  # warm-up: imports, first reads
            await c.call_tool(name, args[name])
            tools.call(ctx, name, args[name])
        for name in args:
            for _ in range(calls):
                t0 = time.perf_counter()
                r = tools.call(ctx, name, args[name])
                t1 = time.perf_counter()
                m = await c.call_tool(name, args[name])
                t2 = time.perf_counter()
                assert r.ok and not m.is_error, (r.error, m.content)
                t[f"direct {name}"].append((t1 - t0) * 1e3)
                t[f"mcp {name}"].append((t2 - t1) * 1e3)
    ws.close()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="forge-bench-mcp-") as tmp:
        t = asyncio.run(run(Path(tmp) / "home", a.calls))
    print(f"{a.calls} calls each, interleaved (direct, then MCP); ms")
    print(f"{'call':<22}{'p50':>9}{'p99':>9}{'mean':>9}")
    for k, xs in t.items():
        print(f"{k:<22}{pct(xs, 0.5):>9.2f}{pct(xs, 0.99):>9.2f}{statistics.mean(xs):>9.2f}")
    for name in ("task_memory", "measure"):
        d, m = t[f"direct {name}"], t[f"mcp {name}"]
        print(f"{name}: MCP/direct p50 {pct(m, .5) / pct(d, .5):.2f}x, MCP adds "
              f"{pct(m, .5) - pct(d, .5):.2f} ms at p50; goal p50 < 20 ms: "
              f"{'met' if pct(m, .5) < 20 else 'MISSED'}")


if __name__ == "__main__":
    main()
