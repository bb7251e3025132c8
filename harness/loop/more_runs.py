"""More runs instead of a shrug: why an evaluator takes one more run of a block.

Contract:
- `more_runs_reason(contract, results, baseline)`: the block's runs so far (`RunResult`s of
  this evaluation) and, for a candidate, the baseline block's recorded runs (`Baseline`;
  None for the baseline itself) judged by gates.py's `more_runs_reason`: a one-line reason
  ("stability fail: output_throughput CV 0.3451 > max 0.15 over 3 runs") or None when one
  more run could not change a verdict. Pure, no I/O.
- `with_more_runs(take, repeats, contract, baseline, say)`: `take(i)` for i < repeats, then
  up to `contract.more_runs` more, one at a time, while there is a reason; each extra one
  is announced through `say` with its reason and gets `meta.extra_run: true`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...ledger.specs import Contract
from ...ledger.task import Run
from . import gates
from .evaluator_protocol import Baseline, RunResult


def more_runs_reason(contract: Contract | None, results: Sequence[RunResult],
                     baseline: Baseline | None) -> str | None:
    """Why one more run (see the module's contract), or None."""
    if contract is None:
        return None
    def run(metrics: Any, success: bool, meta: Any) -> Run:  # as ledger.task.runs_of reads it
        return Run(metrics, success, meta.get("accuracy") or None,
                   tuple(str(x) for x in meta.get("contaminated") or ()))

    runs = [run(r.metrics, r.success, r.meta) for r in results]
    base = None if baseline is None else [run(b.metrics, b.success, b.meta)
                                          for b in baseline.runs]
    return gates.more_runs_reason(contract, runs, base)


def with_more_runs(take: Callable[[int], RunResult], repeats: int, contract: Contract | None,
                   baseline: Baseline | None, say: Callable[[str], None]) -> list[RunResult]:
    """The repeats, then the extra runs with a reason (see the module's contract)."""
    results = [take(i) for i in range(repeats)]
    more = contract.more_runs if contract is not None else 0
    for k in range(more):
        why = more_runs_reason(contract, results, baseline)
        if why is None:
            break
        say(f"extra run {k + 1}/{more}: {why}")
        res = take(repeats + k)
        results.append(replace(res, meta={**res.meta, "extra_run": True}))
    return results
