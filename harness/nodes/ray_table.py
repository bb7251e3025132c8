"""What Ray's node table says of a host, as the Node Registry holds it.

Contract: `ray_inventory(row)` reads one row of `ray.nodes()` (no Ray import: the row is a
plain dict) and returns the host's name and its inventory with `source="ray"`. Ray knows a
node's CPUs, the memory it offers tasks, and its GPU count and accelerator type, not the GPUs'
UUIDs; the inventory says so. Used by the Ray graph backend and by `forge engine up --ray`.
"""

from __future__ import annotations

from typing import Any

from ...ledger import events as E


def ray_inventory(node: dict[str, Any]) -> tuple[str, E.HostInventory]:
    """A host name and inventory from one row of `ray.nodes()` (what Ray knows: CPUs, the
    memory it offers tasks, GPU count and type; no GPU UUIDs)."""
    res = node.get("Resources") or {}
    kinds = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
    model = kinds[0] if kinds else ""
    vendor = "amd" if model.upper().startswith("AMD") else "nvidia"
    gpus = tuple(E.GpuInfo(index=i, uuid="", vendor=vendor, model=model)
                 for i in range(int(res.get("GPU", 0))))
    host = str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "")
    return host, E.HostInventory(
        cpus=int(res.get("CPU", 0)), memory_mib=int(res.get("memory", 0)) // 2**20, gpus=gpus,
        accelerator_note="from Ray's node table: no GPU UUIDs" if gpus else "", source="ray")
