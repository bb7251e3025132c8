"""Reads of the `approvals` stream (the human gate): the one fold of its events, each
approval's state at a given time, and the digest that names an action.

- `action_digest(kind, target, arguments)`: the identity of one exact action, `sha256:<hex>`
  of the canonical JSON of the three (a push's target is `member:remote:ref` and its
  arguments the commit range `old..new`; an acceptance's target is `task:block` and its
  arguments the candidate and its verification). An approval is bound to it: it lets
  through that action and no other.
- `read_approvals(ledger)` folds the stream into an `ApprovalBook` (with the stream version
  it read, for writers that append under optimistic concurrency). The states are derived at
  a time `now` the caller passes, so expiry follows whatever clock the caller keeps:
  `used` (spent), `denied`, `expired` (past `expires_at`, unused), `granted`, `pending`.
- `usable(digest, now)`: the oldest granted, unexpired, unused approval of that action;
  `open_request(digest, now)`: its pending request; `next_id(digest)`: the id the next
  request of that action gets (deterministic, so racing writers collide instead of
  duplicating). Undecodable events are left out (`forge check` reports them).
- `bound_action(kind, target, arguments)`: the action as a person is asked to judge it, from
  what the approval is bound to (the push's range, the cleanup's pids), one printable line;
  the requester's `summary` is its own words, shown beside it, never instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..ledger import events as E
from ..ledger.clock import digest
from ..ledger.store import Ledger, Recorded
from ..ledger.streams import APPROVALS_STREAM
from ..ledger.text import printable
from .errors import ProjectionError
from .folds import read_stream

KINDS: tuple[str, ...] = ("push", "production-call", "cleanup", "accept")
State = Literal["pending", "granted", "denied", "expired", "used"]


def action_digest(kind: str, target: str, arguments: dict[str, Any]) -> str:
    """The digest of one exact action (module docstring)."""
    if kind not in KINDS:
        raise ProjectionError(f"approval kind {kind!r} is not one of {', '.join(KINDS)}")
    return digest({"kind": kind, "target": target, "arguments": arguments})


@dataclass
class Approval:
    approval_id: str
    kind: str
    target: str
    action_digest: str
    arguments: dict[str, Any]
    summary: str
    requested_by: E.Actor
    requested_at: datetime
    expires_at: datetime | None
    decision: Literal["granted", "denied"] | None = None
    decided_by: E.Actor | None = None
    decided_at: datetime | None = None
    reason: str | None = None
    used_by: E.Actor | None = None
    used_at: datetime | None = None
    refusals: list[str] = field(default_factory=list)  # attempts refused against it

    def state(self, now: datetime) -> State:
        if self.used_at is not None:
            return "used"
        if self.decision == "denied":
            return "denied"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "granted" if self.decision == "granted" else "pending"

    def as_dict(self, now: datetime) -> dict[str, Any]:
        def who(a: E.Actor | None) -> dict[str, Any] | None:
            return a.model_dump(mode="json") if a is not None else None

        def when(t: datetime | None) -> str | None:
            return t.isoformat() if t is not None else None

        return {"approval_id": self.approval_id, "kind": self.kind, "target": self.target,
                "action_digest": self.action_digest, "arguments": self.arguments,
                "action": bound_action(self.kind, self.target, self.arguments),
                "summary": self.summary, "state": self.state(now),
                "requested_by": who(self.requested_by),
                "requested_at": when(self.requested_at),
                "expires_at": when(self.expires_at), "decided_by": who(self.decided_by),
                "decided_at": when(self.decided_at), "reason": self.reason,
                "used_by": who(self.used_by), "used_at": when(self.used_at),
                "refusals": list(self.refusals)}


MAX_ACTION = 400  # characters of `bound_action`: a person reads it


def _shown(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(", ", ": "),
                      default=str)


def bound_action(kind: str, target: str, arguments: dict[str, Any]) -> str:
    """`KIND TARGET k=v …` from the bound arguments (module docstring), controls escaped and
    cut to MAX_ACTION characters with `…`."""
    text = " ".join([kind, target, *(f"{k}={_shown(v)}" for k, v in sorted(arguments.items()))])
    text = printable(text)
    return text if len(text) <= MAX_ACTION else text[:MAX_ACTION - 1] + "…"


@dataclass
class ApprovalBook:
    version: int = 0
    approvals: dict[str, Approval] = field(default_factory=dict)  # in request order
    refusals: list[E.ApprovalRefused] = field(default_factory=list)

    def get(self, approval_id: str) -> Approval | None:
        return self.approvals.get(approval_id)

    def find(self, approval_id: str) -> Approval:
        """The approval with this id, or a unique prefix of it (at least 8 characters)."""
        a = self.approvals.get(approval_id)
        if a is not None:
            return a
        hits = [x for k, x in self.approvals.items()
                if len(approval_id) >= 8 and k.startswith(approval_id)]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ProjectionError(f"approval {approval_id!r} is ambiguous: "
                                  f"{', '.join(sorted(x.approval_id for x in hits))}")
        raise ProjectionError(f"no approval {approval_id!r} (forge approvals --all lists them)")

    def of(self, action: str) -> list[Approval]:
        """Every approval of one action digest, oldest first."""
        return [a for a in self.approvals.values() if a.action_digest == action]

    def usable(self, action: str, now: datetime, taken: Iterable[str] = ()
               ) -> Approval | None:
        skip = set(taken)
        return next((a for a in self.of(action) if a.approval_id not in skip
                     and a.state(now) == "granted"), None)

    def open_request(self, action: str, now: datetime) -> Approval | None:
        return next((a for a in self.of(action) if a.state(now) == "pending"), None)

    def latest(self, action: str) -> Approval | None:
        mine = self.of(action)
        return mine[-1] if mine else None

    def pending(self, now: datetime) -> list[Approval]:
        return [a for a in self.approvals.values() if a.state(now) == "pending"]

    def next_id(self, action: str) -> str:
        n = len(self.of(action))
        return "appr-" + hashlib.sha256(f"{action}\0{n}".encode()).hexdigest()[:12]


def fold(records: Iterable[Recorded]) -> ApprovalBook:
    """The one fold of the approvals stream."""
    book = ApprovalBook()
    for rec in records:
        ev = rec.event
        book.version = rec.version
        if isinstance(ev, E.ApprovalRequested):
            book.approvals[ev.approval_id] = Approval(
                ev.approval_id, ev.kind, ev.target, ev.action_digest, dict(ev.arguments),
                ev.summary, ev.actor, ev.occurred_at, ev.expires_at)
            continue
        if isinstance(ev, E.ApprovalRefused):
            book.refusals.append(ev)
        a = book.approvals.get(getattr(ev, "approval_id", None) or "")
        if a is None:
            continue
        if isinstance(ev, E.ApprovalGranted | E.ApprovalDenied) and a.decision is None:
            a.decision = "granted" if isinstance(ev, E.ApprovalGranted) else "denied"
            a.decided_by, a.decided_at, a.reason = ev.actor, ev.occurred_at, ev.reason
        elif isinstance(ev, E.ApprovalUsed) and a.used_at is None:
            a.used_by, a.used_at = ev.actor, ev.occurred_at
        elif isinstance(ev, E.ApprovalRefused):
            a.refusals.append(ev.reason)
    return book


def read_approvals(ledger: Ledger) -> ApprovalBook:
    return read_stream(ledger, APPROVALS_STREAM, fold)
