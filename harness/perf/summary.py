"""Pure summaries of profiler output: the top operators, kernels or functions by time.

Inputs:
- A chrome trace (`{"traceEvents": [...]}`), the format torch.profiler's
  `export_chrome_trace` writes and SGLang's `/stop_profile` writes per rank (gzipped).
  Complete events (`ph: "X"`) carry `name`, `cat`, `ts` and `dur` (microseconds). When the
  trace has device activity (`cat` kernel, gpu_memcpy, gpu_memset) the summary ranks those
  (device time; they do not nest). Otherwise it ranks `cpu_op` events by *self* time: an
  operator's duration less its direct children's on the same thread (aten::linear contains
  aten::addmm; inclusive times would count the same microsecond twice and shares would exceed
  1). Python-function, annotation and runtime events are not ranked.
- py-spy's raw (collapsed stacks) output: one line per distinct stack,
  `frame;frame;...;leaf COUNT`, a frame being `function (file:line)`. A function's time is
  its leaf (self) samples divided by the sampling rate; samples with an empty stack (` COUNT`)
  count as `(no Python frame)`.

Output (`Summary.as_dict()`): `kind` (kernel | cpu_op | py-spy), `unit` (what the times
measure), `total_ms` (the whole ranked population's time), `count` (events or samples) and
`top`: up to N entries `{name, total_ms, share, count}`, time descending (name ascending on
ties), `share` = the entry's time / `total_ms` (0 when the total is 0). Names longer than
`MAX_NAME` characters are cut (CUDA template names run to kilobytes).
Malformed input raises `TraceError` naming what is wrong.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
MAX_NAME = 200
DEFAULT_TOP = 20
NO_FRAME = "(no Python frame)"


class TraceError(ValueError):
    """Profiler output that cannot be summarised (not JSON, no events, bad fields)."""


@dataclass(frozen=True)
class Op:
    name: str
    total_ms: float
    share: float
    count: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "total_ms": self.total_ms, "share": self.share,
                "count": self.count}


@dataclass(frozen=True)
class Summary:
    kind: str
    unit: str
    total_ms: float
    count: int
    top: tuple[Op, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "unit": self.unit, "total_ms": self.total_ms,
                "count": self.count, "top": [op.as_dict() for op in self.top]}


def _rank(times: Mapping[str, float], counts: Mapping[str, int], n: int) -> tuple[Op, ...]:
    total = sum(times.values())
    order = sorted(times, key=lambda k: (-times[k], k))[:n]
    return tuple(Op(name=k[:MAX_NAME], total_ms=round(times[k], 6),
                    share=round(times[k] / total, 6) if total > 0 else 0.0,
                    count=counts[k]) for k in order)


def load_chrome_trace(data: bytes) -> dict[str, Any]:
    """A chrome trace from its bytes (gzipped or not)."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise TraceError(f"trace: bad gzip data ({e})") from None
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise TraceError(f"trace: not JSON ({e})") from None
    if isinstance(obj, list):  # the JSON Array Format is legal chrome-trace too
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise TraceError("trace: expected an object with a traceEvents list")
    return obj


def _complete_events(traces: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t, trace in enumerate(traces):
        for i, ev in enumerate(trace.get("traceEvents", ())):
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur")  # type: Any, Any, Any
            if not isinstance(name, str) or not _num(ts) or not _num(dur) or dur < 0:
                raise TraceError(f"trace {t} event {i}: a complete event needs name, ts and "
                                 f"dur >= 0 (got name={name!r}, ts={ts!r}, dur={dur!r})")
            out.append({"trace": t, "name": name, "cat": str(ev.get("cat", "")),
                        "ts": float(ts), "dur": float(dur), "pid": ev.get("pid"),
                        "tid": ev.get("tid")})
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v \
        and v not in (float("inf"), float("-inf"))


def self_times(events: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each event's duration less its direct children's (same trace, pid and tid; a child
    starts inside its parent). Events are matched by position in `events`."""
    selfs = [float(e["dur"]) for e in events]
    by_thread: dict[tuple, list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("trace"), e.get("pid"), e.get("tid"))].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack: list[tuple[float, int]] = []  # (end, index) of the open ancestors
        for i in idx:
            ts = events[i]["ts"]
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if stack:
                selfs[stack[-1][1]] -= events[i]["dur"]
            stack.append((ts + events[i]["dur"], i))
    return [max(0.0, s) for s in selfs]


def summarize_chrome(traces: Iterable[Mapping[str, Any]], top: int = DEFAULT_TOP) -> Summary:
    """The top device kernels (if any) or CPU operators by self time, over all `traces`
    (an SGLang capture has one per rank: their times add up)."""
    events = _complete_events(traces)
    device = [e for e in events if e["cat"] in DEVICE_CATS]
    if device:
        kind, unit, chosen = "kernel", "device time (ms)", device
        times_list = [e["dur"] for e in device]
    else:
        chosen = [e for e in events if e["cat"] == "cpu_op"]
        if not chosen:
            raise TraceError("trace: no kernel or cpu_op events (was the profiler recording?)")
        kind, unit = "cpu_op", "CPU self time (ms)"
        times_list = self_times(chosen)
    times: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e, us in zip(chosen, times_list, strict=True):
        times[e["name"]] += us / 1000.0
        counts[e["name"]] += 1
    return Summary(kind=kind, unit=unit, total_ms=round(sum(times.values()), 6),
                   count=len(chosen), top=_rank(times, counts, top))


def summarize_pyspy_raw(text: str, rate_hz: float, top: int = DEFAULT_TOP) -> Summary:
    """The top Python functions by self samples in py-spy's raw output sampled at
    `rate_hz` (time = samples / rate)."""
    if rate_hz <= 0:
        raise TraceError(f"py-spy rate {rate_hz!r}: must be positive")
    times: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    samples = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            raise TraceError(f"py-spy output line {n}: expected 'frame;...;frame COUNT', "
                             f"got {line[:80]!r}")
        # An empty stack: a thread sampled outside any Python frame (starting, or in
        # native code py-spy cannot walk without --native).
        leaf = stack.rsplit(";", 1)[-1] or NO_FRAME
        k = int(count)
        samples += k
        counts[leaf] += k
        times[leaf] += k / rate_hz * 1000.0
    if samples == 0:
        raise TraceError("py-spy output: no samples (was the process busy while sampled?)")
    return Summary(kind="py-spy", unit=f"CPU self time (ms, sampled at {rate_hz:g} Hz)",
                   total_ms=round(sum(times.values()), 6), count=samples,
                   top=_rank(times, counts, top))

