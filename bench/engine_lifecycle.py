"""Weights pull and engine lifecycle costs, each against a baseline in the same run.

    .venv/bin/python bench/engine_lifecycle.py [--starts 3]

- pull: generating tiny-llama (cold) vs pulling it again (idempotent: verify hashes only);
- hf: `transformers serve` start-to-ready and stop, through the engine;
- overhead: launching and stopping the SGLang stand-in server through the engine (command
  building, health polling with proc.poll(), server_info, process-group teardown, ledger
  events, log artifact) vs a bare Popen + health poll + kill of the same server.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.process import free_port
from infer_forge.harness.models.weights import pull
from infer_forge.ledger.workspace import init_workspace

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "data" / "sglang" / "fake_server.py"


def bare_start_stop() -> float:
    port = free_port()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=2):
                break
        except OSError:
            time.sleep(0.02)
    p.kill()
    p.wait()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ws, _ = init_workspace(Path(tmp) / "home")
        with ws:
            t0 = time.perf_counter()
            model = pull(ws, "tiny-llama")
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            pull(ws, "tiny-llama")
            warm = time.perf_counter() - t0
            print(f"pull tiny-llama: cold {cold:.2f} s, again {warm:.3f} s "
                  f"(ratio again/cold {warm / cold:.3f}), digest {model.digest[:19]}")

            starts, stops = [], []
            for _ in range(args.starts):
                t0 = time.perf_counter()
                running = engine_for("hf").launch({"dtype": "float32",
                                                   "attn_implementation": "sdpa"},
                                                  model=model.path, ws=ws)
                starts.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                running.stop()
                stops.append(time.perf_counter() - t0)
            print(f"hf engine: start-to-ready median {statistics.median(starts):.2f} s "
                  f"(min {min(starts):.2f}), stop median {statistics.median(stops):.2f} s")

            ours, bare = [], []
            cfg = {"version": "0.5.23", "launcher": [sys.executable, str(FAKE)]}
            for _ in range(5):
                bare.append(bare_start_stop())
                t0 = time.perf_counter()
                with engine_for("sglang").launch(cfg, model="Qwen/Qwen3-8B", ws=ws) as r:
                    r.describe()
                ours.append(time.perf_counter() - t0)
            b, o = statistics.median(bare), statistics.median(ours)
            print(f"stand-in sglang launch+describe+stop: engine {o:.3f} s vs bare Popen+poll+"
                  f"kill {b:.3f} s (ratio {o / b:.2f})")


if __name__ == "__main__":
    main()
