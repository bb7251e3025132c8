"""Gates: a contract's gates judged on repeated runs, noise-aware. Pure functions, no I/O.

Contract:
- Each gate is judged on the successful runs' samples of its metric: the median, and a
  seeded percentile-bootstrap confidence interval of the median (relative gates: of the
  ratio of the candidate's median to the baseline's median, both resampled).
- Verdict: `pass` when the whole interval is on the good side of the threshold, `fail` when
  the whole interval is on the bad side, otherwise `inconclusive` (too noisy to tell). A
  missing metric or baseline is `inconclusive`, never a guess.
- Stability: at least `repeats` runs, none failed (a run with failed requests cannot pass),
  failed requests per run <= max_failed_requests, the coefficient of variation of the
  metric (default: the primary gate's metric) <= max_cv, and no trend: a series of 3+ runs
  that rises (or falls) strictly run after run with last/first beyond max_cv (10 % when the
  gate has none) `fail`s, "output_throughput rose run after run (52.7 → 79.6 → 108): not
  steady" (`trend`), flagged rather than averaged.
- More runs (`more_runs_reason`): why one more run could change the verdict, or None: a
  stability gate failing on noise alone (CV or trend, no failed run or request over the
  bound), or a level gate whose interval straddles its threshold (`inconclusive` with an
  interval; a candidate's only, the baseline blocking a task only by its stability). The
  evaluators take `Contract.more_runs` such runs at most.
- Accuracy (`kind: accuracy`): the block's per-item results of the gate's lm_eval task (the
  runs' `accuracy[<gate>]`: task, accuracy, items [[doc_id, 0|1], ...], or an `error`) are
  judged non-inferior to the baseline block's within `margin` (default 0.02) by
  `bench.accuracy.judge_accuracy`; no items on either side, or not the same items (their
  ids, or with both recorded, their items digest: the documents), is `inconclusive`. The
  baseline block is not judged against itself (as relative gates).
- The overall verdict: `fail` if any gate fails, else `inconclusive` if any is, else `pass`.
  Every gate result records its numbers and a one-line reason.
- Noise band (only when the contract says `noise: learned`; otherwise results are exactly as
  without it): `judge(..., bands={metric: NoiseBand})` with the point's bands learned from
  history (projections/noise.py). A relative gate that asks for a gain (at_least > 1, or
  at_most < 1) passes only when its interval passes *and* the gain |ratio - 1| exceeds the
  band; a gain inside the band `fail`s (the point varies that much between runs by itself).
  Each gate of a metric with a band quotes it (`band`, `band_groups`, `band_runs`, and the
  reason); an `inconclusive` interval says how many runs per side would likely decide
  (`runs_needed`: its half-width over the threshold shrinking as 1/sqrt(n)). A metric with
  no band (history too thin) is judged as without one, and the reason says so.
- A computed number that is not finite (finite samples whose median, ratio, interval or
  coefficient of variation overflow: two 1.7e308 samples, a ratio over 1e-308) makes its
  gate `fail`, the reason naming the metric and the number: a verdict the ledger can hold,
  never an exception, so the block stays verifiable.
- Host state (only when the contract sets `host`, ledger.specs.HostLimits): a run whose
  `contaminated` reasons (its measurement's meta, harness/nodes/host_state.py) include one
  the limits refuse (host load, other processes' CPU; a foreign GPU process or a throttle
  unless that limit says `flag`) is left out of every gate's samples, the block's and the
  baseline's; a run with only flagged reasons is kept. Every gate's reason then ends with
  what was excluded or flagged (`2 of 3 runs excluded: foreign GPU process pid 4242 ...`).
- Steady tail (only when the contract sets `more_runs`; `settle`): a block whose whole
  series fails stability on noise alone (no failed run) and that has more runs than the
  repeats is judged on its shortest steady tail of at least `repeats` runs, its earlier
  runs left out as not yet steady (an initial transient deleted), the block's and the
  baseline's alike, and every gate's reason says so (`first 4 of 7 runs left out as not
  yet steady (all 7: output_throughput CV 0.2227 > max 0.15 over 7 runs)`). No steady
  tail: every run is judged, and stability fails on them.
- Same inputs and seed → same result, byte for byte.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...ledger import payloads
from ...ledger.bootstrap import bootstrap_ci
from ...ledger.payloads import GateResult
from ...ledger.specs import Contract, Gate, HostLimits
from ...ledger.task import Run
from ..errors import HarnessError
from ..nodes.host_state import is_gpu_reason

if TYPE_CHECKING:
    from ...projections.noise import NoiseBand


@dataclass(frozen=True)
class Verdict:
    verdict: str
    gates: list[GateResult]

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def reason(self) -> str:
        """One line naming each gate that did not pass, with its numbers."""
        bad = [g for g in self.gates if g.verdict != "pass"]
        return "; ".join(f"{g.name} {g.verdict}: {g.reason}" for g in bad) or "all gates pass"


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _values(runs: Sequence[Run], metric: str) -> list[float]:
    return [float(r.metrics[metric]) for r in runs if r.success and metric in r.metrics]


def _not_finite(named: Mapping[str, float | None]) -> str | None:
    """`"<name> <value>"` of the first computed number that is not finite, else None."""
    for name, v in named.items():
        if v is not None and not math.isfinite(v):
            return f"{name} {v}"
    return None


def _overflowed(metric: str | None, what: str, common: dict[str, Any]) -> GateResult:
    """The verdict of a gate whose computed number `what` is not finite: `fail`."""
    return GateResult.judged("fail", reason=f"{metric}: computed {what} is not a finite "
                             "number (the samples overflow a float)", **common)


def _median(xs: Sequence[float]) -> float:
    """statistics.median, inf on overflow (two 1.7e308 samples) instead of a warning."""
    try:
        return statistics.median(xs)
    except OverflowError:
        return math.inf


def _side(lo: float, hi: float, threshold: float, direction: str) -> payloads.Verdict:
    if direction == "at_least":
        return "pass" if lo >= threshold else "fail" if hi < threshold else "inconclusive"
    return "pass" if hi <= threshold else "fail" if lo > threshold else "inconclusive"


def runs_needed(n: int, lo: float, hi: float, estimate: float, threshold: float) -> int | None:
    """Runs in all (per side) that would likely put the interval [lo, hi] around `estimate`
    on one side of `threshold`, the half of it that reaches over the threshold shrinking as
    1/sqrt(n); None when the estimate sits on the threshold (no number of runs is likely to
    decide)."""
    margin = abs(estimate - threshold)
    half = (estimate - lo) if estimate > threshold else (hi - estimate)
    if n < 1 or margin <= 0 or not math.isfinite(half):
        return None
    return max(n + 1, math.ceil(n * (half / margin) ** 2))


def judge_gate(gate: Gate, runs: Sequence[Run],
               baseline: Sequence[Run] | None, *, contract: Contract,
               default_metric: str | None = None,
               bands: Mapping[str, NoiseBand] | None = None) -> GateResult:
    """Judge one gate on the block's runs and the baseline's (`ledger.task.Run`);
    `bands`: the point's noise bands by metric, used when `contract.noise` is `learned`."""
    if gate.kind == "stability":
        return _stability(gate, runs, default_metric)
    if gate.kind == "accuracy":
        return _accuracy(gate, runs, baseline, contract=contract)
    res = _judge_level(gate, runs, baseline, contract=contract)
    if contract.noise != "learned" or gate.metric is None or res.ci is None:
        return res
    return _with_band(gate, res, (bands or {}).get(gate.metric))


def _with_band(gate: Gate, res: GateResult, band: NoiseBand | None) -> GateResult:
    """`res` judged with the point's noise band (see the module's contract)."""
    upd: dict[str, Any] = {}
    notes = []
    verdict = res.verdict
    if band is None:
        notes.append(f"no noise band learned for {gate.metric} at this point")
    else:
        upd.update(band=band.cv, band_groups=band.groups, band_runs=band.runs)
        notes.append(band.describe())
        th = res.threshold
        asks_gain = gate.kind == "relative" and th is not None and (
            (res.direction == "at_least" and th > 1) or (res.direction == "at_most" and th < 1))
        if asks_gain and verdict == "pass" and res.ratio is not None \
                and abs(res.ratio - 1) <= band.cv:
            verdict = "fail"
            notes.insert(0, f"gain {abs(res.ratio - 1):.2%} inside the noise band")
    if verdict == "inconclusive":
        assert res.ci is not None and res.threshold is not None
        est = res.ratio if gate.kind == "relative" else res.median
        need = None if est is None else runs_needed(res.n, res.ci[0], res.ci[1], est,
                                                    res.threshold)
        upd["runs_needed"] = need
        notes.append(f"about {need} runs per side would likely decide" if need is not None
                     else "the estimate sits on the threshold: more runs are unlikely to decide")
    return GateResult.judged(verdict, **{**res.model_dump(exclude={"verdict", "passed"}),
                                         **upd, "reason": res.reason + "; " + "; ".join(notes)})


def _judge_level(gate: Gate, runs: Sequence[Run],
                 baseline: Sequence[Run] | None, *, contract: Contract) -> GateResult:
    assert gate.metric is not None
    direction = "at_least" if gate.at_least is not None else "at_most"
    threshold = float(gate.at_least if gate.at_least is not None else gate.at_most)  # type: ignore[arg-type]
    xs = _values(runs, gate.metric)
    common = {"name": gate.name, "kind": gate.kind, "metric": gate.metric,
              "threshold": threshold, "direction": direction, "n": len(xs),
              "samples": [_r(x) for x in xs]}
    if not xs:
        return GateResult.judged(
            "inconclusive", reason=f"{gate.metric} not measured in any successful run", **common)
    med = _median(xs)
    sign = ">=" if direction == "at_least" else "<="
    if gate.kind == "relative":
        bs = _values(baseline or [], gate.metric)
        if not bs:
            bad = _not_finite({"median": med})
            if bad:
                return _overflowed(gate.metric, bad, common)
            return GateResult.judged("inconclusive", median=_r(med),
                                     reason=f"no baseline samples of {gate.metric}", **common)
        bmed = _median(bs)
        if bmed == 0:
            bad = _not_finite({"median": med})
            if bad:
                return _overflowed(gate.metric, bad, common)
            return GateResult.judged("inconclusive", median=_r(med), baseline_median=0.0,
                                     reason=f"baseline median of {gate.metric} is 0", **common)
        lo, hi = bootstrap_ci(xs, baseline=bs, confidence=contract.confidence,
                              iterations=contract.bootstrap, seed=contract.seed)
        try:
            ratio = med / bmed
        except OverflowError:  # not raised for floats today; the guard costs nothing
            ratio = math.inf
        bad = _not_finite({"median": med, "baseline median": bmed, "ratio": ratio,
                           "interval low": lo, "interval high": hi})
        if bad:
            return _overflowed(gate.metric, bad, common)
        verdict = _side(lo, hi, threshold, direction)
        reason = (f"{gate.metric} ratio {_fmt(ratio)} (CI {_fmt(lo)}..{_fmt(hi)}, "
                  f"median {_fmt(med)} vs baseline {_fmt(bmed)}, n={len(xs)}/{len(bs)}) "
                  f"needs {sign} {_fmt(threshold)}")
        return GateResult.judged(verdict, reason=reason, median=_r(med),
                                 baseline_median=_r(bmed), ratio=_r(ratio), ci=[_r(lo), _r(hi)],
                                 **common)
    lo, hi = bootstrap_ci(xs, confidence=contract.confidence, iterations=contract.bootstrap,
                          seed=contract.seed)
    bad = _not_finite({"median": med, "interval low": lo, "interval high": hi})
    if bad:
        return _overflowed(gate.metric, bad, common)
    verdict = _side(lo, hi, threshold, direction)
    reason = (f"{gate.metric} median {_fmt(med)} (CI {_fmt(lo)}..{_fmt(hi)}, n={len(xs)}) "
              f"needs {sign} {_fmt(threshold)}")
    return GateResult.judged(verdict, reason=reason, median=_r(med), ci=[_r(lo), _r(hi)],
                             **common)


def _accuracy_of(runs: Sequence[Run], name: str) -> tuple[Any, str | None]:
    """The block's per-item results of accuracy gate `name` (an AccuracyRun), or None and why."""
    # In the function for start-up time: lm_eval's wrapper (~75 ms).
    from ..bench.accuracy import AccuracyRun

    why = None
    for r in runs:
        acc = (r.accuracy or {}).get(name)
        if not acc:
            continue
        if acc.get("error"):
            why = acc["error"]
            continue
        items = [(i if isinstance(i, str) else int(i), bool(c)) for i, c in acc.get("items", [])]
        ident = {"items_digest": acc["items_digest"]} if acc.get("items_digest") else {}
        return AccuracyRun(str(acc.get("task")), float(acc.get("accuracy", 0.0)), items,
                           dataset=ident), None
    return None, why or "no per-item results recorded"


def _accuracy(gate: Gate, runs: Sequence[Run],
              baseline: Sequence[Run] | None, *, contract: Contract) -> GateResult:
    """Non-inferiority of the block's accuracy vs the baseline block's on the same items
    (harness/bench/accuracy.py `judge_accuracy`); missing items are `inconclusive`."""
    # In the function for start-up time: lm_eval's wrapper (~75 ms).
    from ..bench.accuracy import judge_accuracy

    margin = gate.margin_or_default
    common = {"name": gate.name, "kind": "accuracy", "metric": "accuracy",
              "threshold": -margin, "direction": "at_least"}
    cand, why = _accuracy_of(runs, gate.name)
    if cand is None:
        return GateResult.judged("inconclusive", reason=f"{gate.task}: {why}", n=0, **common)
    base, bwhy = _accuracy_of(baseline or [], gate.name)
    if base is None:
        return GateResult.judged("inconclusive", reason=f"{gate.task}: baseline: {bwhy}",
                                 n=len(cand.items), median=_r(cand.accuracy), **common)
    digests = (base.dataset.get("items_digest"), cand.dataset.get("items_digest"))
    if None not in digests and digests[0] != digests[1]:  # same ids, other documents
        return GateResult.judged("inconclusive", reason=f"{gate.task}: the block read other "
                                 f"items than the baseline (items digest {digests[1]} vs "
                                 f"{digests[0]}): not paired", n=len(cand.items),
                                 median=_r(cand.accuracy), **common)
    try:
        return judge_accuracy(base, cand, margin=margin, name=gate.name,
                              confidence=contract.confidence, iterations=contract.bootstrap,
                              seed=contract.seed)
    except HarnessError as e:  # not the same items: nothing paired to judge
        return GateResult.judged("inconclusive", reason=f"{gate.task}: {e}",
                                 n=len(cand.items), median=_r(cand.accuracy), **common)


TREND_MIN_RUNS = 3  # a monotone series shorter than this is not called a trend
TREND_BAND = 0.10  # last/first beyond this (or the gate's max_cv when set) is a trend


def trend(metric: str, xs: Sequence[float], max_cv: float | None = None) -> str | None:
    """The one-line reason when `xs` (in run order) rise or fall strictly run after run over
    at least TREND_MIN_RUNS runs and last/first moves beyond `max_cv` (TREND_BAND when None):
    `output_throughput rose run after run (52.7 → 79.6 → 108): not steady`; else None."""
    band = TREND_BAND if max_cv is None else max_cv
    if len(xs) < TREND_MIN_RUNS or not all(math.isfinite(x) for x in xs) or xs[0] <= 0:
        return None
    pairs = list(zip(xs, xs[1:], strict=False))
    if all(b > a for a, b in pairs):
        word = "rose"
    elif all(b < a for a, b in pairs):
        word = "fell"
    else:
        return None
    if abs(xs[-1] / xs[0] - 1) <= band:
        return None
    return (f"{metric} {word} run after run ({' → '.join(f'{x:.3g}' for x in xs)}): "
            "not steady")


def _stability(gate: Gate, runs: Sequence[Run],
               default_metric: str | None) -> GateResult:
    metric = gate.metric or default_metric
    need = gate.repeats or 3
    failed_runs = sum(1 for r in runs if not r.success)
    per_run_failed = [float(r.metrics.get("failed", 0.0)) for r in runs]
    worst = max(per_run_failed, default=0.0)
    allowed = gate.max_failed_requests if gate.max_failed_requests is not None else 0
    xs = _values(runs, metric) if metric else []
    cv = None
    overflow = False
    try:
        if len(xs) >= 2 and statistics.fmean(xs) != 0:
            cv = statistics.stdev(xs) / abs(statistics.fmean(xs))
    except OverflowError:  # fsum of two 1.7e308 samples
        overflow = True
    if cv is not None and not math.isfinite(cv):
        cv, overflow = None, True
    common = {"name": gate.name, "kind": "stability", "metric": metric, "n": len(runs),
              "threshold": gate.max_cv, "direction": "at_most", "cv": _r(cv),
              "failed_runs": failed_runs,
              # the sum, held at the largest float when it overflows (the worst run fails it)
              "failed_requests": min(float(sum(per_run_failed)), sys.float_info.max),
              "samples": [_r(x) for x in xs]}
    if failed_runs:
        return GateResult.judged("fail", reason=f"{failed_runs} of {len(runs)} runs failed",
                                 **common)
    if worst > allowed:
        return GateResult.judged("fail", reason=f"a run had {worst:g} failed requests "
                                 f"(allowed {allowed})", **common)
    if overflow and gate.max_cv is not None:
        return _overflowed(metric, "coefficient of variation", common)
    if len(runs) < need:
        return GateResult.judged("inconclusive",
                                 reason=f"{len(runs)} runs, needs {need} repeats", **common)
    if gate.max_cv is not None and cv is None:
        return GateResult.judged("inconclusive",
                                 reason=f"coefficient of variation of {metric} not computable",
                                 **common)
    # A series that climbs (or sinks) run after run is not averaged: the engine was not steady.
    moving = trend(metric, xs, gate.max_cv) if metric else None
    if gate.max_cv is not None and cv is not None and cv > gate.max_cv:
        return GateResult.judged("fail", reason=f"{metric} CV {cv:.4f} > max {gate.max_cv} "
                                 f"over {len(xs)} runs" + (f"; {moving}" if moving else ""),
                                 **common)
    if moving:
        return GateResult.judged("fail", reason=moving, **common)
    return GateResult.judged("pass", reason=f"{len(runs)} runs, no failures" + (
        f", {metric} CV {cv:.4f} <= {gate.max_cv}" if cv is not None and gate.max_cv is not None
        else ""), **common)


def _refused(reason: str, limits: HostLimits) -> bool:
    """Whether a contamination reason leaves its run out (else it is kept, flagged)."""
    gpu, throttled = is_gpu_reason(reason)
    if gpu:
        return limits.foreign_gpu == "refuse"
    if throttled:
        return limits.throttle == "refuse"
    return True  # host load and other processes' CPU: over the contract's bound


def _clean(runs: Sequence[Run], limits: HostLimits, who: str) -> tuple[list[Run], str]:
    """The runs the gates judge under `limits` and a note naming what was left out or
    flagged ("" when every run was clean)."""
    kept: list[Run] = []
    out: list[str] = []
    flagged: list[str] = []
    for r in runs:
        refused = [x for x in r.contaminated if _refused(x, limits)]
        if refused:
            out += [x for x in refused if x not in out]
            continue
        kept.append(r)
        flagged += [x for x in r.contaminated if x not in flagged]
    notes = []
    if len(kept) < len(runs):
        notes.append(f"{who}{len(runs) - len(kept)} of {len(runs)} runs excluded: "
                     + "; ".join(out))
    if flagged:
        n = sum(1 for r in kept if r.contaminated)
        notes.append(f"{who}{n} of {len(runs)} runs flagged (kept): " + "; ".join(flagged))
    return kept, "; ".join(notes)


def _noise_only(contract: Contract, runs: Sequence[Run]) -> bool:
    """No failed run and no run over a stability gate's failed-request bound: whatever
    fails stability is noise (CV, trend), which more runs may settle."""
    for g in contract.gates:
        if g.kind != "stability":
            continue
        allowed = g.max_failed_requests if g.max_failed_requests is not None else 0
        if any(not r.success or float(r.metrics.get("failed", 0.0)) > allowed for r in runs):
            return False
    return True


def settle(contract: Contract, runs: Sequence[Run], who: str = "") -> tuple[list[Run], str]:
    """The runs a contract with `more_runs` judges and a note ("" when all of them): when
    the whole series fails a stability gate on noise alone (no failed run) and has more
    runs than the gates' repeats, its steady tail, the shortest prefix left out that leaves
    every stability gate passing on at least `repeats` runs (an initial transient deleted,
    as a simulation's warm-up is); the whole series when no tail is steady (the stability
    gate then fails on it, saying why). A contract without `more_runs` judges every run."""
    stab = [g for g in contract.gates if g.kind == "stability"]
    if contract.more_runs == 0 or not stab:
        return list(runs), ""
    need = max(g.repeats or 3 for g in stab)
    metric = contract.primary.metric if contract.primary else None

    def steady(rs: Sequence[Run]) -> tuple[bool, str]:
        res = [_stability(g, rs, metric) for g in stab]
        bad = next((r for r in res if r.verdict != "pass"), None)
        return bad is None, "" if bad is None else bad.reason

    ok, why = steady(runs)
    if ok or len(runs) <= need or not _noise_only(contract, runs):
        return list(runs), ""
    for d in range(1, len(runs) - need + 1):
        if steady(runs[d:])[0]:
            return list(runs[d:]), (f"{who}first {d} of {len(runs)} runs left out as not yet "
                                    f"steady (all {len(runs)}: {why})")
    return list(runs), ""


def _judged(contract: Contract, runs: Sequence[Run], who: str) -> tuple[list[Run], str]:
    """The runs the gates judge (host limits' exclusions, then the steady tail) and a note."""
    notes = []
    kept = list(runs)
    if contract.host is not None:
        kept, note = _clean(kept, contract.host, who)
        notes.append(note)
    kept, note = settle(contract, kept, who)
    notes.append(note)
    return kept, "; ".join(x for x in notes if x)


def more_runs_reason(contract: Contract, runs: Sequence[Run],
                     baseline: Sequence[Run] | None) -> str | None:
    """`"<gate> <verdict>: <reason>"` of the first gate that one more run of the block could
    decide (see the module's contract), or None; `baseline` None: the baseline block
    itself, whose stability alone blocks the task (harness/loop/run.py)."""
    runs = _judged(contract, runs, "")[0]  # judged on the runs the gates would judge
    if baseline is not None:
        baseline = _judged(contract, baseline, "")[0]
    primary = contract.primary
    default_metric = primary.metric if primary else None
    for g in contract.gates:
        if g.kind == "stability":
            res = _stability(g, runs, default_metric)
            allowed = g.max_failed_requests if g.max_failed_requests is not None else 0
            clean = res.failed_runs == 0 and all(
                float(r.metrics.get("failed", 0.0)) <= allowed for r in runs)
            noisy = (res.cv is not None and g.max_cv is not None and res.cv > g.max_cv) or (
                res.metric is not None
                and trend(res.metric, _values(runs, res.metric), g.max_cv) is not None)
            if res.verdict == "fail" and clean and noisy:
                return f"{g.name} {res.verdict}: {res.reason}"
        elif g.kind in ("relative", "absolute") and baseline is not None:
            res = _judge_level(g, runs, baseline, contract=contract)
            if res.verdict == "inconclusive" and res.ci is not None:
                return f"{g.name} {res.verdict}: {res.reason}"
    return None


def judge(contract: Contract, runs: Sequence[Run],
          baseline: Sequence[Run] | None, *, skip_relative: bool = False,
          bands: Mapping[str, NoiseBand] | None = None) -> Verdict:
    """Judge every gate of `contract`; `skip_relative` judges the baseline against itself;
    `bands` as in `judge_gate`."""
    primary = contract.primary
    default_metric = primary.metric if primary else None
    runs, note = _judged(contract, runs, "")
    if baseline is not None:
        baseline, bnote = _judged(contract, baseline, "baseline: ")
        note = "; ".join(x for x in (note, bnote) if x)
    results = [judge_gate(g, runs, baseline, contract=contract, default_metric=default_metric,
                          bands=bands)
               for g in contract.gates
               if not (skip_relative and g.kind in ("relative", "accuracy"))]
    if note:
        results = [GateResult.judged(r.verdict, **{**r.model_dump(exclude={"verdict", "passed"}),
                                                   "reason": f"{r.reason}; {note}"})
                   for r in results]
    verdicts = {g.verdict for g in results}
    overall = "fail" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts \
        else "pass"
    return Verdict(overall, results)
