"""Warm-up to steady state: windows until two successive ones agree, before measuring.

Contract:
- `warm_up(window)` calls `window()` (one short pass at the measured concurrency, returning
  its output throughput) at least twice, until two successive windows agree within `band`
  (|this/previous - 1| <= band, both positive and finite): steady. It stops unsteady at the
  cap: `max_windows` windows, or `max_s` seconds spent when another window would start.
  Reaching the cap is recorded, not an error; an exception from `window` propagates.
- The record (`Warmup.record()`, stored as every run's `meta.warmup`): `{windows, seconds,
  steady, throughputs}`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BAND = 0.10  # successive windows' output throughput this close: steady
MAX_WINDOWS = 6
MAX_S = 60.0


@dataclass(frozen=True)
class Warmup:
    throughputs: list[float]
    seconds: float
    steady: bool

    def record(self) -> dict[str, Any]:
        return {"windows": len(self.throughputs), "seconds": round(self.seconds, 3),
                "steady": self.steady, "throughputs": [round(x, 3) for x in self.throughputs]}

    def describe(self) -> str:
        tps = " → ".join(f"{x:.3g}" for x in self.throughputs)
        return (f"{'steady' if self.steady else 'not steady (cap reached)'} after "
                f"{len(self.throughputs)} warm-up windows in {self.seconds:.1f}s ({tps} tok/s)")


def agree(a: float, b: float, band: float = BAND) -> bool:
    """Whether two successive windows' throughputs agree within `band`."""
    return all(math.isfinite(x) and x > 0 for x in (a, b)) and abs(b / a - 1) <= band


def warm_up(window: Callable[[], float], *, band: float = BAND, max_windows: int = MAX_WINDOWS,
            max_s: float = MAX_S, clock: Callable[[], float] = time.monotonic) -> Warmup:
    """Windows until steady or the cap (see the module's contract)."""
    start = clock()
    xs: list[float] = []
    while True:
        xs.append(float(window()))
        if len(xs) >= 2 and agree(xs[-2], xs[-1], band):
            return Warmup(xs, clock() - start, True)
        spent = clock() - start
        if len(xs) >= 2 and (len(xs) >= max_windows or spent >= max_s):
            return Warmup(xs, spent, False)
