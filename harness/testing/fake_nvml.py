"""A simulated NVML at the library boundary: the functions of `pynvml` (nvidia-ml-py) that
the Node Registry and the host state (harness/nodes/host_state.py) call, over a scripted set
of GPUs whose compute processes, clocks and throttle reasons tests (and the observation
benchmark) set. Values are shaped like a real H100/H200's."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    total_mib: int = 143771
    util: float = 0.0
    used_mib: int = 0
    pids: list[int] = field(default_factory=list)
    sm_mhz: int = 1980
    mem_mhz: int = 3201
    power_mw: int = 120000
    cap_mw: int = 700000
    temp_c: int = 38
    throttle: int = 0  # nvmlClocksThrottleReason* bits
    ecc: int = 1
    mig: int = 0


class FakeNvml:
    """Pass as `Probe(nvml=FakeNvml(...))`. `fail_init` simulates a host without a driver;
    `fail_sample` makes sampling raise (a GPU fallen off the bus)."""

    NVMLError = NVMLError

    def __init__(self, gpus: int = 8, *, host_tag: str = "0", fail_init: str = ""):
        self.gpus = [FakeGpu(f"GPU-{host_tag}-{i:02d}-4f1c-9a7e-{i:012d}") for i in range(gpus)]
        self.fail_init = fail_init
        self.fail_sample = ""
        self.calls = 0

    def busy(self, index: int, *pids: int, util: float = 97.0, used_mib: int = 70000) -> None:
        g = self.gpus[index]
        g.pids, g.util, g.used_mib = list(pids), util, used_mib

    def throttled(self, index: int, mask: int = 0x8, *, sm_mhz: int = 1110) -> None:
        """GPU `index` throttled (`mask`: nvmlClocksThrottleReason* bits; 0x8 hw_slowdown)."""
        g = self.gpus[index]
        g.throttle, g.sm_mhz = mask, sm_mhz

    def idle(self, index: int) -> None:
        g = self.gpus[index]
        g.pids, g.util, g.used_mib = [], 0.0, 0

    # --- the pynvml surface -----------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError(self.fail_init)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        self._maybe_fail()
        return SimpleNamespace(total=h.total_mib * 1024 * 1024, used=h.used_mib * 1024 * 1024,
                               free=(h.total_mib - h.used_mib) * 1024 * 1024)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        self._maybe_fail()
        self.calls += 1
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        self._maybe_fail()
        return [SimpleNamespace(pid=p, usedGpuMemory=h.used_mib * 1024 * 1024 // max(
            1, len(h.pids))) for p in h.pids]

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._maybe_fail()
        return {1: h.sm_mhz, 2: h.mem_mhz}.get(kind, h.sm_mhz)  # NVML_CLOCK_SM, _MEM

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return h.cap_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.temp_c

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return h.throttle

    def nvmlDeviceGetEccMode(self, h: FakeGpu) -> list[int]:
        return [h.ecc, h.ecc]  # (current, pending)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        return [h.mig, h.mig]

    def _maybe_fail(self) -> None:
        if self.fail_sample:
            raise NVMLError(self.fail_sample)
