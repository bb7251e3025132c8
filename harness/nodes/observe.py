"""`forge nodes observe`: sample this host periodically into the registry.

- `Probe` reads the host: CPU and memory (psutil) and, where NVML loads (`nvidia-ml-py`'s
  `pynvml`, or a module with the same functions handed in: the tests' simulated NVML), each
  GPU's utilisation, memory and compute processes with their pids. No NVML is reported in
  the inventory's `accelerator_note` and each summary's `nvml`, never an error.
- `Window` (pure) accumulates samples: it emits a `GpuProcessesChanged` the moment a GPU's
  set of compute pids changes, keeps each GPU's idle streak (consecutive samples with no
  compute process; a missed sample — a gap over 1.5 intervals — or a sample without GPU data
  resets it, so missing observations never count as idle) and closes into a
  `HostSummarized` plus the samples' columns.
- `observe(ws, ...)` registers the host, samples every `interval_s` on a drift-free
  schedule, records changes at once and a summary per `window_s`, echoes a progress line per
  window, and on Ctrl-C records the partial window before stopping.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...ledger import events as E
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from . import registry
from .identity import local_host

Echo = Callable[[str], None]
MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuSample:
    util: float
    mem_used_mib: int
    pids: tuple[int, ...]


@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds
    cpu_pct: float
    mem_used_mib: int
    gpus: dict[str, GpuSample] | None  # None: GPUs could not be read this time


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Probe:
    """Reads this host. `nvml`: a pynvml-like module (None: import pynvml, if installed)."""

    def __init__(self, nvml: Any = None):
        import psutil
        self.psutil = psutil
        self.nvml = nvml
        self.note = ""
        if nvml is None:
            try:
                import pynvml
                self.nvml = pynvml
            except ImportError:
                self.note = "NVML unavailable: nvidia-ml-py is not installed"
        if self.nvml is not None:
            try:
                self.nvml.nvmlInit()
            except Exception as e:  # NVMLError_LibraryNotFound, driver not loaded, ...
                self.note = f"NVML unavailable: {_text(e) or type(e).__name__}"
                self.nvml = None
        psutil.cpu_percent(None)  # primes the counter: the first real sample is an interval
        self.handles: list[tuple[str, Any]] = []
        self.gpus: tuple[E.GpuInfo, ...] = ()
        if self.nvml is not None:
            infos = []
            for i in range(self.nvml.nvmlDeviceGetCount()):
                h = self.nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(self.nvml.nvmlDeviceGetUUID(h))
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                infos.append(E.GpuInfo(index=i, uuid=uuid, vendor="nvidia",
                                       model=_text(self.nvml.nvmlDeviceGetName(h)),
                                       memory_mib=int(mem.total) // MIB))
                self.handles.append((uuid, h))
            self.gpus = tuple(infos)

    def inventory(self) -> E.HostInventory:
        vm = self.psutil.virtual_memory()
        return E.HostInventory(cpus=self.psutil.cpu_count() or 1,
                               memory_mib=int(vm.total) // MIB, gpus=self.gpus,
                               accelerator_note=self.note,
                               source="psutil+nvml" if self.nvml is not None else "psutil")

    def sample(self) -> Sample:
        t = time.time()
        cpu = float(self.psutil.cpu_percent(None))
        mem = int(self.psutil.virtual_memory().used) // MIB
        gpus: dict[str, GpuSample] | None = None
        if self.nvml is not None:
            try:
                gpus = {}
                for uuid, h in self.handles:
                    util = float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                    used = int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) // MIB
                    procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
                    gpus[uuid] = GpuSample(util, used, tuple(sorted(int(p.pid)
                                                                    for p in procs)))
            except Exception as e:  # a GPU fell off the bus, the driver restarted, ...
                self.note = f"NVML error: {_text(e) or type(e).__name__}"
                gpus = None
        return Sample(t, cpu, mem, gpus)

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


@dataclass
class Window:
    """One host's samples between summaries (pure; module docstring). The pids and idle
    streaks carry over from the previous window (`carry`)."""

    host: str
    interval_s: float
    start: float
    pids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    streak: dict[str, int] = field(default_factory=dict)
    last_t: float | None = None
    missed: int = 0
    nvml_note: str = ""
    t: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    mem: list[int] = field(default_factory=list)
    gpu: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    def add(self, s: Sample) -> list[E.GpuProcessesChanged]:
        if self.last_t is not None and s.t - self.last_t > 1.5 * self.interval_s:
            self.missed += max(0, round((s.t - self.last_t) / self.interval_s) - 1)
            self.streak = {u: 0 for u in self.streak}  # unobserved time is not idle time
        self.last_t = s.t
        i = len(self.t)
        self.t.append(s.t)
        self.cpu.append(s.cpu_pct)
        self.mem.append(s.mem_used_mib)
        changes: list[E.GpuProcessesChanged] = []
        if s.gpus is None:
            self.streak = {u: 0 for u in self.streak}
        for uuid, g in (s.gpus or {}).items():
            col = self.gpu.setdefault(uuid, {"util": [None] * i, "mem": [None] * i,
                                             "procs": [None] * i})
            col["util"].append(g.util)
            col["mem"].append(g.mem_used_mib)
            col["procs"].append(len(g.pids))
            before = self.pids.get(uuid)
            if (before is not None and before != g.pids) or (before is None and g.pids):
                old = set(before or ())
                changes.append(E.GpuProcessesChanged(
                    host=self.host, gpu_uuid=uuid, at=_dt(s.t), pids=g.pids,
                    added=tuple(p for p in g.pids if p not in old),
                    removed=tuple(sorted(old - set(g.pids)))))
            self.pids[uuid] = g.pids
            self.streak[uuid] = 0 if g.pids else self.streak.get(uuid, 0) + 1
        for col in self.gpu.values():  # a GPU missing from this sample: a hole, not a zero
            for k in ("util", "mem", "procs"):
                if len(col[k]) <= i:
                    col[k].append(None)
        return changes

    def summary(self, end: float) -> tuple[E.HostSummarized, dict[str, Any]]:
        n = len(self.t)
        gpus = []
        for uuid, col in self.gpu.items():
            utils = [u for u in col["util"] if u is not None]
            mems = [m for m in col["mem"] if m is not None]
            gpus.append(E.GpuWindow(
                uuid=uuid, samples=len(utils),
                util_mean=round(sum(utils) / len(utils), 3) if utils else 0.0,
                util_max=max(utils, default=0.0), mem_used_max_mib=max(mems, default=0),
                busy_samples=sum(1 for p in col["procs"] if p), idle_streak=self.streak.get(
                    uuid, 0), last_pids=self.pids.get(uuid, ())))
        ev = E.HostSummarized(
            host=self.host, start=_dt(self.start), end=_dt(end), interval_s=self.interval_s,
            samples=n, missed=self.missed,
            cpu_pct_mean=round(sum(self.cpu) / n, 3) if n else 0.0,
            cpu_pct_max=max(self.cpu, default=0.0), mem_used_max_mib=max(self.mem, default=0),
            gpus=tuple(gpus), nvml=self.nvml_note or "ok")
        cols = {"t": self.t, "cpu": self.cpu, "mem": self.mem, "gpus": self.gpu}
        return ev, cols

    def next(self, start: float) -> Window:
        """The following window: pids, streaks and the last sample time carry over."""
        return Window(self.host, self.interval_s, start, dict(self.pids), dict(self.streak),
                      self.last_t, nvml_note=self.nvml_note)


@dataclass
class ObserveResult:
    host: str
    samples: int = 0
    summaries: int = 0
    changes: int = 0
    registered: bool = False
    nvml: str = "ok"
    gpus: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _check(name: str, v: float | None, lo: float, hi: float) -> None:
    if v is None:
        return
    if not math.isfinite(v) or not lo <= v <= hi:
        raise HarnessError(f"--{name.replace('_', '-')} {v:g}: must be within {lo:g}..{hi:g}")


def observe(ws: Workspace, *, interval_s: float = 10.0, window_s: float = 300.0,
            count: int | None = None, duration_s: float | None = None,
            probe: Probe | None = None, echo: Echo = lambda _: None,
            host: str | None = None) -> ObserveResult:
    """Sample this host (module docstring) until `count` samples or `duration_s` seconds
    (neither: until interrupted)."""
    _check("interval", interval_s, 0.01, 3600)
    _check("window", window_s, interval_s, 86400)
    _check("for", duration_s, 0, 366 * 86400)
    if count is not None and count < 1:
        raise HarnessError(f"--count {count}: must be at least 1")
    host = host or local_host()
    probe = probe or Probe()
    res = ObserveResult(host)
    try:
        inv = probe.inventory()
        res.registered = registry.register_host(ws, host, inv)
        res.gpus = len(inv.gpus)
        res.nvml = probe.note or "ok"
        if probe.note:
            echo(f"{host}: {probe.note} (observing CPU and memory only)")
        t0 = time.time()
        win = Window(host, interval_s, t0, nvml_note=probe.note)
        tick = 0
        try:
            while True:
                s = probe.sample()
                if not res.samples:
                    first = win.start = s.t  # windows and --for count from the first sample
                win.nvml_note = probe.note
                changes = win.add(s)
                registry.record_changes(ws, changes)
                res.samples += 1
                res.changes += len(changes)
                for c in changes:
                    echo(f"{host}: GPU {c.gpu_uuid} compute pids {list(c.pids)}")
                done = (count is not None and res.samples >= count) or (
                    duration_s is not None and s.t - first >= duration_s)
                if s.t - win.start >= window_s or done:
                    ev, cols = win.summary(s.t)
                    registry.record_summary(ws, ev, cols)
                    res.summaries += 1
                    busy = sum(1 for g in ev.gpus if g.busy_samples)
                    echo(f"{host}: {res.samples} samples, window of {ev.samples}: cpu "
                         f"{ev.cpu_pct_mean:.0f}% mean, mem {ev.mem_used_max_mib} MiB max"
                         + (f", {busy}/{len(ev.gpus)} GPUs busy" if ev.gpus else ""))
                    win = win.next(s.t)
                if done:
                    break
                tick += 1
                # Drift-free: the n-th sample is due at t0 + n * interval.
                time.sleep(max(0.0, t0 + tick * interval_s - time.time()))
        except KeyboardInterrupt:
            if win.t:
                ev, cols = win.summary(win.t[-1])
                registry.record_summary(ws, ev, cols)
                res.summaries += 1
            echo(f"{host}: interrupted; the last window's {len(win.t)} sample(s) recorded")
            raise
    finally:
        probe.close()
    return res

