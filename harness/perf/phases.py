"""Phase-aware summaries of torch-profiler traces: which kernel (or operator), in which phase.

Pure: named chrome traces in, `Phase` tables out. How an event gets its phase, from SGLang's own
naming (read from the 0.5.23 wheel; docs/perf.md cites the files):
- **Step spans.** `ModelRunner.forward` runs inside `profile_range(build_step_span_name(...))`,
  a `torch.profiler.record_function` (category `user_annotation`) named `step[MODE bs=B ...]`,
  `toks=T` after `bs` for EXTEND (`sglang/srt/utils/profile_utils.py`). MODE is the
  ForwardMode's name, `DRAFT` for a draft model's step and `VERIFY` for a target verify.
  The spans are in SGLang 0.5.11 and later (model_runner.py's `_build_step_span_name` in
  0.5.11 and 0.5.13, moved to profile_utils.py by 0.5.21; not in 0.5.10 and before).
  A CPU event (operator, runtime call) inside a step span on the same thread has that step's
  phase; a device event (kernel, memcpy, memset) has the phase of the runtime call that
  launched it (same `args.correlation`), else of a device-side step annotation
  (`gpu_user_annotation`) containing it.
- **Stage files.** With `profile_by_stage`, each stage is its own file: `...-TP-0-EXTEND` /
  `-DECODE` before the suffix `.trace.json.gz` (the scheduler's profiler, ForwardMode names),
  `-prefill` / `-decode` under `SGLANG_PROFILE_V2`. An event outside any step span takes its
  file's stage (the only phase information before 0.5.11: `profile_by_stage` since 0.4.7).
- Otherwise: `other` (the scheduler's own work between steps) when the capture has step spans,
  else `all` (a trace with no phase information is one phase).
Phase names: EXTEND -> `prefill`, DECODE -> `decode`, every other mode its lower-cased name
(`mixed`, `draft`, `verify`, `idle`, ...).

A capture's table ranks device time when it has device events (`kind` kernel), else CPU
operators by self time (`kind` cpu_op), as summary.py does. Per phase: its `total_ms` and
`per_token_ms` (over the window's output tokens; None when unknown), event `count`, `steps`
and `tokens` (step spans, and their `bs` sum for decode-like modes, `toks` sum for EXTEND;
the largest over the ranks, which run the same steps), `graph_replays` (graph launches:
`cudaGraphLaunch`, `cuGraphLaunch`, `hipGraphLaunch`) and its top entries with `name`,
`count` (calls), `total_ms`, `mean_ms`, `share` of the phase, `per_token_ms` and `graph_ms`
(the time of calls launched by a graph replay: their correlation is a graph launch's).
Ranks add up (one file per rank).
`merged-*` files (SGLang's `merge_profiles`, every rank's events again) are left out when
per-rank files are there.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .summary import DEVICE_CATS, MAX_NAME, TraceError, self_times

STEP = re.compile(r"^step\[([A-Z_0-9]+)(?: bs=(\d+))?(?: toks=(\d+))?")
STAGE_FILE = re.compile(r"-(EXTEND|DECODE|prefill|decode)\.trace\.json(?:\.gz)?$")
GRAPH_LAUNCH = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
MODE_PHASE = {"EXTEND": "prefill", "DECODE": "decode", "prefill": "prefill",
              "decode": "decode"}
TOKENS_FROM_BS = frozenset({"decode", "draft", "verify", "idle"})
OTHER, ALL = "other", "all"


@dataclass(frozen=True)
class PhaseOp:
    name: str
    count: int
    total_ms: float
    mean_ms: float
    share: float
    per_token_ms: float | None
    graph_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "total_ms": self.total_ms,
                "mean_ms": self.mean_ms, "share": self.share,
                "per_token_ms": self.per_token_ms, "graph_ms": self.graph_ms}


@dataclass(frozen=True)
class Phase:
    name: str
    kind: str
    unit: str
    total_ms: float
    per_token_ms: float | None
    count: int
    steps: int
    tokens: int
    graph_replays: int
    top: tuple[PhaseOp, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "unit": self.unit,
                "total_ms": self.total_ms, "per_token_ms": self.per_token_ms,
                "count": self.count, "steps": self.steps,
                "tokens": self.tokens, "graph_replays": self.graph_replays,
                "top": [op.as_dict() for op in self.top]}


def phase_of_mode(mode: str) -> str:
    return MODE_PHASE.get(mode, mode.lower())


def stage_of_file(name: str) -> str | None:
    """The stage a `profile_by_stage` file holds, from its name (None: not a stage file)."""
    m = STAGE_FILE.search(name)
    return MODE_PHASE[m.group(1)] if m else None


def _events(t: int, trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i, ev in enumerate(trace.get("traceEvents", ())):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur")  # type: Any, Any, Any
        if not isinstance(name, str) or not _num(ts) or not _num(dur) or dur < 0:
            raise TraceError(f"trace {t} event {i}: a complete event needs name, ts and "
                             f"dur >= 0 (got name={name!r}, ts={ts!r}, dur={dur!r})")
        raw = ev.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        corr = args.get("correlation")
        out.append({"trace": t, "name": name, "cat": str(ev.get("cat", "")),
                    "ts": float(ts), "dur": float(dur), "pid": ev.get("pid"),
                    "tid": ev.get("tid"),
                    "corr": corr if isinstance(corr, int) and not isinstance(corr, bool)
                    else None})
    return out


def _num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
            and v not in (float("inf"), float("-inf")))


class _Spans:
    """Step spans of one thread, for 'which step contains this instant'. Step spans do not
    nest (one forward at a time per thread); the latest start at or before `ts` decides."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.spans: list[tuple[float, float, str]] = []

    def add(self, ts: float, end: float, phase: str) -> None:
        self.spans.append((ts, end, phase))

    def freeze(self) -> None:
        self.spans.sort()
        self.starts = [s[0] for s in self.spans]

    def at(self, ts: float) -> str | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        return self.spans[i][2] if i >= 0 and ts < self.spans[i][1] else None


def select_files(names: Sequence[str]) -> list[int]:
    """Indexes of the files to summarise: all but `merged-*` when per-rank files are there."""
    per_rank = [i for i, n in enumerate(names) if not n.rsplit("/", 1)[-1].startswith("merged-")]
    return per_rank or list(range(len(names)))


def summarize_phases(named: Sequence[tuple[str, Mapping[str, Any]]], *,
                     output_tokens: float | None = None, top: int = 20) -> tuple[Phase, ...]:
    """Per-phase tables of `named` (file name, chrome trace) pairs (see module docstring);
    phases in order prefill, decode, then by name, `other` last."""
    chosen = select_files([n for n, _ in named])
    events: list[dict[str, Any]] = []
    file_stage: dict[int, str | None] = {}
    for t in chosen:
        name, trace = named[t]
        file_stage[t] = stage_of_file(name)
        events.extend(_events(t, trace))
    if not events:
        raise TraceError("trace: no complete events (was the profiler recording?)")
    cpu_spans: dict[tuple, _Spans] = defaultdict(_Spans)
    gpu_spans: dict[tuple, _Spans] = defaultdict(_Spans)
    steps: dict[tuple[int, str], int] = defaultdict(int)
    tokens: dict[tuple[int, str], int] = defaultdict(int)
    for e in events:
        m = STEP.match(e["name"]) if "annotation" in e["cat"] else None
        if not m:
            continue
        phase = phase_of_mode(m.group(1))
        key = (e["trace"], e["pid"], e["tid"])
        if e["cat"] == "gpu_user_annotation":
            gpu_spans[key].add(e["ts"], e["ts"] + e["dur"], phase)
            continue
        cpu_spans[key].add(e["ts"], e["ts"] + e["dur"], phase)
        steps[(e["trace"], phase)] += 1
        n = m.group(3) if phase == "prefill" else m.group(2) if phase in TOKENS_FROM_BS else None
        tokens[(e["trace"], phase)] += int(n) if n else 0
    for s in (*cpu_spans.values(), *gpu_spans.values()):
        s.freeze()
    phased = bool(cpu_spans or gpu_spans) or any(file_stage.values())

    def fallback(e: Mapping[str, Any]) -> str:
        return file_stage.get(e["trace"]) or (OTHER if phased else ALL)

    corr_phase: dict[tuple[int, int], str] = {}
    graph_corr: set[tuple[int, int]] = set()
    replays: dict[str, int] = defaultdict(int)
    phases: list[str] = []
    for e in events:
        if e["cat"] in DEVICE_CATS:
            phases.append("")  # set below, once every launch's phase is known
            continue
        sp = cpu_spans.get((e["trace"], e["pid"], e["tid"]))
        ph = (sp.at(e["ts"]) if sp else None) or fallback(e)
        phases.append(ph)
        if e["corr"] is not None and e["cat"] in ("cuda_runtime", "cuda_driver"):
            corr_phase[(e["trace"], e["corr"])] = ph
            if e["name"] in GRAPH_LAUNCH:
                graph_corr.add((e["trace"], e["corr"]))
                replays[ph] += 1
    gpu_by_trace: dict[int, list[_Spans]] = defaultdict(list)
    for (t, _pid, _tid), s in gpu_spans.items():
        gpu_by_trace[t].append(s)
    for i, e in enumerate(events):
        if e["cat"] not in DEVICE_CATS:
            continue
        dph = corr_phase.get((e["trace"], e["corr"])) if e["corr"] is not None else None
        if dph is None:
            sp = gpu_spans.get((e["trace"], e["pid"], e["tid"]))
            dph = sp.at(e["ts"]) if sp else None
        if dph is None:  # an annotation on another stream row of the same device
            dph = next((p for s in gpu_by_trace.get(e["trace"], ()) if (p := s.at(e["ts"]))),
                       None)
        phases[i] = dph or fallback(e)
    device = [i for i, e in enumerate(events) if e["cat"] in DEVICE_CATS]
    if device:
        kind, unit, idx = "kernel", "device time (ms)", device
        times = [events[i]["dur"] for i in device]
    else:
        idx = [i for i, e in enumerate(events) if e["cat"] == "cpu_op"]
        if not idx:
            raise TraceError("trace: no kernel or cpu_op events (was the profiler recording?)")
        kind, unit = "cpu_op", "CPU self time (ms)"
        times = self_times([events[i] for i in idx])
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0,
                                                                                       0.0]))
    for i, us in zip(idx, times, strict=True):
        e = events[i]
        row = per[phases[i]][e["name"]]
        row[0] += 1
        row[1] += us / 1000.0
        if e["corr"] is not None and (e["trace"], e["corr"]) in graph_corr:
            row[2] += us / 1000.0
    tok = output_tokens if output_tokens and output_tokens > 0 else None
    out = []
    for ph, rows in per.items():
        total = sum(r[1] for r in rows.values())
        order = sorted(rows, key=lambda k: (-rows[k][1], k))[:top]
        ops = tuple(PhaseOp(
            name=k[:MAX_NAME], count=int(rows[k][0]), total_ms=round(rows[k][1], 6),
            mean_ms=round(rows[k][1] / rows[k][0], 6),
            share=round(rows[k][1] / total, 6) if total > 0 else 0.0,
            per_token_ms=round(rows[k][1] / tok, 6) if tok else None,
            graph_ms=round(rows[k][2], 6)) for k in order)
        out.append(Phase(
            name=ph, kind=kind, unit=unit, total_ms=round(total, 6),
            per_token_ms=round(total / tok, 6) if tok else None,
            count=int(sum(r[0] for r in rows.values())),
            steps=max((n for (t, p), n in steps.items() if p == ph), default=0),
            tokens=max((n for (t, p), n in tokens.items() if p == ph), default=0),
            graph_replays=replays.get(ph, 0), top=ops))
    rank = {"prefill": 0, "decode": 1}
    out.sort(key=lambda p: (rank.get(p.name, 2), p.name == OTHER, p.name))
    return tuple(out)
