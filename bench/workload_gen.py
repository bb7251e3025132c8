"""Building a point's workload (issue 18, item 5): what following the point costs before a run.

    .venv/bin/python bench/workload_gen.py [--rounds 3] [--prompts 256] [--input-len 1024]

- prompts: `workload_for` on a text point (`--prompts` × `--input-len` tokens, the generated
  tiny-llama's tokenizer) vs the same point with `prefix_reuse: 0.75` (groups of 8): ms and
  the ratio prefix/plain (the baseline is the plain random dataset, built in the same run).
- images: one 1024×1024 PNG of `media.png_image` vs the same pixels saved by Pillow
  (PNG, default settings): ms per image, kB, the ratio ours/Pillow.
Each figure is the median of `--rounds` alternating rounds, printed with the 1-minute load
average (2 shared cores).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from infer_forge.harness.bench.datasets import load_tokenizer
from infer_forge.harness.bench.media import png_image
from infer_forge.harness.bench.workload import workload_for
from infer_forge.harness.models.weights import fetch_model
from infer_forge.ledger.specs import DeploymentPoint


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def point(n: int, input_len: int, reuse: float) -> DeploymentPoint:
    return DeploymentPoint.model_validate({
        "model": {"name": "m", "source": "x"},
        "scenario": {"traffic": {"input_len": input_len, "output_len": 64, "concurrency": 32,
                                 "num_prompts": n, "prefix_reuse": reuse}},
        "runtime_profile": {"service": "s", "rev": 1},
        "accelerator": {"vendor": "cpu", "model": "x"}})


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=1024)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        tok = load_tokenizer(fetch_model(Path(home), "tiny-llama").path)
    plain, shared = point(a.prompts, a.input_len, 0.0), point(a.prompts, a.input_len, 0.75)
    tp: list[float] = []
    ts: list[float] = []
    for _ in range(a.rounds):
        tp.append(timed(lambda: workload_for(plain, tok)))
        ts.append(timed(lambda: workload_for(shared, tok)))
    mp, ms = statistics.median(tp), statistics.median(ts)
    print(f"prompts {a.prompts} x {a.input_len} tokens: plain {mp:.0f} ms, prefix 0.75 "
          f"{ms:.0f} ms, ratio prefix/plain {ms / mp:.2f} ({load()})")

    import numpy as np
    from PIL import Image

    ours: list[float] = []
    pil: list[float] = []
    size = {}
    for r in range(a.rounds):
        ours.append(timed(lambda r=r: size.__setitem__("ours", len(png_image(1024, 1024, r)))))
        rng = np.random.default_rng(r)
        px = np.repeat(np.repeat(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), 16, 0), 16, 1)

        def save(px=px) -> None:
            buf = io.BytesIO()
            Image.fromarray(px).save(buf, format="PNG")
            size["pil"] = buf.tell()

        pil.append(timed(save))
    mo, mpil = statistics.median(ours), statistics.median(pil)
    print(f"image 1024x1024: ours {mo:.1f} ms {size['ours'] / 1024:.0f} kB, Pillow "
          f"{mpil:.1f} ms {size['pil'] / 1024:.0f} kB, ratio ours/Pillow {mo / mpil:.2f} "
          f"({load()})")


if __name__ == "__main__":
    main()
