"""How soon `forge mcp` answers `initialize`, against a do-nothing stdlib MCP server.

Makes a workspace like the demo's (`forge init`, the demo's task defined) in a temporary
directory, then spawns, N times each and alternating (which goes first alternates too), the
installed `forge mcp --task demo-tune-tiny-cpu` (the console script, as a client runs it)
and `python bench/mcp_null_server.py`; each gets an `initialize`, then `tools/list`, at
once, as clients send them. Measured in this process: spawn to the `initialize` response,
spawn to the `tools/list` response. Prints each run, both medians and their ratio, the load
average before and after. `--cli` adds `python -m infer_forge.cli mcp` (the CLI path: click
and the ledger load before the front answers). The directory is removed at the end.

    .venv/bin/python bench/mcp_initialize.py [--runs 20] [--cli]

Target (issue 32): forge's median <= 0.3 s to `initialize`.
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

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TASK = "demo-tune-tiny-cpu"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "bench", "version": "1"}}}
MESSAGES = [INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]


def once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Spawn `cmd`, send the messages: (s to initialize's answer, s to tools/list's, tools)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env, cwd=str(REPO))
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("".join(json.dumps(m) + "\n" for m in MESSAGES).encode())
    p.stdin.flush()
    first = json.loads(p.stdout.readline())
    t1 = time.perf_counter()
    listed = json.loads(p.stdout.readline())
    t2 = time.perf_counter()
    p.stdin.close()
    p.wait(60)
    if "result" not in first or "result" not in listed:
        raise SystemExit(f"{cmd}: {first} {listed}")
    return t1 - t0, t2 - t0, len(listed["result"]["tools"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cli", action="store_true", help="also `python -m infer_forge.cli mcp`")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge-bench-mcp-init-"))
    try:
        home = root / "home"
        env = {**os.environ, "FORGE_HOME": str(home)}
        for args in (["init"], ["task", "new", str(REPO / "examples/tasks/demo-tiny-cpu.yaml")]):
            subprocess.run([str(BIN / "forge"), *args], env=env, check=True,
                           capture_output=True)
        cmds = {"forge mcp": [str(BIN / "forge"), "mcp", "--task", TASK],
                "null server": [sys.executable, str(REPO / "bench/mcp_null_server.py")]}
        if a.cli:
            cmds["python -m infer_forge.cli mcp"] = [sys.executable, "-m", "infer_forge.cli",
                                                     "mcp", "--task", TASK]
        load0 = os.getloadavg()
        got: dict[str, list[tuple[float, float, int]]] = {k: [] for k in cmds}
        names = list(cmds)
        for i in range(a.runs):
            for name in names if i % 2 == 0 else names[::-1]:
                got[name].append(r := once(cmds[name], env))
                print(f"run {i + 1:>2} {name:<30} initialize {r[0] * 1000:7.1f} ms  "
                      f"tools/list {r[1] * 1000:7.1f} ms ({r[2]} tools)", flush=True)
        load1 = os.getloadavg()
        print(f"\nload average (1, 5, 15 min): before {load0[0]:.2f} {load0[1]:.2f} "
              f"{load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
               for k, v in got.items()}
        for k, (i_s, l_s) in med.items():
            print(f"median {k:<30} initialize {i_s * 1000:7.1f} ms (min "
                  f"{min(x[0] for x in got[k]) * 1000:.1f})  tools/list {l_s * 1000:7.1f} ms")
        base = med["null server"][0]
        for k in cmds:
            if k != "null server":
                print(f"ratio {k} / null server, initialize: {med[k][0] / base:.2f}x")
        ok = med["forge mcp"][0] <= 0.3
        print(f"target: forge mcp's median initialize <= 300 ms: {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
