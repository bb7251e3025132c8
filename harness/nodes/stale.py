"""The stale-claim rule (pure): a claim may be cleaned up only when several signals agree.

1. The holder process is gone: its pid is not running with the start time recorded at claim
   time (a reused pid is not the holder). Only checkable on the holder's host; elsewhere the
   signal is unknown, and unknown never frees a claim.
2. Its lease lapsed: the newest heartbeat is older than `k` heartbeat intervals.
3. Every claimed GPU showed no compute process for `n` consecutive observations, the last of
   them fresh (within two observation windows of now) and taken after the last heartbeat.
   A GPU never observed, observed too long ago, or observed with a gap (the observer resets
   the streak on a missed sample) is not idle: missing observations never count as idle.

`judge(...)` returns the `StaleSignals` recorded with a cleanup (eligible or, when not, the
reasons), so a cleanup carries what justified it.
"""

from __future__ import annotations

from datetime import datetime

from ...ledger import events as E
from ...projections.nodes import Claim, HostBook

K_HEARTBEATS = 3  # lease: k heartbeat intervals
N_IDLE = 3  # consecutive observations of an idle GPU
DEFAULT_WINDOW_S = 60.0  # freshness when a host's observation window is not known


def _fresh_limit(book: HostBook, host: str) -> float:
    h = book.hosts.get(host)
    window = (h.window_s or h.interval_s) if h else None
    return 2 * (window or DEFAULT_WINDOW_S)


def judge(claim: Claim, *, now: datetime, last_heartbeat: datetime, holder_gone: bool | None,
          holder_detail: str, hosts: HostBook, k: int = K_HEARTBEATS, n: int = N_IDLE
          ) -> E.StaleSignals:
    reasons: list[str] = []
    if holder_gone is None:
        reasons.append(f"holder {holder_detail or 'process'} cannot be checked from here "
                       f"(it ran on {claim.holder.host})")
    elif not holder_gone:
        reasons.append(f"holder {holder_detail} is still running")
    age = max(0.0, (now - last_heartbeat).total_seconds())
    limit = k * claim.heartbeat_s
    if age <= limit:
        reasons.append(f"heartbeat {age:.0f}s old, within the lease ({k} x "
                       f"{claim.heartbeat_s:g}s = {limit:g}s)")
    gpus: list[E.GpuIdleSignal] = []
    for r in claim.resources:
        if r.kind != "gpu":
            continue
        h = hosts.hosts.get(r.host)
        g = h.gpus.get(r.id) if h else None
        if g is None or g.observed_at is None or g.idle_streak is None:
            gpus.append(E.GpuIdleSignal(uuid=r.id, idle_streak=None))
            reasons.append(f"GPU {r.id} on {r.host} was never observed")
            continue
        gpus.append(E.GpuIdleSignal(uuid=r.id, idle_streak=g.idle_streak,
                                    observed_at=g.observed_at, pids=g.pids))
        since = (now - g.observed_at).total_seconds()
        if g.pids:
            reasons.append(f"GPU {r.id} has compute processes {list(g.pids)}")
        elif g.idle_streak < n:
            reasons.append(f"GPU {r.id} idle for {g.idle_streak} observation(s), "
                           f"{n} needed")
        if since > _fresh_limit(hosts, r.host):
            reasons.append(f"GPU {r.id} last observed {since:.0f}s ago (stale observation)")
        elif g.observed_at < last_heartbeat:
            reasons.append(f"GPU {r.id} not observed since the last heartbeat")
    return E.StaleSignals(holder_gone=holder_gone, holder_detail=holder_detail,
                          heartbeat_age_s=round(age, 3), heartbeat_limit_s=limit,
                          gpus=tuple(gpus), gpu_idle_needed=n, eligible=not reasons,
                          reasons=tuple(reasons))
