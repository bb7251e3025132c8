"""The seeded percentile bootstrap of a median (pure): one implementation for the gates that
judge a block (harness/loop/gates.py) and for the comparisons people read
(projections/comparison.py), so an interval on a page is the one a gate computes from the
same runs.

Contracts:
- `bootstrap_ci(samples, baseline=None, confidence, iterations, seed)`: the percentile
  interval (`inverted_cdf`) of median(samples) over `iterations` resamples, or of
  median(samples) / median(baseline) with both resampled (resamples whose baseline median is
  0 are dropped); (nan, nan) when no resample is left. The same inputs give the same interval:
  the resampling indices are the seeded PCG64 generator's first draws (the samples' indices,
  then the baseline's), which depend only on the sizes, the iteration count and the seed, and
  are drawn once per process for each such combination.
- Bounds may be infinite (overflow); callers decide what that means. No warning is raised.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

DRAWS_KEPT = 64  # (sizes, iterations, seed) combinations whose indices are kept in memory


@functools.lru_cache(maxsize=DRAWS_KEPT)
def _draws(n: int, n_base: int | None, iterations: int, seed: int) -> tuple[Any, Any]:
    import numpy as np  # here: importing this module (every forge command) stays fast

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(iterations, n))
    base = rng.integers(0, n_base, size=(iterations, n_base)) if n_base else None
    return idx, base


def bootstrap_ci(samples: Sequence[float], *, baseline: Sequence[float] | None = None,
                 confidence: float = 0.95, iterations: int = 2000, seed: int = 0
                 ) -> tuple[float, float]:
    """Percentile-bootstrap interval of a median or a ratio of medians (module contract)."""
    import numpy as np

    idx, base = _draws(len(samples), len(baseline) if baseline is not None else None,
                       iterations, seed)
    xs = np.asarray(samples, dtype=float)
    # Overflow gives an infinite bound, which the callers turn into a verdict (no warning).
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        stats = np.median(xs[idx], axis=1)
        if baseline is not None:
            mb = np.median(np.asarray(baseline, dtype=float)[base], axis=1)
            keep = mb != 0
            stats = stats[keep] / mb[keep]
        if stats.size == 0:
            return (float("nan"), float("nan"))
        alpha = (1 - confidence) / 2
        lo, hi = np.quantile(stats, [alpha, 1 - alpha], method="inverted_cdf")
    return (float(lo), float(hi))
