"""How many evaluations the sweep's halving search needs to find the grid's best (issue 15,
item 6; harness/loop/search.py).

Synthetic scopes with a seeded optimum (harness/testing/synthetic_search.py:
throughput falls with each axis's distance from its optimal value, the first two axes
coupled by `--coupling`, measurements with seeded Gaussian noise of `--cv`). For each seed:
the grid's best (the noise-free argmax over every candidate), and the halving search run with
the band set to the noise's CV (and with no band: no early stop). Reported per space: how
often the search found the grid's best, and its evaluations (a candidate measured twice
counts twice) and distinct candidates as a share of the grid's candidates. The grid itself
needs every candidate at least once (times the contract's repeats in the loop).
The last line printed is a JSON summary.

Run: .venv/bin/python bench/search_halving.py [--seeds 50]
"""

from __future__ import annotations

import argparse
import itertools
import json

from infer_forge.harness.loop.search import Halving
from infer_forge.harness.testing.synthetic_search import synthetic_space

SPACES = {"8x6x5x4": (8, 6, 5, 4), "6x6x6": (6, 6, 6), "10x10": (10, 10)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--cv", type=float, default=0.02)
    ap.add_argument("--coupling", type=float, default=0.03)
    a = ap.parse_args()
    out = {}
    for name, sizes in SPACES.items():
        row: dict[str, object] = {}
        for label, band in (("band", a.cv), ("no_band", 0.0)):
            found, evals, distinct = 0, [], []
            n = 0
            for seed in range(a.seeds):
                axes, true, measure = synthetic_space(seed, sizes, cv=a.cv, coupling=a.coupling)
                grid = [dict(zip(axes, c, strict=True)) for c in itertools.product(*axes.values())]
                n = len(grid)
                res = Halving(axes, band=band).run(measure)
                found += res.best == max(grid, key=true)
                evals.append(res.evaluations / n)
                distinct.append(res.candidates / n)
            row[label] = {"found": f"{found}/{a.seeds}", "grid": n,
                          "evaluations_share_max": round(max(evals), 4),
                          "evaluations_share_mean": round(sum(evals) / len(evals), 4),
                          "distinct_share_mean": round(sum(distinct) / len(distinct), 4)}
        out[name] = row
        print(name, json.dumps(row))
    print(json.dumps({"cv": a.cv, "coupling": a.coupling, "seeds": a.seeds, "spaces": out}))


if __name__ == "__main__":
    main()
