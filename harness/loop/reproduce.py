"""`forge reproduce ID`: re-deploy a recorded point, re-run its workload, say whether the
recorded figures come back.

Contract:
- ID: a block (`TASK:BLOCK`), or an event id (or a unique prefix, `projections.trace.
  find_event`) of a measurement (`MeasurementRecorded`), a verification, or a deliverable
  (`DeliverableAccepted` -> its block). A block or deliverable is judged against the block's
  valid (not invalidated), successful runs; a measurement against that one run.
- What is rebuilt: the task's pinned deployment point (by hash) with the block's candidate
  applied (`ledger.specs.apply_candidate`), the runtime profile revision the point names, the
  model the point names from this workspace's models/ (its files checked against its
  manifest, the manifest digest one that `ModelPulled` recorded), and, when the task changes
  code, its MonoRepo worktrees on the block's commits (`code.prepare`, as the measure step
  does; the build runs again). The workload is the point's traffic: the evaluator builds the
  same seeded prompt set from it (`EngineEvaluator`: seed 42, exact token lengths).
- It refuses (`CannotReproduce`, one line; the CLI exits 2) when that point cannot be rebuilt
  here: an unknown ID or one naming no block, a block with no successful run, an unknown
  profile revision, a model not pulled here or whose files no longer match what was recorded,
  or an accelerator this host lacks (a non-CPU point needs that many GPUs of that vendor whose
  name contains the point's model, from the Node Registry's probe; a profile on the
  `external` engine runs wherever its endpoint is, so its accelerator is not checked).
- The run: the task's own evaluator (`command_evaluator.make_evaluator`, the loop's), the block's
  candidate, the contract's repeats (or `repeats`), the baseline's outputs for token match.
  Nothing is written to the task's stream (it has usually exited); engine launches go to the
  engines stream naming the task and block, as the measure step's do.
- The judgement, per gated metric of the contract (primary first; a stability gate's metric,
  else the primary's), medians of recorded and new runs: reproduced when
  |new - recorded| <= band * |recorded| (a recorded 0 must come back 0). The band is `band`
  when given; else max(floor, 3 * CV of the recorded runs, 3 * CV of the new runs, 3 * the
  point's learned noise band (`projections.noise.point_bands`: the pooled run-to-run CV of
  the metric over the point's history, when history supports one)), capped at 0.5 (a figure
  off by half is never "reproduced"). Floor: 0.10 on an accelerator point, 0.25 on a CPU
  point (shared cores: other work moves throughput by tens of percent between runs minutes
  apart), times 1.5 for latencies (`*_ms`: queueing amplifies it). Each figure says which
  term set its band (`band_from`). Reproduced overall: every judged metric reproduced and
  every new run succeeded.
- Host state: the recorded runs' `meta.host` against the re-run's (each new run's, else one
  sample around the whole re-run; harness/nodes/host_state.py `compare`). When the contract
  sets `host` limits and the two are apart (a quantity over its limit on one side only),
  the outcome is `not comparable: recorded at load 5.1 on 2 cores, now 0.4 ...`
  (`not_comparable` in the record, `verdict` in `--json`, the head line) instead of a bare
  verdict, and the CLI exits 1; without limits the difference is only said in progress.
- Recorded: one `ReproductionRecorded` on the `reproductions` stream (verdict, figures,
  bands, what was rebuilt, wall time), whatever the verdict; a refusal records nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.errors import LedgerError
from ...ledger.ids import shown
from ...ledger.specs import DeploymentPoint, HostLimits, apply_candidate
from ...ledger.streams import REPRODUCTIONS_STREAM, WORKSPACE_STREAM
from ...ledger.task import MeasurementRecord
from ...ledger.workspace import Workspace
from ...projections.memory import BlockRecord, TaskMemory, read_memory
from ...projections.noise import point_bands
from ...projections.trace import find_event
from ...repos.errors import RepoError
from ..errors import HarnessError
from ..models.weights import MANIFEST, model_path, parse_name, read_manifest, verify_model
from ..nodes.host_state import HostSampler, compare
from ..task import LoadedTask, load_task_from_ledger
from . import code
from .command_evaluator import make_evaluator
from .evaluator_protocol import Baseline, EvalContext, baseline_of

ACTOR = E.Actor.tool("forge-reproduce")
K_CV = 3.0
FLOOR_ACCELERATOR = 0.10
FLOOR_CPU = 0.25
LATENCY_FACTOR = 1.5
BAND_CAP = 0.5
PROMPT_SEED = 42  # the engine evaluator's prompt-set seed (engine_evaluator._setup)


class CannotReproduce(HarnessError):
    """The recorded point cannot be rebuilt here (one line saying why)."""


@dataclass(frozen=True)
class Target:
    lt: LoadedTask
    mem: TaskMemory
    block: BlockRecord
    runs: list[MeasurementRecord]  # the recorded measurements judged against
    measurement_id: str | None = None


def resolve(ws: Workspace, ident: str) -> Target:
    """The block (and recorded runs) `ident` names, or CannotReproduce."""
    ident = ident.strip()
    measurement = None
    if ":" in ident:
        task_id, _, block_id = ident.partition(":")
    else:
        try:
            rec = find_event(ws.ledger, ident)
        except LedgerError as e:
            raise CannotReproduce(str(e)) from None
        ev = rec.event
        if ev.task_id is None or ev.block_id is None:
            raise CannotReproduce(f"{ev.TYPE} {ev.event_id} names no loop block: nothing to "
                                  "re-deploy (forge reproduce takes a block's measurement, "
                                  "verification or deliverable)")
        task_id, block_id = ev.task_id, ev.block_id
        if isinstance(ev, E.MeasurementRecorded):
            measurement = str(ev.event_id)
    try:
        lt = load_task_from_ledger(ws, task_id)
        mem, _ = read_memory(ws.ledger, task_id)
    except (LedgerError, HarnessError) as e:
        raise CannotReproduce(" ".join(str(e).split())) from None
    block = mem.block(block_id)
    if block is None:
        raise CannotReproduce(f"task {task_id} has no block {shown(block_id)} (its blocks: "
                              f"{', '.join(b.block_id for b in mem.execution_record) or 'none'})")
    runs = [m for m in block.measurements if not m.get("invalidated") and m["success"]
            and (measurement is None or m["event_id"] == measurement)]
    if not runs:
        what = f"measurement {measurement}" if measurement else f"block {task_id}:{block_id}"
        raise CannotReproduce(f"{what} has no successful, valid run to reproduce")
    return Target(lt, mem, block, runs, measurement)


# --- can the point be rebuilt here ------------------------------------------------------


def _local_inventory() -> E.HostInventory:
    # In the function for start-up time: NVML's probe loads when a reproduction reads the host.
    from ..nodes.observe import Probe

    probe = Probe()
    try:
        return probe.inventory()
    finally:
        probe.close()


def check_accelerator(point: DeploymentPoint, engine: str | None,
                      inventory: E.HostInventory | None = None) -> None:
    acc = point.accelerator
    if acc.vendor == "cpu" or engine == "external":
        return
    inv = inventory if inventory is not None else _local_inventory()
    have = [g for g in inv.gpus if g.vendor == acc.vendor
            and acc.model.lower() in g.model.lower()]
    if len(have) < acc.count:
        listed = ", ".join(sorted({f"{g.vendor} {g.model}" for g in inv.gpus})) or "no GPU"
        note = f"; {inv.accelerator_note}" if inv.accelerator_note else ""
        raise CannotReproduce(f"point {point.name or '-'} runs on {acc.count}x {acc.vendor} "
                              f"{acc.model}; this host has {len(have)} ({listed}{note})")


def check_model(ws: Workspace, point: DeploymentPoint) -> tuple[Path, str | None]:
    """The model's directory here and its manifest digest (None: an explicit directory
    without a manifest), after checking its files and that the digest was recorded."""
    source = point.model.source
    try:
        d = model_path(Path(ws.home), source)
    except HarnessError as e:  # it names the model and how to pull it
        raise CannotReproduce(" ".join(str(e).split())) from None
    if not (d / MANIFEST).is_file():
        return d, None  # an explicit directory: what it holds now is what runs
    try:
        digest = read_manifest(d)["digest"]
        problems = verify_model(d)
    except HarnessError as e:
        raise CannotReproduce(f"model {source}: {' '.join(str(e).split())}") from None
    if problems:
        raise CannotReproduce(f"model {source} changed since it was pulled: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                 else ""))
    explicit = Path(source).is_absolute() or source.startswith(".")
    ident = "" if explicit else parse_name(source)[1]
    recorded = {ev.digest for r in ws.ledger.stream(WORKSPACE_STREAM)
                if isinstance(ev := r.event, E.ModelPulled) and ev.name == ident}
    if recorded and digest not in recorded:
        raise CannotReproduce(f"model {source} here has digest {digest}, not one recorded "
                              f"for it ({', '.join(sorted(recorded))})")
    return d, digest


# --- judging ----------------------------------------------------------------------------


def judged_metrics(lt: LoadedTask) -> list[str]:
    """The contract's gated metrics, primary first."""
    c = lt.task.contract
    primary = c.primary.metric if c.primary is not None else None
    names = [primary] if primary else []
    for g in c.gates:
        m = g.metric or (primary if g.kind == "stability" else None)
        if m and m not in names:
            names.append(m)
    return names


def _cv(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = statistics.fmean(xs)
    return statistics.stdev(xs) / abs(mean) if mean else 0.0


def band_for(metric: str, recorded: list[float], new: list[float], *, cpu: bool,
             override: float | None = None, point_cv: float | None = None
             ) -> tuple[float, str]:
    """The band and the term that set it (module contract)."""
    if override is not None:
        return override, "given"
    floor = FLOOR_CPU if cpu else FLOOR_ACCELERATOR
    if metric.endswith("_ms"):
        floor *= LATENCY_FACTOR
    terms = [(floor, "floor"), (K_CV * _cv(recorded), "recorded runs' CV"),
             (K_CV * _cv(new), "new runs' CV")]
    if point_cv is not None:
        terms.append((K_CV * point_cv, "point's noise band"))
    value, why = max(terms, key=lambda t: t[0])
    return (BAND_CAP, "cap") if value > BAND_CAP else (value, why)


def judge(metric: str, recorded: list[float], new: list[float], band: float,
          band_from: str = "given") -> dict[str, Any]:
    rec = statistics.median(recorded)
    out: dict[str, Any] = {"metric": metric, "recorded": rec, "new": None, "ratio": None,
                           "band": band, "band_from": band_from, "reproduced": False,
                           "recorded_runs": recorded, "new_runs": new}
    if not new:
        return out
    nw = statistics.median(new)
    out["new"] = nw
    out["ratio"] = nw / rec if rec else None
    out["reproduced"] = abs(nw - rec) <= band * abs(rec) if rec else nw == 0
    return out


def band_rule(cpu: bool, override: float | None) -> str:
    if override is not None:
        return f"given: {override:g} of the recorded median"
    floor = FLOOR_CPU if cpu else FLOOR_ACCELERATOR
    return (f"max({floor:g} floor ({'CPU' if cpu else 'accelerator'} point; x{LATENCY_FACTOR:g}"
            f" for *_ms), {K_CV:g}xCV of recorded runs, {K_CV:g}xCV of new runs, {K_CV:g}x the "
            f"point's noise band), at most {BAND_CAP:g}")


# --- reproduce --------------------------------------------------------------------------


def _baseline(mem: TaskMemory, block: BlockRecord) -> Baseline | None:
    """What the measure step hands a candidate block (`evaluation.baseline_of`)."""
    return None if block.is_baseline else baseline_of(mem)


def reproduce(ws: Workspace, ident: str, *, repeats: int | None = None,
              band: float | None = None, inventory: E.HostInventory | None = None,
              progress: Callable[[str], None] = lambda _s: None) -> E.ReproductionRecorded:
    """Reproduce `ident` (module contract); the recorded ReproductionRecorded."""
    if repeats is not None and repeats < 1:
        raise HarnessError(f"--repeats {repeats}: must be at least 1")
    if band is not None and not 0 < band < 10:
        raise HarnessError(f"--band {band:g}: must be above 0 (a fraction: 0.1 is 10%)")
    t0 = time.monotonic()
    tg = resolve(ws, ident)
    lt, block = tg.lt, tg.block
    ref = lt.point.runtime_profile
    if lt.profile is None:
        raise CannotReproduce(f"runtime profile {ref.service} rev {ref.rev} is not recorded in "
                              "this workspace (forge profile add FILE)")
    point, profile = apply_candidate(lt.point, lt.profile, block.candidate)
    assert point is not None and profile is not None  # given both, apply returns both
    check_accelerator(point, getattr(profile, "engine", None), inventory)
    model_digest = check_model(ws, point)[1] if lt.task.evaluator.kind != "command" else None
    n = repeats or lt.task.contract.repeats
    try:
        evaluator = make_evaluator(ws, lt.task, profile, base_dir=lt.base_dir)
        prep = code.prepare(ws, lt, block.block_id, block.candidate, progress)
    except RepoError as e:
        raise CannotReproduce(f"the task's code cannot be rebuilt here: {e}") from None
    if prep.failure is not None:
        raise CannotReproduce(prep.failure)
    ctx = EvalContext(ws, lt.task_id, block.block_id, point, profile,
                      _baseline(tg.mem, block), progress, env=prep.env, builds=prep.builds)
    progress(f"re-running {lt.task_id}:{block.block_id} ({n} runs)")
    sampler = HostSampler()
    sampler.start()
    try:
        results = evaluator.evaluate(block.candidate, repeats=n, ctx=ctx)
    finally:
        around = sampler.stop()
    ok = [r for r in results if r.success]
    now = [r.meta["host"] for r in ok if isinstance(r.meta.get("host"), dict)] or [around]
    recorded_host = [m["meta"]["host"] for m in tg.runs
                     if isinstance((m.get("meta") or {}).get("host"), dict)]
    limits = lt.task.contract.host
    apart = compare(recorded_host, now, limits or HostLimits())
    errors = [f"run {i + 1}: {r.error}" for i, r in enumerate(results) if not r.success]
    cpu = point.accelerator.vendor == "cpu"
    metrics = judged_metrics(lt)
    learned = point_bands(ws.ledger, lt.point_hash, metrics) if band is None else {}
    figures = []
    for metric in metrics:
        rec = [float(m["metrics"][metric]) for m in tg.runs if metric in m["metrics"]]
        if not rec:
            continue
        new = [float(r.metrics[metric]) for r in ok if metric in r.metrics]
        nb = learned.get(metric)
        width, why = band_for(metric, rec, new, cpu=cpu, override=band,
                              point_cv=nb.cv if nb is not None else None)
        figures.append(judge(metric, rec, new, width, why))
    done = bool(figures) and not errors and all(f["reproduced"] for f in figures)
    ev = E.ReproductionRecorded(
        target=ident.strip(), point_hash=lt.point_hash, profile=f"{ref.service}@{ref.rev}",
        profile_hash=lt.profile_hash, model_digest=model_digest, repo_snapshot=lt.repo_snapshot,
        candidate=block.candidate, traffic=point.scenario.traffic.model_dump(mode="json"),
        seed=PROMPT_SEED if lt.task.evaluator.kind != "command" else None, repeats=n,
        recorded_runs=[m["event_id"] for m in tg.runs], figures=figures,
        band_rule=band_rule(cpu, band), errors=errors, reproduced=done,
        not_comparable=apart if limits is not None else None,
        wall_s=round(time.monotonic() - t0, 3), task_id=lt.task_id, block_id=block.block_id,
        actor=ACTOR, input_digests=lt.digests)
    ws.ledger.append(REPRODUCTIONS_STREAM, [ev])
    if apart is not None and limits is None:
        progress(f"host state: {apart} (no host limits in the contract: the verdict stands)")
    return ev


def verdict(ev: E.ReproductionRecorded) -> str:
    """`reproduced`, `not reproduced`, or `not comparable: ...` (host states apart)."""
    if ev.not_comparable:
        return ev.not_comparable
    return "reproduced" if ev.reproduced else "not reproduced"


def as_dict(ev: E.ReproductionRecorded) -> dict[str, Any]:
    d = ev.model_dump(mode="json")
    d["verdict"] = verdict(ev)
    return d


def lines(ev: E.ReproductionRecorded) -> list[str]:
    """The human rendering: the verdict, then one line per metric."""
    said = ev.not_comparable or ("reproduced" if ev.reproduced else "NOT reproduced")
    head = (f"{ev.task_id}:{ev.block_id}: {said}"
            f" ({ev.repeats} runs, profile {ev.profile}, point {ev.point_hash[:19]}, "
            f"{ev.wall_s:.0f}s)")
    out = [head]
    for f in ev.figures:
        new = "-" if f["new"] is None else f"{f['new']:.4g}"
        ratio = "-" if f["ratio"] is None else f"{f['ratio']:.3f}"
        out.append(f"  {f['metric']}: recorded {f['recorded']:.4g}, new {new}, ratio {ratio}, "
                   f"band ±{f['band']:.0%} ({f.get('band_from', '-')}): "
                   f"{'ok' if f['reproduced'] else 'OUT'}")
    out += [f"  {e}" for e in ev.errors]
    out.append(f"  band: {ev.band_rule}")
    return out
