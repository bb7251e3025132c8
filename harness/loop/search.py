"""Search policies for the sweep that need fewer evaluations than the full grid. Pure, no I/O.

`halving`: successive halving over the scope's axes, one axis at a time (coordinate search).
- Start at the first value of every axis. For each axis in scope order: the candidates are the
  current point with that axis set to each of its values. Rung 1 evaluates each once; then the
  best `1/eta` (by the mean of their first r evaluations; `direction` says which way is
  better) go on to rung 2 with twice as many evaluations, and so on until one is left. Early
  stop: when the leader's relative advantage over the runner-up exceeds `z` noise bands
  scaled to the rung (`z * band * sqrt(2 / r)`: the band is one run's CV, the means are over
  r runs), the leader wins at once. The winner becomes the current point's value of that axis.
- Passes over all axes repeat until a pass changes nothing (or `max_passes`).
- Evaluations are cached: a candidate measured before (another axis, another pass) reuses its
  first r values; only missing ones are asked for.
- Replay form: `next_candidate(observed)` is a function of what was observed so far (the
  values of each candidate, in order): it replays the policy against them and answers the
  first evaluation it lacks, or None when the search is done (`best(observed)` then says
  which). So a loop resumed from its ledger asks again and gets the same answer; the sweep
  executor feeds it one value per block (the block's median of the primary metric).
- `run(evaluate)` drives it with a function (tests, benchmarks) and counts evaluations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Candidate = dict[str, Any]


def key(candidate: Mapping[str, Any]) -> str:
    """A candidate's identity in `observed` (canonical JSON)."""
    return json.dumps(dict(candidate), sort_keys=True, separators=(",", ":"))


class _Need(Exception):
    def __init__(self, candidate: Candidate):
        self.candidate = candidate


@dataclass(frozen=True)
class Halving:
    """Successive halving over `axes` (scope key -> its values, in order); see the module."""

    axes: Mapping[str, Sequence[Any]]
    direction: str = "at_least"  # at_least: larger is better; at_most: smaller is better
    band: float = 0.0  # the metric's noise band (run-to-run CV) at the point
    eta: int = 2
    z: float = 2.0
    max_passes: int = 3

    def __post_init__(self) -> None:
        if not self.axes or any(len(v) == 0 for v in self.axes.values()):
            raise ValueError("halving needs every scope axis to have at least one value")
        if self.eta < 2:
            raise ValueError(f"eta {self.eta}: must be at least 2")

    def _score(self, xs: Sequence[float]) -> float:
        m = sum(xs) / len(xs)
        return m if self.direction == "at_least" else -m

    def _replay(self, observed: Mapping[str, Sequence[float]]) -> Candidate:
        def values(c: Candidate, r: int) -> list[float]:
            got = observed.get(key(c), ())
            if len(got) < r:
                raise _Need(c)
            return list(got[:r])

        current = {k: v[0] for k, v in self.axes.items()}
        for _ in range(self.max_passes):
            changed = False
            for axis, vals in self.axes.items():
                pool = [{**current, axis: v} for v in vals]
                r = 1
                while True:
                    for c in pool:  # every evaluation of this rung, in order
                        values(c, r)
                    ranked = sorted(pool, key=lambda c: -self._score(values(c, r)))
                    if len(ranked) == 1:
                        break
                    lead = abs(sum(values(ranked[0], r)) / r)
                    second = abs(sum(values(ranked[1], r)) / r)
                    adv = abs(lead - second) / max(lead, second, 1e-12)
                    if self.band > 0 and adv > self.z * self.band * math.sqrt(2 / r):
                        ranked = ranked[:1]
                        break
                    pool = ranked[:max(1, math.ceil(len(ranked) / self.eta))]
                    if len(pool) == 1:  # the last one left needs no more evaluations
                        ranked = pool
                        break
                    r *= 2
                winner = ranked[0]
                if winner[axis] != current[axis]:
                    changed = True
                current = winner
            if not changed:
                break
        return current

    def next_candidate(self, observed: Mapping[str, Sequence[float]]) -> Candidate | None:
        """The candidate whose next evaluation the search needs, or None when it is done."""
        try:
            self._replay(observed)
        except _Need as need:
            return need.candidate
        return None

    def best(self, observed: Mapping[str, Sequence[float]]) -> Candidate | None:
        """The search's answer once done (None while it still needs evaluations)."""
        try:
            return self._replay(observed)
        except _Need:
            return None

    def run(self, evaluate: Callable[[Candidate], float], *, limit: int = 100_000
            ) -> SearchResult:
        """Drive the search with `evaluate` (one noisy measurement per call)."""
        observed: dict[str, list[float]] = {}
        n = 0
        while (c := self.next_candidate(observed)) is not None:
            if n >= limit:
                raise RuntimeError(f"halving did not finish within {limit} evaluations")
            observed.setdefault(key(c), []).append(float(evaluate(c)))
            n += 1
        best = self.best(observed)
        assert best is not None
        return SearchResult(best=best, evaluations=n, observed=observed)


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    evaluations: int  # measurements asked for (a candidate measured twice counts twice)
    observed: dict[str, list[float]] = field(default_factory=dict)

    @property
    def candidates(self) -> int:
        """Distinct candidates measured."""
        return len(self.observed)
