"""The writer of the `nodes` stream: hosts registered, GPU compute-process changes, window
summaries (with their samples as an artifact the index loads).

What is kept where (docs/nodes.md): the ledger holds a host's inventory when it first
appears or changes, every change in a GPU's set of compute processes (at once: that is what
the stale-claim rule must never miss), and one summary per host per window (default 5 min);
the samples themselves (CPU, memory, and per GPU utilisation, memory and process count, one
row per sample) are a compressed artifact named by the summary, loaded into the index's
`host_samples` and `gpu_samples` tables on catch-up (so a rebuilt index has them too).
"""

from __future__ import annotations

from typing import Any

from ...ledger import events as E
from ...ledger.clock import digest
from ...ledger.samples import append_with_samples
from ...ledger.streams import NODES_STREAM
from ...ledger.workspace import Workspace
from ...projections.nodes import read_hosts
from .identity import check_host


def register_host(ws: Workspace, host: str, inventory: E.HostInventory,
                  actor: E.Actor = E.SYSTEM) -> bool:
    """Record `host` with `inventory` when it is new or its inventory changed (a Ray
    inventory never replaces the host's own); True if recorded. A retried call adds nothing
    (the command id names host, inventory and the stream version read)."""
    check_host(host)
    book = read_hosts(ws.ledger)
    known = book.hosts.get(host)
    if known is not None and (known.inventory == inventory or (
            inventory.source == "ray" and known.inventory.source != "ray")):
        # Ray's node table knows no GPU UUIDs and counts what it offers tasks: a host the
        # host itself reported (psutil/NVML) keeps that richer inventory.
        return False
    ws.ledger.append(NODES_STREAM, [E.HostRegistered(host=host, inventory=inventory,
                                                     actor=actor)],
                     command_id=f"host:{host}:{digest(inventory.model_dump(mode='json'))}:"
                                f"{book.version}")
    return True


def record_changes(ws: Workspace, changes: list[E.GpuProcessesChanged]) -> None:
    if changes:
        ws.ledger.append(NODES_STREAM, changes)


def record_summary(ws: Workspace, summary: E.HostSummarized, columns: dict[str, Any]
                   ) -> E.HostSummarized:
    """Store the window's samples as an artifact and append its summary naming it."""
    return append_with_samples(ws, NODES_STREAM, summary, columns)
