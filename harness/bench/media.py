"""Benchmark media: images generated locally at a point's resolution, as OpenAI image parts.

Contracts:
- `parse_resolution("WxH")` → (W, H); a bad value raises `HarnessError` naming it.
- `png_image(width, height, seed)`: a PNG (8-bit RGB, no interlace) of random colour blocks
  (16×16 pixels), deterministic per seed, written with zlib alone (no imaging library). Every
  seed gives different pixels, so an engine's multimodal cache (which keys images by their
  bytes) never serves one request from another's image; the blocks keep the file small
  (a 1024×1024 image is about 25 kB, not the 3 MB of per-pixel noise) while the encoder still
  sees the full resolution, which is what its cost depends on.
- `data_url(png)`: `data:image/png;base64,…`, the form the OpenAI chat format accepts in an
  `image_url` part; `image_part(url)` is that part.
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import Any

from ..errors import HarnessError

BLOCK = 16  # pixels per colour block side
MAX_SIDE = 16384
_RES = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def parse_resolution(text: str | None) -> tuple[int, int]:
    """`"1024x768"` → (1024, 768) (width, height)."""
    m = _RES.match(text or "")
    if not m:
        raise HarnessError(f"traffic.resolution {text!r} is not WIDTHxHEIGHT (e.g. 1024x1024)")
    w, h = int(m.group(1)), int(m.group(2))
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise HarnessError(f"traffic.resolution {text!r}: each side must be 1..{MAX_SIDE}")
    return w, h


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def png_image(width: int, height: int, seed: int) -> bytes:
    """A PNG of `width`×`height` random colour blocks, the same bytes for the same seed."""
    import numpy as np  # here: only media workloads need it

    rng = np.random.default_rng(seed)
    bw, bh = -(-width // BLOCK), -(-height // BLOCK)
    blocks = rng.integers(0, 256, size=(bh, bw, 3), dtype=np.uint8)
    pixels = np.repeat(np.repeat(blocks, BLOCK, axis=0), BLOCK, axis=1)[:height, :width]
    # Every scanline with filter type 2 (Up: the difference from the row above, mod 256): the
    # rows inside a block row repeat, so most become zeros (a quarter of the size of no filter).
    rows = pixels.reshape(height, width * 3)
    raw = np.full((height, width * 3 + 1), 2, dtype=np.uint8)
    raw[:, 1:] = rows
    raw[1:, 1:] -= rows[:-1]  # uint8 arithmetic wraps: mod 256
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
            + _png_chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + _png_chunk(b"IEND", b""))


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def image_part(url: str) -> dict[str, Any]:
    """One OpenAI chat content part carrying an image."""
    return {"type": "image_url", "image_url": {"url": url}}


def images_for(n_prompts: int, count: int, resolution: str | None, seed: int
               ) -> list[tuple[str, ...]]:
    """`count` distinct image data URLs per prompt for `n_prompts` prompts (seeded: image j of
    prompt i is `png_image(W, H, seed * 1_000_003 + i * count + j)`)."""
    if count < 1:
        return [() for _ in range(n_prompts)]
    w, h = parse_resolution(resolution)
    base = seed * 1_000_003
    return [tuple(data_url(png_image(w, h, base + i * count + j)) for j in range(count))
            for i in range(n_prompts)]
