"""The host's state around one measured run, and whether it contaminated the run.

Contract:
- `HostSampler(nvml=None)` reads this host: psutil and /proc for the CPU side and, where
  NVML loads (the Node Registry's `observe.Probe`: `pynvml`, or a module with its functions
  handed in, such as the tests' simulated NVML), each GPU. `start()` before a run and
  `stop()` after it give one `state` dict (JSON; NVML is held only between the two):
  `{cores, load1, psi_cpu_some_avg10, psi_memory_some_avg10, mem_available_pct,
  foreign_cpu, foreign_top, wall_s, gpus: [...], nvml}`. `load1` is the highest 1-minute
  load average seen at start or end; the PSI fields are `/proc/pressure/*`'s `some avg10`
  (None where the kernel has no PSI); `foreign_cpu` is the CPU time, in cores, that
  processes outside forge's own process tree (this process and its descendants: the
  engines it launched) used over the run, with the largest ones in `foreign_top`
  ([{pid, name, cores}]). Each GPU: index, uuid, SM and memory clocks (MHz), power draw
  and cap (W), temperature (C), the throttle reasons as names, ECC and MIG mode, and its
  `foreign` compute processes ([{pid, name, mem_mib}], pids outside forge's tree). A value
  NVML cannot give is None; an NVML that fails says why in `nvml`, never raises.
  `HostSampler(gpus=[...])` reads only the point's GPUs (indices as NVML and nvidia-smi
  number them, or UUIDs or their prefixes: what CUDA_VISIBLE_DEVICES holds; the launch plan
  sets CUDA_DEVICE_ORDER=PCI_BUS_ID so the two numberings agree), recorded as `gpus_scope`
  ("all" without it): another tenant on a GPU the point does not use is not contamination.
  `deployment_gpus(describe())` gives them for a deployment.
- `contamination(state, limits) -> list[str]` (pure): one reason per breach of `limits`
  (`ledger.specs.HostLimits`): a foreign compute process on a GPU, a GPU throttled for a
  reason other than idling, host load per core above `max_load_per_core`, other processes
  using more than `max_foreign_cpu` of the cores. Empty: clean.
- `compare(recorded, now, limits)` (pure): None when two sets of states are comparable,
  else one line (`recorded at load 5.1 on 2 cores, now 0.4`): a quantity over its limit on
  one side and not the other.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...ledger.specs import HostLimits
from .observe import Probe  # the one NVML loader

MIB = 1024 * 1024

# nvmlClocksThrottleReasons* bits (nvml.h); GpuIdle is not a slowdown of a running job.
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting", 0x200: "board_limit", 0x400: "reliability",
}
BENIGN_THROTTLE = {"gpu_idle", "applications_clocks_setting", "display_clock_setting"}


def throttle_names(mask: int) -> list[str]:
    """The names of the bits set in an NVML throttle-reasons mask (unknown bits as hex)."""
    names = [n for b, n in THROTTLE_BITS.items() if mask & b]
    rest = mask & ~sum(THROTTLE_BITS)
    return names + ([f"0x{rest:x}"] if rest else [])


def psi_some_avg10(kind: str, root: Path = Path("/proc/pressure")) -> float | None:
    """`some avg10` of /proc/pressure/<kind>, None where the kernel has no PSI."""
    try:
        text = (root / kind).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                k, _, v = field.partition("=")
                if k == "avg10":
                    return float(v)
    return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _call(f: Any, *a: Any) -> Any:
    try:
        return f(*a)
    except Exception:  # not supported on this GPU (NVMLError_NotSupported, ...)
        return None


class HostSampler:
    """Samples this host around one run (module contract)."""

    def __init__(self, nvml: Any = None, *, own_pid: int | None = None,
                 gpus: Collection[str | int] | None = None):
        import psutil

        self.psutil = psutil
        self.nvml = nvml
        self.gpus = None if gpus is None else {str(g) for g in gpus}
        self.own_pid = own_pid or os.getpid()
        self.probe: Probe | None = None
        self._t0 = 0.0
        self._cpu0: dict[tuple[int, float], float] = {}
        self._load0 = 0.0

    def close(self) -> None:
        """Releases NVML if a run's sampling is still open (`stop` releases it too)."""
        if self.probe is not None:
            self.probe.close()
            self.probe = None

    def own_pids(self) -> set[int]:
        """forge's process tree: this process and its descendants (the engines it runs)."""
        try:
            me = self.psutil.Process(self.own_pid)
            return {self.own_pid} | {c.pid for c in me.children(recursive=True)}
        except self.psutil.Error:
            return {self.own_pid}

    def _cpu_times(self, own: set[int]) -> dict[tuple[int, float], tuple[str, float]]:
        out = {}
        for p in self.psutil.process_iter(["pid", "name", "cpu_times", "create_time"]):
            info = p.info
            if info["pid"] in own or info["cpu_times"] is None:
                continue
            ct = info["cpu_times"]
            out[(info["pid"], info["create_time"] or 0.0)] = (
                info["name"] or "?", float(ct.user + ct.system))
        return out

    def start(self) -> None:
        self.close()
        self.probe = Probe(self.nvml)  # NVML held only during the run: nothing to leak
        self._t0 = time.monotonic()
        self._load0 = os.getloadavg()[0]
        self._cpu0 = {k: v[1] for k, v in self._cpu_times(self.own_pids()).items()}

    def stop(self) -> dict[str, Any]:
        wall = max(time.monotonic() - self._t0, 1e-6)
        own = self.own_pids()
        used: list[tuple[float, int, str]] = []
        for (pid, ct), (name, t) in self._cpu_times(own).items():
            dt = t - self._cpu0.get((pid, ct), 0.0)  # a process born during the run: all
            if dt > 0:
                used.append((dt, pid, name))
        used.sort(reverse=True)
        vm = self.psutil.virtual_memory()
        gpus = self._gpus(own)
        note = self.probe.note if self.probe is not None else "not sampled"
        self.close()
        return {
            "cores": self.psutil.cpu_count() or 1,
            "load1": round(max(self._load0, os.getloadavg()[0]), 2),
            "psi_cpu_some_avg10": psi_some_avg10("cpu"),
            "psi_memory_some_avg10": psi_some_avg10("memory"),
            "mem_available_pct": round(100.0 * vm.available / vm.total, 1),
            "foreign_cpu": round(sum(u[0] for u in used) / wall, 3),
            "foreign_top": [{"pid": pid, "name": name, "cores": round(dt / wall, 3)}
                            for dt, pid, name in used[:3]],
            "wall_s": round(wall, 3),
            "gpus": gpus,
            "gpus_scope": "all" if self.gpus is None else sorted(self.gpus),
            "nvml": note or "ok",
        }

    def _ours(self, index: int, uuid: str) -> bool:
        """Whether GPU `index` (NVML's numbering) is one of the point's: named by its index
        or by its UUID or a prefix of it, as CUDA_VISIBLE_DEVICES names GPUs."""
        if self.gpus is None:
            return True
        return str(index) in self.gpus or any(
            g.startswith("GPU-") and uuid.startswith(g) for g in self.gpus)

    def _gpus(self, own: set[int]) -> list[dict[str, Any]]:
        probe = self.probe
        nv = probe.nvml if probe is not None else None
        if probe is None or nv is None:
            return []
        out = []
        try:
            for i, (uuid, h) in enumerate(probe.handles):
                if not self._ours(i, uuid):
                    continue
                mask = _call(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
                power = _call(nv.nvmlDeviceGetPowerUsage, h)
                cap = _call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
                ecc = _call(nv.nvmlDeviceGetEccMode, h)
                mig = _call(nv.nvmlDeviceGetMigMode, h)
                foreign = []
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    if int(p.pid) in own:
                        continue
                    try:
                        name = self.psutil.Process(int(p.pid)).name()
                    except self.psutil.Error:
                        name = "?"
                    mem = getattr(p, "usedGpuMemory", None)
                    foreign.append({"pid": int(p.pid), "name": name,
                                    "mem_mib": None if mem is None else int(mem) // MIB})
                out.append({
                    "index": i, "uuid": uuid,
                    "sm_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, h, 1),  # NVML_CLOCK_SM
                    "mem_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, h, 2),  # _MEM
                    "power_w": None if power is None else round(power / 1000, 1),
                    "power_cap_w": None if cap is None else round(cap / 1000, 1),
                    "temperature_c": _call(nv.nvmlDeviceGetTemperature, h, 0),  # _GPU
                    "throttle": None if mask is None else throttle_names(int(mask)),
                    "ecc": None if ecc is None else bool(ecc[0]),  # (current, pending)
                    "mig": None if mig is None else bool(mig[0]),
                    "foreign": foreign,
                })
        except Exception as e:  # a GPU fell off the bus, the driver restarted, ...
            probe.note = f"NVML error: {_text(e) or type(e).__name__}"
            return out
        return out


def deployment_gpus(desc: Mapping[str, Any],
                    environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs a deployment was given, as CUDA_VISIBLE_DEVICES names them: its processes'
    `devices` (a launch plan's, harness/engines/plan.py), else this process's
    CUDA_VISIBLE_DEVICES (an engine that inherits it), else None: not known, every GPU is
    the point's."""
    devs = [str(d) for p in desc.get("processes") or [] for d in p.get("devices") or []]
    if devs:
        return sorted(set(devs), key=lambda d: (not d.isdigit(), d.zfill(8)))
    named = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if named is None:
        return None
    return [d.strip() for d in named.split(",") if d.strip()]


# --- judging (pure) -----------------------------------------------------------------------


def contamination(state: dict[str, Any], limits: HostLimits) -> list[str]:
    """Why this run's measurement is not clean (module contract); [] when it is."""
    reasons = []
    for g in state.get("gpus") or []:
        for p in g.get("foreign") or []:
            mem = "" if p.get("mem_mib") is None else f", {p['mem_mib'] / 1024:.1f} GiB"
            reasons.append(f"foreign GPU process pid {p['pid']} ({p.get('name', '?')}{mem}) "
                           f"on GPU {g['index']}")
        bad = [t for t in g.get("throttle") or [] if t not in BENIGN_THROTTLE]
        if bad:
            reasons.append(f"GPU {g['index']} throttled: {', '.join(bad)}")
    cores = state.get("cores") or 1
    load = state.get("load1")
    if load is not None and load / cores > limits.max_load_per_core:
        reasons.append(f"host load {load:g} per {cores} cores above "
                       f"{limits.max_load_per_core:g} per core")
    foreign = state.get("foreign_cpu")
    if foreign is not None and foreign / cores > limits.max_foreign_cpu:
        top = ", ".join(f"pid {p['pid']} {p['name']} {p['cores']:.2f}"
                        for p in state.get("foreign_top") or [])
        reasons.append(f"other processes used {foreign:.2f} of {cores} cores (above "
                       f"{limits.max_foreign_cpu:g} of them)" + (f": {top}" if top else ""))
    return reasons


def is_gpu_reason(reason: str) -> tuple[bool, bool]:
    """(a foreign GPU process, a throttle) for one of `contamination`'s reasons."""
    return reason.startswith("foreign GPU process"), " throttled: " in reason


def _median(states: Sequence[dict[str, Any]], key: str) -> float | None:
    xs = [float(s[key]) for s in states if s.get(key) is not None]
    return statistics.median(xs) if xs else None


def _gpu_reasons(states: Sequence[dict[str, Any]], limits: HostLimits) -> list[str]:
    """The GPU contamination reasons of these states, each once, in order."""
    return list(dict.fromkeys(x for s in states for x in contamination(s, limits)
                              if any(is_gpu_reason(x))))


def compare(recorded: Sequence[dict[str, Any]], now: Sequence[dict[str, Any]],
            limits: HostLimits) -> str | None:
    """None when the recorded runs' host states and now's are comparable (module
    contract), else `not comparable: ...` with the numbers."""
    if not recorded or not now:
        return None
    cores_r = _median(recorded, "cores") or 1
    cores_n = _median(now, "cores") or 1
    out = []
    for key, what, limit in (("load1", "load", limits.max_load_per_core),
                             ("foreign_cpu", "other processes' CPU", limits.max_foreign_cpu)):
        r, n = _median(recorded, key), _median(now, key)
        if r is None or n is None:
            continue
        if (r / cores_r > limit) != (n / cores_n > limit):
            out.append(f"recorded at {what} {r:.2g} on {cores_r:g} cores, now {n:.2g} on "
                       f"{cores_n:g} (limit {limit:g} per core)")
    gpu_r, gpu_n = _gpu_reasons(recorded, limits), _gpu_reasons(now, limits)
    if bool(gpu_r) != bool(gpu_n):
        out.append(f"recorded with {', '.join(gpu_r)}" if gpu_r
                   else f"now with {', '.join(gpu_n)}")
    return "not comparable: " + "; ".join(out) if out else None
