"""Leased claims on resources (GPUs by UUID, ports, whole hosts): the writer of the `claims`
stream and of each lease's `claim:<id>` heartbeat stream.

- `claim(ws, resources, ...)`: a lease for a holder (this process by default). A resource
  that conflicts with an active claim (same GPU or port, or either is the whole host) is
  refused with the holder named (`ClaimConflict`), unless that claim is stale by the rule in
  `stale.py` and freeing it kills nothing: then the cleanup and the new claim are one save.
  A claim is appended under the `claims` stream's version: of two racing claims on one GPU,
  exactly one wins.
- `claim_for(ws, texts, pid=...)` (`forge nodes claim --pid`): a claim names a process of its
  claimant: the process that ran forge (the default) or one of its descendants, with its
  start time. Any other pid (`--pid 1`, another user's shell) or one whose start time cannot
  be read is refused, so no claim is kept alive by a process its claimant does not own.
- The holder check (`is_holder`): the caller is the holder when the holder process (pid and
  recorded start time, on this host) is this process or one of its ancestors (a shell's
  `forge nodes release`), or a descendant of the process that ran forge (a script that
  claimed for its engine). Checked on every heartbeat and release.
- `heartbeat(ws, claim_id)`: renew a lease (refused once it was released or cleaned up: the
  holder must stop; refused to anyone but the holder). `Lease` renews from a thread and
  releases on exit (the graph workers).
- `release(ws, claim_id, reason)`: the holder (or its runner) gives the lease back. Anyone
  else goes through the human gate (kind `cleanup`, bound to the claim, the holder and
  "release"): until a person approves, the claim stays and the error says which approval
  waits.
- `cleanup(ws, claim_id=None, dry_run=...)`: judge each active claim by the stale rule and
  free the eligible ones, each recorded with its signals. Freeing one whose holder's process
  group still has live processes kills them, and that goes through the human gate (kind
  `cleanup`, bound to the claim and the pids): until a person approves, the claim stays and
  the result says which approval waits. A holder pid now running with another start time
  was reused: the group under that id is someone else's (the kernel does not reuse a pid
  while its old group has members) and is never signalled; checked again right before
  the kill.
Time comes from `clock` (tests set their own; nothing sleeps to let a lease lapse).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import uuid4

from ...ledger import events as E
from ...ledger.clock import utcnow
from ...ledger.errors import ConflictError
from ...ledger.streams import CLAIMS_STREAM, claim_stream
from ...ledger.workspace import Workspace, open_workspace
from ...projections.nodes import (
    Claim,
    ClaimBook,
    last_heartbeat,
    read_claims,
    read_hosts,
)
from ..errors import HarnessError
from ..guard import approvals
from ..proc import alive, group_members, kill_group, start_time, stat_fields
from . import stale
from .identity import check_host, local_host

clock: Callable[[], datetime] = utcnow
_RETRIES = 20
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
_GPU = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_HEARTBEAT_S = 86400.0


class ClaimConflict(HarnessError):
    def __init__(self, message: str, holders: list[str]):
        self.holders = holders
        super().__init__(message)


def parse_resource(text: str, default_host: str | None = None) -> E.ResourceRef:
    """`[HOST/]gpu:UUID`, `[HOST/]port:N` or `host:HOST` (the whole host); one line if not."""
    host, sep, rest = text.rpartition("/")
    if not sep:
        host = ""
    kind, colon, ident = rest.partition(":")
    if not colon or kind not in ("gpu", "port", "host"):
        raise HarnessError(f"resource {text!r}: write gpu:UUID, port:N or host:NAME "
                           "(optionally HOST/ before gpu: or port:)")
    if kind == "host":
        if host:
            raise HarnessError(f"resource {text!r}: a whole host is host:NAME")
        return E.ResourceRef(host=check_host(ident, f"resource {text!r}: host"), kind="host")
    host = host or default_host or local_host()
    check_host(host, f"resource {text!r}: host")
    if kind == "port":
        if not ident.isdigit() or not 0 < int(ident) < 65536:
            raise HarnessError(f"resource {text!r}: port must be 1..65535")
        ident = str(int(ident))
    elif not _GPU.fullmatch(ident):
        raise HarnessError(f"resource {text!r}: a GPU is named by its UUID (letters, digits, "
                           "'.', '_', '-')")
    return E.ResourceRef(host=host, kind=kind, id=ident)


def this_process(**what: Any) -> E.ClaimHolder:
    import os
    pid = os.getpid()
    return E.ClaimHolder(host=local_host(), pid=pid, pid_start=start_time(pid), **what)


def _lineage(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of `pid` and its ancestors, nearest first (bounded)."""
    out: list[tuple[int, str]] = []
    while pid > 0 and len(out) < 1024:
        fields = stat_fields(pid)
        if not fields or len(fields) < 20:
            break
        out.append((pid, fields[19]))
        pid = int(fields[1])
    return out


def _caller() -> int:
    """The process forge acts for: the one that ran it (the shell or script)."""
    import os
    return os.getppid()


def is_holder(holder: E.ClaimHolder) -> bool:
    """Is this process the holder, or acting for it (module docstring)? False for a holder on
    another host, one whose start time was not recorded, or one that is gone."""
    import os
    if holder.host != local_host() or not holder.pid_start:
        return False
    me = (holder.pid, holder.pid_start)
    if me in _lineage(os.getpid()):
        return True
    caller = _caller()
    return caller > 1 and (caller, start_time(caller)) in _lineage(holder.pid)[1:] \
        and alive(holder.pid, holder.pid_start)


def _not_holder(c: Claim) -> str:
    import os
    return (f"claim {c.claim_id} is held by pid {c.holder.pid} on {c.holder.host}; this "
            f"process (pid {os.getpid()}, run by pid {_caller()}) is not its holder nor acting"
            " for it")


def survivors(holder: E.ClaimHolder) -> list[int]:
    """The holder's process group's live processes (what freeing its claim would kill), on
    this host; [] when the holder's pid now runs with another start time (reused: that group
    is not the holder's) or its start time was never recorded (nothing to tell them apart)."""
    if holder.host != local_host() or not holder.pid_start:
        return []
    now = start_time(holder.pid)
    if now and now != holder.pid_start:
        return []
    return group_members(holder.pid)


def holder_status(holder: E.ClaimHolder) -> tuple[bool | None, str]:
    """(gone, detail): is the holder process gone? None when it ran on another host."""
    detail = f"pid {holder.pid} on {holder.host}"
    if holder.host != local_host():
        return None, detail
    return (not alive(holder.pid, holder.pid_start)), detail


def _describe(c: Claim, now: datetime, beat: datetime) -> str:
    what = ([f"task {c.holder.task}"] if c.holder.task else []) + (
        [f"graph {c.holder.graph} node {c.holder.node}"] if c.holder.graph else [])
    what += [c.purpose] if c.purpose else []
    age = (now - beat).total_seconds()
    return (f"claim {c.claim_id} ({', '.join(what) or 'no purpose given'}; "
            f"pid {c.holder.pid} on {c.holder.host}, by {c.actor.name or c.actor.kind}, "
            f"heartbeat {age:.0f}s ago)")


def _check_heartbeat(heartbeat_s: float) -> float:
    if not math.isfinite(heartbeat_s) or not 0 < heartbeat_s <= MAX_HEARTBEAT_S:
        raise HarnessError(f"heartbeat {heartbeat_s:g}s: must be > 0 and at most "
                           f"{MAX_HEARTBEAT_S:g}s")
    return heartbeat_s


@dataclass
class Verdict:
    """A claim judged by the stale rule, and what cleanup did or would do."""

    claim: Claim
    signals: E.StaleSignals
    kill: list[int] = field(default_factory=list)
    action: str = "kept"  # kept | cleaned | would-clean | waiting-approval
    approval_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"claim_id": self.claim.claim_id, "action": self.action,
                "eligible": self.signals.eligible, "kill": self.kill,
                "approval_id": self.approval_id,
                "signals": self.signals.model_dump(mode="json"),
                "holder": self.claim.holder.model_dump(mode="json"),
                "resources": [str(r) for r in self.claim.resources]}


def _judge(ws: Workspace, c: Claim, now: datetime, k: int, n: int, hosts: Any = None
           ) -> Verdict:
    gone, detail = holder_status(c.holder)
    sig = stale.judge(c, now=now, last_heartbeat=last_heartbeat(ws.ledger, c),
                      holder_gone=gone, holder_detail=detail,
                      hosts=hosts if hosts is not None else read_hosts(ws.ledger), k=k, n=n)
    # What freeing it would kill: the holder's process group's survivors (its engine, its
    # children), on this host only.
    kill = survivors(c.holder) if sig.eligible else []
    return Verdict(c, sig, kill)


def claim(ws: Workspace, resources: Iterable[E.ResourceRef], *, heartbeat_s: float = 10.0,
          purpose: str = "", holder: E.ClaimHolder | None = None, actor: E.Actor = E.SYSTEM,
          claim_id: str | None = None, clean_stale: bool = True,
          k: int = stale.K_HEARTBEATS, n: int = stale.N_IDLE) -> Claim:
    """Take a lease on `resources` (module docstring); the claim, or ClaimConflict."""
    want = list(dict.fromkeys(resources))
    heartbeat_s = _check_heartbeat(heartbeat_s)
    cid = claim_id or "claim-" + uuid4().hex[:12]
    if not _ID.fullmatch(cid):
        raise HarnessError(f"claim id {cid[:80]!r}: letters, digits, '.', '_', ':', '-'")
    holder = holder or this_process()
    for _ in range(_RETRIES):
        book, now = read_claims(ws.ledger), clock()
        if cid in book.claims:
            c = book.claims[cid]
            if c.holder == holder and c.resources == tuple(want):
                return c  # a retried save of this very claim
            raise HarnessError(f"claim id {cid} is taken ({c.state})")
        held = book.holding(want)
        events: list[E.Event] = []
        blocking = []
        hosts = read_hosts(ws.ledger) if held else None
        for c, r in held:
            v = _judge(ws, c, now, k, n, hosts) if clean_stale else None
            if v is not None and v.signals.eligible and not v.kill:
                events.append(E.ClaimCleanedUp(claim_id=c.claim_id, signals=v.signals,
                                               actor=actor))
            else:
                stale_note = (f" — stale, but freeing it kills {v.kill}: run forge nodes "
                              f"cleanup {c.claim_id}" if v is not None and v.kill else "")
                blocking.append(f"{r} is held by "
                                f"{_describe(c, now, last_heartbeat(ws.ledger, c))}"
                                + stale_note)
        if blocking:
            raise ClaimConflict("refused: " + "; ".join(blocking), blocking)
        events.append(E.ResourceClaimed(claim_id=cid, resources=tuple(want), holder=holder,
                                        heartbeat_s=heartbeat_s, purpose=purpose[:500],
                                        actor=actor, task_id=holder.task,
                                        occurred_at=now))
        try:
            ws.ledger.append(CLAIMS_STREAM, events, expected_version=book.version,
                             command_id=f"claim:{cid}")
        except ConflictError:
            continue  # another claim landed meanwhile: judge again
        return read_claims(ws.ledger).claims[cid]
    raise HarnessError(f"claim {cid}: the claims stream kept changing; try again")


def claim_for(ws: Workspace, texts: list[str], *, heartbeat_s: float = 10.0,
              purpose: str = "", task: str | None = None, pid: int | None = None,
              actor: E.Actor = E.SYSTEM) -> dict[str, Any]:
    """`forge nodes claim`: parse the resources, claim them for `pid` (default: the parent
    of this process, the shell or script that runs the command); the claim as a dict."""
    import os
    if not texts:
        raise HarnessError("name at least one resource (gpu:UUID, port:N, host:NAME)")
    resources = [parse_resource(t) for t in texts]
    caller = _caller()
    pid = pid if pid is not None else caller
    if not alive(pid):
        raise HarnessError(f"--pid {pid}: no such process on this host")
    started = start_time(pid)
    if not started:
        raise HarnessError(f"--pid {pid}: its start time cannot be read (/proc/{pid}/stat); "
                           "a claim records it so that a reused pid is not the holder")
    if pid != os.getpid() and (caller, start_time(caller)) not in _lineage(pid):
        raise HarnessError(f"--pid {pid}: not the process that runs this command (pid "
                           f"{caller}) nor one of its descendants; a claim names a process "
                           "of its claimant")
    holder = E.ClaimHolder(host=local_host(), pid=pid, pid_start=started, task=task)
    c = claim(ws, resources, heartbeat_s=heartbeat_s, purpose=purpose, holder=holder,
              actor=actor)
    return {"claim_id": c.claim_id, "resources": [str(r) for r in c.resources],
            "holder": c.holder.model_dump(mode="json"), "heartbeat_s": c.heartbeat_s,
            "purpose": c.purpose, "claimed_at": c.claimed_at.isoformat()}


def _active(book: ClaimBook, claim_id: str) -> Claim:
    c = book.claims.get(claim_id)
    if c is None:
        raise HarnessError(f"no claim {claim_id!r} (forge nodes claims lists them)")
    if c.state != "active":
        raise HarnessError(f"claim {claim_id} was {c.state} at {c.ended_at:%Y-%m-%d %H:%M:%S}"
                           f" ({c.end_reason or 'no reason given'}): its holder must stop")
    return c


def heartbeat(ws: Workspace, claim_id: str, actor: E.Actor = E.SYSTEM) -> Claim:
    """Renew the lease; refused (HarnessError) once the claim is no longer active, and to
    anyone but its holder (`is_holder`)."""
    c = _active(read_claims(ws.ledger), claim_id)
    if not is_holder(c.holder):
        raise HarnessError(f"refused: {_not_holder(c)}; only the holder renews its lease")
    ws.ledger.append(claim_stream(claim_id), [E.ClaimHeartbeat(claim_id=claim_id, actor=actor,
                                                               occurred_at=clock())])
    return c


def release(ws: Workspace, claim_id: str, reason: str = "", actor: E.Actor = E.SYSTEM,
            missing_ok: bool = False) -> Claim | None:
    """Give a lease back. An already ended claim is an error unless `missing_ok`. Anyone but
    the holder needs a person's approval (kind `cleanup`, used once): until then
    ApprovalWaiting (a HarnessError) says which approval waits."""
    gated = False
    for _ in range(_RETRIES):
        book = read_claims(ws.ledger)
        c = book.claims.get(claim_id)
        if missing_ok and (c is None or c.state != "active"):
            return c
        c = _active(book, claim_id)
        if not gated and not is_holder(c.holder):
            args = {"claim": c.claim_id, "release": True, "holder": c.holder.pid,
                    "holder_host": c.holder.host, "holder_start": c.holder.pid_start}
            try:
                approvals.require(ws, "cleanup", c.claim_id, args, actor=actor,
                                  summary=f"release {c.claim_id} held by pid {c.holder.pid} "
                                  f"on {c.holder.host} (not the caller's)")
            except approvals.ApprovalWaiting as w:
                raise approvals.ApprovalWaiting(
                    w.approval_id, f"refused: {_not_holder(c)}; releasing it needs a person: "
                    + approvals.waiting_line(w.approval_id)) from None
            gated = True
        try:
            ws.ledger.append(CLAIMS_STREAM, [E.ClaimReleased(claim_id=claim_id,
                                                             reason=reason[:500],
                                                             actor=actor,
                                                             occurred_at=clock())],
                             expected_version=book.version)
        except ConflictError:
            continue
        return read_claims(ws.ledger).claims[claim_id]
    raise HarnessError(f"release {claim_id}: the claims stream kept changing; try again")


def _wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL is asynchronous: wait (bounded) until no live process is left in the group."""
    import time
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def listing(ws: Workspace, everything: bool = False) -> list[dict[str, Any]]:
    """Claims (active only unless `everything`) with their lease state."""
    book, now = read_claims(ws.ledger), clock()
    out = []
    for c in book.claims.values():
        if c.state != "active" and not everything:
            continue
        beat = last_heartbeat(ws.ledger, c)
        age = (now - beat).total_seconds()
        lease = ("expired" if age > stale.K_HEARTBEATS * c.heartbeat_s else "live") \
            if c.state == "active" else c.state
        out.append({"claim_id": c.claim_id, "state": c.state, "lease": lease,
                    "resources": [str(r) for r in c.resources],
                    "holder": c.holder.model_dump(mode="json"), "purpose": c.purpose,
                    "actor": c.actor.name or c.actor.kind,
                    "claimed_at": c.claimed_at.isoformat(), "heartbeat_age_s": round(age, 1),
                    "heartbeat_s": c.heartbeat_s,
                    "ended_at": c.ended_at.isoformat() if c.ended_at else None,
                    "end_reason": c.end_reason})
    return out


def cleanup(ws: Workspace, claim_id: str | None = None, *, dry_run: bool = False,
            actor: E.Actor = E.SYSTEM, k: int = stale.K_HEARTBEATS, n: int = stale.N_IDLE
            ) -> list[Verdict]:
    """Judge active claims (or one) by the stale rule; free the eligible ones unless
    `dry_run` (module docstring). Returns a verdict per claim judged."""
    book, now = read_claims(ws.ledger), clock()
    todo = [_active(book, claim_id)] if claim_id else book.active()
    hosts = read_hosts(ws.ledger)
    out = []
    for c in todo:
        v = _judge(ws, c, now, k, n, hosts)
        out.append(v)
        if not v.signals.eligible:
            continue
        if dry_run:
            v.action = "would-clean"
            continue
        if v.kill:
            # Killing needs a person: the approval is bound to this claim and these pids,
            # spent here (once), then the group is killed and the cleanup recorded.
            args = {"claim": c.claim_id, "pids": v.kill, "holder": c.holder.pid}
            try:
                v.approval_id = approvals.require(
                    ws, "cleanup", c.claim_id, args, actor=actor,
                    summary=f"kill {len(v.kill)} process(es) {v.kill} left by pid "
                    f"{c.holder.pid} on {c.holder.host} to free {c.claim_id}")
            except approvals.ApprovalWaiting as w:
                v.action, v.approval_id = "waiting-approval", w.approval_id
                continue
            if survivors(c.holder) != v.kill:  # the group changed since it was judged
                v.action = "kept"
                continue
            kill_group(c.holder.pid)
            _wait_group_gone(c.holder.pid)
        ev = E.ClaimCleanedUp(claim_id=c.claim_id, signals=v.signals, killed=tuple(v.kill),
                              approval_id=v.approval_id, actor=actor, occurred_at=now)
        ws.ledger.append(CLAIMS_STREAM, [ev], command_id=f"cleanup:{c.claim_id}")
        v.action = "cleaned"
    return out


class Lease:
    """Hold a claim while a block of work runs: heartbeats from a thread (with its own
    workspace connection), released on exit. A heartbeat refused because the claim was
    cleaned up stops renewing and is reported by `lost`."""

    def __init__(self, home: str, claim_id: str, heartbeat_s: float):
        self.home, self.claim_id, self.heartbeat_s = home, claim_id, heartbeat_s
        self._stop = threading.Event()
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"lease-{claim_id}",
                                        daemon=True)

    def _run(self) -> None:
        ws: Workspace | None = None  # opened at the first heartbeat: short work needs none
        try:
            while not self._stop.wait(self.heartbeat_s):
                ws = ws or open_workspace(self.home)
                try:
                    heartbeat(ws, self.claim_id)
                except HarnessError as e:
                    self.lost = str(e)
                    return
        finally:
            if ws is not None:
                ws.close()

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
