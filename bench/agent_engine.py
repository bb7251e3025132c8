"""An engine started for an agent (in the tool-call sandbox) against the same engine started
plainly: start-to-ready time, interleaved in one run.

    .venv/bin/python bench/agent_engine.py [--starts 4]

Both launch the embedded engine (`transformers serve` on the generated tiny-llama, one thread)
through `engine_for("hf").launch`; the only difference is the launch's recorded actor: an
agent's (guard/engine_sandbox.py wraps every process in bubblewrap: user, pid, IPC
namespaces, no capabilities, a fresh /proc) or forge's own. Starts alternate, so load on the
machine falls on both alike. Prints each start, the medians and sandboxed/plain (issue 27's
bar: within 10 %, i.e. at most 1.10).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from infer_forge.harness.engines import engine_for
from infer_forge.harness.guard.sandbox import find_bwrap
from infer_forge.harness.models.weights import pull
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import init_workspace

CONFIG = {"continuous_batching": False, "attn_implementation": "sdpa", "dtype": "float32",
          "compile": False, "threads": 1}
AGENT = E.Actor.agent("bench/1", "none")


def start(ws, model: str, actor: E.Actor | None) -> float:
    fields = {"actor": actor} if actor is not None else None
    eng = engine_for("hf").launch(CONFIG, model=model, ws=ws, event_fields=fields)
    try:
        return float(eng.server.startup_s)
    finally:
        eng.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=4, help="starts of each kind")
    args = ap.parse_args()
    if find_bwrap()[0] is None:
        sys.exit(f"bench/agent_engine.py: {find_bwrap()[1]}")
    with tempfile.TemporaryDirectory() as tmp:
        ws, _ = init_workspace(Path(tmp) / "home")
        with ws:
            model = str(pull(ws, "tiny-llama").path)
            start(ws, model, None)  # warm the page cache for both kinds
            plain: list[float] = []
            boxed: list[float] = []
            for i in range(args.starts):
                plain.append(start(ws, model, None))
                boxed.append(start(ws, model, AGENT))
                print(f"start {i + 1}: plain {plain[-1]:.2f} s, sandboxed {boxed[-1]:.2f} s",
                      flush=True)
    mp, mb = statistics.median(plain), statistics.median(boxed)
    print(f"median start-to-ready: plain {mp:.2f} s, sandboxed {mb:.2f} s")
    print(f"ratio sandboxed/plain: {mb / mp:.3f} (bar: <= 1.10)")


if __name__ == "__main__":
    main()
