"""The accelerator check: the point's accelerator (vendor, model, count, memory) against this
host's, before anything deploys. A mismatch is a one-line refusal naming both values.

- `check_accelerator(acc, inventory, source)` is pure: it returns the indices of the host's
  GPUs that match the point (the devices the launch plan may assign) or raises HarnessError.
  Model names match when the point's model is a word of the host's name, case-insensitive
  ("H200" matches "NVIDIA H200", not "NVIDIA H200 NVL"'s neighbour "H20"). Memory matches
  within 10% (points give the nominal size, NVML reports MiB: an H200 is 141 GB nominal,
  143771 MiB). A `cpu` point needs no GPU and gets none.
- `host_accelerators(ws, nvml=None)` reads what this host has: NVML now (the Node
  Registry's `Probe`; `nvml` may be the simulated one), else the Node Registry's last
  observation of this host (`forge nodes observe`), else nothing — with a note why.
"""

from __future__ import annotations

import re
from typing import Any

from ...ledger import events as E
from ...ledger.specs import Accelerator
from ...ledger.workspace import Workspace
from ...projections.nodes import read_hosts
from ..errors import HarnessError
from ..nodes.identity import local_host

MEMORY_TOLERANCE = 0.10
MIB_PER_GB = 1024  # nominal GPU "GB" are GiB: an H200's 141 GB is 143771 MiB to NVML


def describe_point(acc: Accelerator) -> str:
    mem = f" {acc.memory_gb:g} GB" if acc.memory_gb else ""
    return f"{acc.vendor} {acc.model} x{acc.count}{mem}"


def describe_host(gpus: tuple[E.GpuInfo, ...] | list[E.GpuInfo]) -> str:
    if not gpus:
        return "no GPU"
    kinds: dict[tuple[str, str, int], int] = {}
    for g in gpus:
        key = (g.vendor, g.model, g.memory_mib)
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{v} {m} x{n} {mib / MIB_PER_GB:.0f} GB" for (v, m, mib), n in
                     kinds.items())


def model_matches(want: str, have: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", have.lower()) if w]
    want_words = [w for w in re.split(r"[^a-z0-9]+", want.lower()) if w]
    if not want_words:
        return False
    n = len(want_words)
    return any(words[i:i + n] == want_words for i in range(len(words) - n + 1))


def check_accelerator(acc: Accelerator, inventory: E.HostInventory | None,
                      source: str = "this host") -> list[int]:
    """The indices of the host GPUs matching `acc` (the first `acc.count` of them), or a
    HarnessError naming the point's value and the host's."""
    if acc.vendor == "cpu":
        return []
    want = describe_point(acc)
    gpus = list(inventory.gpus) if inventory is not None else []
    if not gpus:
        why = (f" ({inventory.accelerator_note})" if inventory is not None
               and inventory.accelerator_note else "")
        raise HarnessError(f"accelerator check: the point needs {want}; {source} has no "
                           f"GPU{why}")
    have = describe_host(gpus)
    vendor = [g for g in gpus if g.vendor == acc.vendor]
    if not vendor:
        raise HarnessError(f"accelerator check: vendor {acc.vendor} (point: {want}) but "
                           f"{source} has {have}")
    model = [g for g in vendor if model_matches(acc.model, g.model)]
    if not model:
        raise HarnessError(f"accelerator check: model {acc.model} (point: {want}) but "
                           f"{source} has {have}")
    if acc.memory_gb:
        want_mib = acc.memory_gb * MIB_PER_GB
        fit = [g for g in model if abs(g.memory_mib - want_mib) <= MEMORY_TOLERANCE * want_mib]
        if not fit:
            raise HarnessError(f"accelerator check: memory {acc.memory_gb:g} GB per device "
                               f"(point: {want}) but {source} has {have}")
        model = fit
    if len(model) < acc.count:
        raise HarnessError(f"accelerator check: count {acc.count} (point: {want}) but "
                           f"{source} has {len(model)} matching ({have})")
    return sorted(g.index for g in model)[:acc.count]


def host_accelerators(ws: Workspace | None, nvml: Any = None
                      ) -> tuple[E.HostInventory | None, str]:
    """(this host's inventory, where it came from). NVML first; else the registry."""
    # In the function for start-up time: NVML's probe loads when devices are read.
    from ..nodes.observe import Probe

    host = local_host()
    probe = Probe(nvml=nvml)
    try:
        inv = probe.inventory()
    finally:
        probe.close()
    if inv.gpus or ws is None:
        return inv, f"host {host} (NVML)" if inv.gpus else f"host {host}"

    known = read_hosts(ws.ledger).hosts.get(host)
    if known is not None and known.inventory.gpus:
        return known.inventory, f"host {host} (Node Registry, {known.last_seen:%Y-%m-%d %H:%M})"
    return inv, f"host {host}"
