"""Reads of the Node Registry: hosts from the `nodes` stream, claims from the `claims` stream
(and each lease's heartbeats from its `claim:<id>` stream).

- `read_hosts(ledger)` folds `nodes` into a `HostBook`: each host's inventory, its latest
  summary, and each GPU's latest observed state (compute pids, idle streak, when observed),
  the newer of a summary's window end and a process change winning.
- `read_claims(ledger)` folds `claims` into a `ClaimBook` (with the stream version read, for
  the writer's optimistic concurrency): each claim's resources, holder and state (`active`,
  `released`, `cleaned`). `last_heartbeat(ledger, claim)` is the lease's latest renewal (its
  claim time when never renewed).
- `conflicts(a, b)`: two resources conflict on the same host when either is the whole host,
  or both are the same GPU or port.
Undecodable events are left out (`forge check` reports them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..ledger import events as E
from ..ledger.store import Ledger, Recorded
from ..ledger.streams import CLAIMS_STREAM, NODES_STREAM, claim_stream
from .folds import read_stream


@dataclass
class GpuState:
    uuid: str
    pids: tuple[int, ...] = ()
    idle_streak: int | None = None  # None: never observed
    observed_at: datetime | None = None
    util_max: float | None = None
    mem_used_max_mib: int | None = None


@dataclass
class Host:
    host: str
    inventory: E.HostInventory
    registered_at: datetime
    window_s: float | None = None  # length of the latest summary's window
    interval_s: float | None = None
    last_summary: E.HostSummarized | None = None
    gpus: dict[str, GpuState] = field(default_factory=dict)

    @property
    def last_seen(self) -> datetime:
        return self.last_summary.end if self.last_summary else self.registered_at


@dataclass
class HostBook:
    hosts: dict[str, Host] = field(default_factory=dict)
    version: int = 0

    def gpu_owner(self, uuid: str) -> str | None:
        for h in self.hosts.values():
            if any(g.uuid == uuid for g in h.inventory.gpus):
                return h.host
        return None


def fold_hosts(records: Iterable[Recorded]) -> HostBook:
    """The one fold of the `nodes` stream."""
    book = HostBook()
    for rec in records:
        ev = rec.event
        book.version = rec.version
        if isinstance(ev, E.HostRegistered):
            h = book.hosts.get(ev.host)
            if h is None:
                h = book.hosts[ev.host] = Host(ev.host, ev.inventory, ev.occurred_at)
            h.inventory = ev.inventory
            for info in ev.inventory.gpus:
                h.gpus.setdefault(info.uuid, GpuState(info.uuid))
            continue
        h = book.hosts.get(getattr(ev, "host", ""))
        if h is None:
            continue  # an observation of a host never registered: nothing to attach it to
        if isinstance(ev, E.HostSummarized):
            h.last_summary = ev
            h.window_s = (ev.end - ev.start).total_seconds()
            h.interval_s = ev.interval_s
            for w in ev.gpus:
                g = h.gpus.setdefault(w.uuid, GpuState(w.uuid))
                if g.observed_at is None or ev.end >= g.observed_at:
                    g.pids, g.idle_streak, g.observed_at = w.last_pids, w.idle_streak, ev.end
                    g.util_max, g.mem_used_max_mib = w.util_max, w.mem_used_max_mib
        elif isinstance(ev, E.GpuProcessesChanged):
            g = h.gpus.setdefault(ev.gpu_uuid, GpuState(ev.gpu_uuid))
            if g.observed_at is None or ev.at >= g.observed_at:
                g.pids, g.observed_at = ev.pids, ev.at
                g.idle_streak = 0 if ev.pids else 1
    return book


def read_hosts(ledger: Ledger) -> HostBook:
    return read_stream(ledger, NODES_STREAM, fold_hosts)


ClaimState = Literal["active", "released", "cleaned"]


@dataclass
class Claim:
    claim_id: str
    resources: tuple[E.ResourceRef, ...]
    holder: E.ClaimHolder
    heartbeat_s: float
    purpose: str
    claimed_at: datetime
    actor: E.Actor
    state: ClaimState = "active"
    ended_at: datetime | None = None
    end_reason: str = ""
    signals: E.StaleSignals | None = None
    killed: tuple[int, ...] = ()
    approval_id: str | None = None

    def gpus(self) -> list[str]:
        return [r.id for r in self.resources if r.kind == "gpu"]


@dataclass
class ClaimBook:
    claims: dict[str, Claim] = field(default_factory=dict)
    version: int = 0

    def active(self) -> list[Claim]:
        return [c for c in self.claims.values() if c.state == "active"]

    def holding(self, resources: Iterable[E.ResourceRef]) -> list[tuple[Claim, E.ResourceRef]]:
        """Active claims holding a resource that conflicts with one of `resources`."""
        want = list(resources)
        out = []
        for c in self.active():
            for r in c.resources:
                if any(conflicts(r, w) for w in want):
                    out.append((c, r))
                    break
        return out


def conflicts(a: E.ResourceRef, b: E.ResourceRef) -> bool:
    if a.host != b.host:
        return False
    if a.kind == "host" or b.kind == "host":
        return True
    return a.kind == b.kind and a.id == b.id


def fold_claims(records: Iterable[Recorded]) -> ClaimBook:
    """The one fold of the `claims` stream."""
    book = ClaimBook()
    for rec in records:
        ev = rec.event
        book.version = rec.version
        if isinstance(ev, E.ResourceClaimed):
            book.claims[ev.claim_id] = Claim(ev.claim_id, ev.resources, ev.holder,
                                             ev.heartbeat_s, ev.purpose, ev.occurred_at,
                                             ev.actor)
            continue
        c = book.claims.get(getattr(ev, "claim_id", ""))
        if c is None or c.state != "active":
            continue
        if isinstance(ev, E.ClaimReleased):
            c.state, c.ended_at, c.end_reason = "released", ev.occurred_at, ev.reason
        elif isinstance(ev, E.ClaimCleanedUp):
            c.state, c.ended_at, c.signals = "cleaned", ev.occurred_at, ev.signals
            c.killed, c.approval_id = ev.killed, ev.approval_id
            c.end_reason = "stale: cleaned up"
    return book


def read_claims(ledger: Ledger) -> ClaimBook:
    return read_stream(ledger, CLAIMS_STREAM, fold_claims)


def last_heartbeat(ledger: Ledger, claim: Claim) -> datetime:
    """When the lease was last renewed: its newest heartbeat, else its claim time."""
    rec = ledger.last(claim_stream(claim.claim_id), on_error=lambda u: None)
    return rec.event.occurred_at if rec is not None else claim.claimed_at


def heartbeats(ledger: Ledger, claim_id: str) -> int:
    return ledger.version(claim_stream(claim_id))


def host_listing(ledger: Ledger) -> list[dict[str, Any]]:
    """Each registered host: inventory, last seen, and each GPU's latest observed state."""
    book = read_hosts(ledger)
    out = []
    def when(g: GpuState | None) -> str | None:
        return g.observed_at.isoformat() if g and g.observed_at else None

    for h in sorted(book.hosts.values(), key=lambda h: h.host):
        s = h.last_summary
        out.append({
            "host": h.host, "cpus": h.inventory.cpus, "memory_mib": h.inventory.memory_mib,
            "source": h.inventory.source, "accelerator_note": h.inventory.accelerator_note,
            "registered_at": h.registered_at.isoformat(), "last_seen": h.last_seen.isoformat(),
            "nvml": s.nvml if s else None,
            "cpu_pct_mean": s.cpu_pct_mean if s else None,
            "gpus": [{"index": g.index, "uuid": g.uuid, "vendor": g.vendor, "model": g.model,
                      "memory_mib": g.memory_mib,
                      "pids": list(h.gpus[g.uuid].pids) if g.uuid in h.gpus else [],
                      "idle_streak": h.gpus[g.uuid].idle_streak if g.uuid in h.gpus else None,
                      "observed_at": when(h.gpus.get(g.uuid))}
                     for g in h.inventory.gpus]})
    return out
