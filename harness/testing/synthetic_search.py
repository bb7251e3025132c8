"""A synthetic sweep scope with a known optimum, for the halving search's tests and bench.

`synthetic_space(seed, sizes, cv, coupling)` -> (axes, true, measure): `len(sizes)` axes of
integer values; a seeded optimal value per axis; `true(candidate)` falls with each axis's
distance from its optimum (6 % per step plus 1 % per step squared), the first two axes
coupled by `coupling` (a cosine of both: the optimum is not found axis by axis for free);
`measure(candidate)` is `true` times seeded Gaussian noise of relative sd `cv`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any


def synthetic_space(seed: int, sizes: Sequence[int] = (8, 6, 5, 4), cv: float = 0.02,
                    coupling: float = 0.03
                    ) -> tuple[dict[str, list[int]], Callable[[dict[str, Any]], float],
                               Callable[[dict[str, Any]], float]]:
    rng = random.Random(seed)
    axes = {f"k{i}": list(range(n)) for i, n in enumerate(sizes)}
    opt = {k: rng.randrange(len(v)) for k, v in axes.items()}

    def true(c: dict[str, Any]) -> float:
        f = 1000.0
        for k in axes:
            d = abs(c[k] - opt[k])
            f *= 1 - 0.06 * d - 0.01 * d * d
        second = c["k1"] if "k1" in c else 0
        return f * (1 + coupling * math.cos(c["k0"] * 0.7 + second * 1.3))

    noise = random.Random(seed + 1000)

    def measure(c: dict[str, Any]) -> float:
        return true(c) * (1 + noise.gauss(0, cv))

    return axes, true, measure
