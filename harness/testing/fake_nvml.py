"""A simulated NVML at the library boundary: the functions of `pynvml` (nvidia-ml-py) that
the Node Registry calls, over a scripted set of GPUs whose compute processes tests (and the
observation benchmark) add and remove. Values are shaped like a real H100/H200's."""

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

    def _maybe_fail(self) -> None:
        if self.fail_sample:
            raise NVMLError(self.fail_sample)
