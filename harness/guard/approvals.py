"""The human gate: actions that need a person wait for a recorded approval of exactly them.

An action is (kind, target, arguments); kinds: `push` (to a protected ref; target
`member:remote:ref`, arguments `{"range": "old..new"}`), `production-call` (a mutating call
to a production endpoint), `cleanup` (one that would kill processes), `accept` (a task's
deliverable under `contract.human: required`; target `task:block`). An approval is bound to
the action's digest (`action_digest`): it lets through that action and no other, at most
once, and not after its `expires_at`. Everything is an event on the `approvals` stream
(ledger/events.py `Approval*`), folded by projections/approvals.py.

- `request(ws, kind, target, arguments, summary, actor, ttl_s=None)`: ask; the approval id.
  Idempotent: while a request of the same action is pending (or granted and unused),
  asking again returns it.
- `decide(ws, approval_id, grant, reason, actor)`: a person's yes or no. Refused, with one
  line, for an actor that is not a human (an agent can ask, never grant: the refusal is
  recorded), an unknown id, an expired one, one already decided or used.
- `pending(ws)`: the requests waiting for a person.
- `require(ws, kind, target, arguments, *, actor, wait, timeout_s, summary)`: THE entry for
  an action that needs a person. A granted, unexpired, unused approval of exactly this action
  is used (`ApprovalUsed`, appended under the stream's version read: two racers cannot both
  use it) and its id returned; the caller then acts. Otherwise a request is made (or the
  pending one reused) and either `ApprovalWaiting` is raised at once (`wait=False`: "waiting
  for approval ID: forge approve ID --reason …") or the ledger is polled until the request
  is granted (then used), denied (`ApprovalDeniedError`), expired, or `timeout_s` passes
  (`ApprovalWaiting`). A grant of this action that expired unused, or one already used, is
  recorded as refused (`ApprovalRefused`) when the action is asked for again; so is an
  `approval_id` the caller names that was granted for another action.
- `check(ws, kind, target, arguments)`: what the gate says now, without writing: the usable
  grant with the `Append` that spends it (for a caller that saves the use with its own facts
  in one transaction, as the loop's acceptance does), the pending request, or the last
  decision.
- `grant(ws, approval_id, reason, by, key_file=None)` / `deny(...)`: `forge approve` /
  `forge deny`. A grant is confirmed on a human channel first (`human_channel.py`: the
  approver key the sandbox cannot read, or the terminal): nothing is granted otherwise, and
  the recorded actor is the OS user with the channel; `by` is only what they said.
- `approve_push(...)`: `forge repos approve`: the push's request and a person's grant,
  confirmed the same way.

Expiry follows the module's `clock` (UTC now by default): tests set their own instead of
sleeping. The push guard (repos/push_guard.py, below harness) reads the same fold and writes the
same events for a refused push (its request) and an allowed one (its use).
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from ...ledger import events as E
from ...ledger.clock import utcnow
from ...ledger.errors import ConflictError
from ...ledger.numbers import check_finite
from ...ledger.store import Append
from ...ledger.streams import APPROVALS_STREAM
from ...ledger.workspace import Workspace
from ...projections import approvals as P
from ...projections.approvals import Approval, ApprovalBook, read_approvals
from ...projections.errors import ProjectionError
from ..errors import HarnessError

# Where "now" comes from for expiry; tests replace it (never sleep to expire an approval).
clock: Callable[[], datetime] = utcnow

_RETRIES = 20  # optimistic-concurrency retries of one write on the approvals stream
MAX_TTL_S = 366 * 86400.0


class ApprovalWaiting(HarnessError):
    """The action waits for a person: the message says how to decide it."""

    def __init__(self, approval_id: str, message: str):
        self.approval_id = approval_id
        super().__init__(message)


class ApprovalDeniedError(HarnessError):
    def __init__(self, approval_id: str, message: str):
        self.approval_id = approval_id
        super().__init__(message)


def waiting_line(approval_id: str) -> str:
    return (f"waiting for approval {approval_id}: forge approve {approval_id} --reason TEXT "
            f"(or forge deny {approval_id} --reason TEXT)")


def action_digest(kind: str, target: str, arguments: dict[str, Any]) -> str:
    """The digest an approval is bound to (projections/approvals.py)."""
    try:
        check_finite(arguments, "arguments")
        return P.action_digest(kind, target, arguments)
    except ProjectionError as e:
        raise HarnessError(str(e)) from None
    except (TypeError, ValueError) as e:  # not JSON: no digest, no approval
        raise HarnessError(f"approval arguments of {kind} {target!r} are not JSON: "
                           f"{' '.join(str(e).split())[:200]}") from None


def person(name: str | None = None) -> E.Actor:
    """The human deciding: `name`, else the OS user."""
    if name is not None and name.strip():
        return E.Actor.human(name.strip())
    try:
        return E.Actor.human(getpass.getuser())
    except (KeyError, OSError):
        return E.Actor.human(os.environ.get("USER", "human"))


def _who(a: E.Actor | None) -> str:
    if a is None:
        return "?"
    return f"{a.kind} {a.name}" + (f" ({a.model})" if a.model else "")


def _when(t: datetime | None) -> str:
    return t.isoformat(timespec="seconds") if t is not None else "-"


def _state_line(a: Approval, now: datetime) -> str:
    """Why `a` cannot be decided or used now (one line)."""
    st = a.state(now)
    if st == "expired":
        return f"approval {a.approval_id} expired at {_when(a.expires_at)}"
    if st == "used":
        return f"approval {a.approval_id} was already used at {_when(a.used_at)} by " \
            f"{_who(a.used_by)}"
    if st in ("granted", "denied"):
        return f"approval {a.approval_id} was already {st} by {_who(a.decided_by)} at " \
            f"{_when(a.decided_at)}"
    return f"approval {a.approval_id} is pending"


def _request_event(book: ApprovalBook, kind: str, target: str, arguments: dict[str, Any],
                   digest: str, summary: str, actor: E.Actor, now: datetime,
                   ttl_s: float | None) -> E.ApprovalRequested:
    if ttl_s is not None and not (0 < ttl_s <= MAX_TTL_S):
        raise HarnessError(f"approval ttl_s {ttl_s!r} must be in (0, {MAX_TTL_S:.0f}] "
                           "seconds")
    return E.ApprovalRequested(
        approval_id=book.next_id(digest), kind=kind, target=target, action_digest=digest,
        arguments=arguments, summary=summary[:2000] or f"{kind} {target}",
        expires_at=now + timedelta(seconds=ttl_s) if ttl_s is not None else None,
        actor=actor)


def _stale_refusal(book: ApprovalBook, digest: str, now: datetime, actor: E.Actor
                   ) -> E.ApprovalRefused | None:
    """The action is asked for again while its last approval was granted and then expired
    unused, or used already: that reuse is refused, and recorded."""
    last = book.latest(digest)
    if last is None or last.decision != "granted" or last.state(now) not in ("expired",
                                                                            "used"):
        return None
    return E.ApprovalRefused(approval_id=last.approval_id, action_digest=digest,
                             reason=f"{_state_line(last, now)}: it does not let this action "
                                    "through again", actor=actor)


def _append(ws: Workspace, events: list[E.Event], version: int) -> None:
    ws.ledger.append(APPROVALS_STREAM, events, expected_version=version)


def _ask(ws: Workspace, kind: str, target: str, arguments: dict[str, Any], digest: str,
         summary: str, actor: E.Actor, ttl_s: float | None) -> Approval:
    """The pending request of this action, made now if there is none."""
    for _ in range(_RETRIES):
        book, now = read_approvals(ws.ledger), clock()
        # Already granted (unused) or pending: asking again changes nothing.
        open_ = book.usable(digest, now) or book.open_request(digest, now)
        if open_ is not None:
            return open_
        ev = _request_event(book, kind, target, arguments, digest, summary, actor, now, ttl_s)
        stale = _stale_refusal(book, digest, now, actor)
        try:
            # Racing askers compute the same next id; the version read lets one through,
            # the other re-reads and finds its request pending.
            _append(ws, ([stale] if stale else []) + [ev], book.version)
        except ConflictError:
            continue
        return read_approvals(ws.ledger).find(ev.approval_id)
    raise HarnessError("approvals: the approvals stream kept moving; try again")


def request(ws: Workspace, kind: str, target: str, arguments: dict[str, Any], summary: str,
            actor: E.Actor, ttl_s: float | None = None) -> str:
    """Ask for a person's approval of one action; its approval id (module docstring)."""
    digest = action_digest(kind, target, arguments)
    return _ask(ws, kind, target, arguments, digest, summary, actor, ttl_s).approval_id


def _refuse(ws: Workspace, approval_id: str | None, digest: str | None, reason: str,
            actor: E.Actor) -> None:
    ws.ledger.append(APPROVALS_STREAM, [E.ApprovalRefused(
        approval_id=approval_id, action_digest=digest, reason=reason, actor=actor)])


def decide(ws: Workspace, approval_id: str, grant: bool, reason: str, actor: E.Actor
           ) -> dict[str, Any]:
    """A person grants or denies a pending request; the approval as it now stands."""
    verb = "grant" if grant else "deny"
    if actor.kind != "human":
        try:
            known: Approval | None = read_approvals(ws.ledger).find(approval_id)
        except ProjectionError:
            known = None
        aid = known.approval_id if known else approval_id[:200]
        why = (f"{_who(actor)} may not {verb} approval {aid}: only a person decides "
               "an approval (an agent can ask for one, never grant it)")
        _refuse(ws, aid, known.action_digest if known else None, why, actor)
        raise HarnessError(why)
    if not reason.strip():
        raise HarnessError(f"{verb} {approval_id}: --reason must say why")
    for _ in range(_RETRIES):
        book, now = read_approvals(ws.ledger), clock()
        try:
            a = book.find(approval_id)
        except ProjectionError as e:
            raise HarnessError(str(e)) from None
        if a.state(now) != "pending":
            raise HarnessError(f"cannot {verb} {_state_line(a, now)}")
        ev: E.Event = (E.ApprovalGranted(approval_id=a.approval_id,
                                         action_digest=a.action_digest,
                                         reason=reason.strip(), actor=actor)
                       if grant else E.ApprovalDenied(approval_id=a.approval_id,
                                                      reason=reason.strip(), actor=actor))
        try:
            _append(ws, [ev], book.version)  # a decision races nothing: first one wins
        except ConflictError:
            continue
        return read_approvals(ws.ledger).find(a.approval_id).as_dict(clock())
    raise HarnessError("approvals: the approvals stream kept moving; try again")


def pending(ws: Workspace) -> list[Approval]:
    """The requests waiting for a person, oldest first."""
    return read_approvals(ws.ledger).pending(clock())


def listing(ws: Workspace, everything: bool = False) -> list[dict[str, Any]]:
    """`forge approvals`: the pending requests, or (`everything`) every approval."""
    book, now = read_approvals(ws.ledger), clock()
    rows = book.approvals.values() if everything else book.pending(now)
    return [a.as_dict(now) for a in rows]


@dataclass(frozen=True)
class Gate:
    """What the gate says about one action now (`check`)."""

    action_digest: str
    state: Literal["granted", "pending", "denied", "expired", "used", "none"]
    approval: Approval | None = None
    use: Append | None = None  # granted: the save that spends it (with the caller's facts)


def _gate(book: ApprovalBook, digest: str, now: datetime, actor: E.Actor) -> Gate:
    hit = book.usable(digest, now)
    if hit is not None:
        used = E.ApprovalUsed(approval_id=hit.approval_id, action_digest=digest, actor=actor)
        # The version read: a racer that used it first makes this save conflict.
        return Gate(digest, "granted", hit, Append(APPROVALS_STREAM, [used], book.version))
    open_ = book.open_request(digest, now)
    if open_ is not None:
        return Gate(digest, "pending", open_)
    last = book.latest(digest)
    if last is None:
        return Gate(digest, "none")
    return Gate(digest, last.state(now), last)


def check(ws: Workspace, kind: str, target: str, arguments: dict[str, Any],
          actor: E.Actor = E.SYSTEM) -> Gate:
    """What the gate says about this action now; writes nothing."""
    return _gate(read_approvals(ws.ledger), action_digest(kind, target, arguments), clock(),
                 actor)


def require(ws: Workspace, kind: str, target: str, arguments: dict[str, Any], *,
            actor: E.Actor, wait: bool = False, timeout_s: float = 600.0, summary: str = "",
            ttl_s: float | None = None, approval_id: str | None = None,
            poll_s: float = 0.5) -> str:
    """The one entry for an action that needs a person (module docstring): the id of the
    approval used for it, or ApprovalWaiting / ApprovalDeniedError / HarnessError."""
    digest = action_digest(kind, target, arguments)
    if approval_id is not None:
        book = read_approvals(ws.ledger)
        named = book.get(approval_id)
        if named is None or named.action_digest != digest:
            why = (f"approval {approval_id[:200]} " + (
                "does not exist" if named is None else
                f"was asked for {named.kind} {named.target}, not this action") +
                f": it does not let {kind} {target} through")
            _refuse(ws, approval_id[:200], digest, why, actor)
            raise HarnessError(why)
    deadline = time.monotonic() + max(0.0, timeout_s)
    asked: str | None = None
    while True:
        book, now = read_approvals(ws.ledger), clock()
        g = _gate(book, digest, now, actor)
        if g.state == "granted":
            assert g.use is not None and g.approval is not None
            try:
                ws.ledger.save(g.use)
            except ConflictError:
                continue  # another writer moved the stream: read again (it may be spent)
            return g.approval.approval_id
        if asked is not None:
            mine = book.find(asked)
            st = mine.state(now)
            if st == "denied":
                raise ApprovalDeniedError(asked, f"approval {asked} of {kind} {target} was "
                                          f"denied by {_who(mine.decided_by)}: {mine.reason}")
            if st in ("expired", "used"):
                raise HarnessError(f"{_state_line(mine, now)} before this {kind} of {target} "
                                   "could use it")
        else:
            asked = _ask(ws, kind, target, arguments, digest, summary, actor,
                         ttl_s).approval_id
            continue  # read again: it may have been granted meanwhile
        if not wait:
            raise ApprovalWaiting(asked, waiting_line(asked))
        if time.monotonic() >= deadline:
            raise ApprovalWaiting(asked, f"gave up after {timeout_s:g}s: " + waiting_line(asked))
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def grant(ws: Workspace, approval_id: str, reason: str, by: str | None = None, *,
          key_file: str | None = None) -> dict[str, Any]:
    """`forge approve`: a person grants a pending request, confirmed on a human channel
    (`human_channel.confirm`: the approver key, or the terminal) before anything is written;
    the approval as it now stands."""
    # In the function for start-up time: the human channel loads when a person decides.
    from . import human_channel

    if not reason.strip():
        raise HarnessError(f"grant {approval_id}: --reason must say why")
    try:
        a = read_approvals(ws.ledger).find(approval_id)
    except ProjectionError as e:
        raise HarnessError(str(e)) from None
    if a.state(clock()) != "pending":  # said before a person is asked to confirm
        raise HarnessError(f"cannot grant {_state_line(a, clock())}")
    channel = human_channel.confirm(ws, a.as_dict(clock()), key_file)
    return decide(ws, a.approval_id, True, reason, human_channel.actor(by, channel))


def deny(ws: Workspace, approval_id: str, reason: str, by: str | None = None
         ) -> dict[str, Any]:
    """`forge deny`: a denial needs no proof (whoever denies only stops an action); recorded
    with the OS user, `by` as what they said."""
    # In the function for start-up time: the human channel loads when a person decides.
    from . import human_channel

    return decide(ws, approval_id, False, reason, human_channel.actor(by, "cli"))


def approve_push(ws: Workspace, member: str, remote: str, ref: str, old: str, new: str,
                 reason: str, by: str, *, key_file: str | None = None
                 ) -> tuple[dict[str, Any], bool]:
    """`forge repos approve`: grant one push of `member` to `ref` on `remote`, `old`..`new`
    (revs or shas); (the approval, created). A grant of the same push that is still unused
    is returned as it is (created False); a pending request of it (a refused push) is
    granted; else the request and the grant are recorded now."""
    # In the function for start-up time: the push guard (~25 ms) loads for a push only.
    from ...repos.push_guard import push_action, resolve_push

    if not reason.strip():
        raise HarnessError("approve: --reason must say why the push may go ahead")
    if not by.strip():
        raise HarnessError("approve: --by must name the person approving")
    r, o, n = resolve_push(ws, member, remote, ref, old, new)
    kind, target, args = push_action(member, remote, r, o, n)
    digest = action_digest(kind, target, args)
    # In the function for start-up time: the human channel loads when a person decides.
    from . import human_channel

    book, now = read_approvals(ws.ledger), clock()
    hit = book.usable(digest, now)
    if hit is not None:
        return _push_view(hit, now, member, remote, r, o, n), False
    asker = human_channel.actor(by, "cli")
    asked = _ask(ws, kind, target, args, digest, f"push {member} to {remote} {r} "
                 f"({o[:12]}..{n[:12]})", asker, None)
    channel = human_channel.confirm(ws, asked.as_dict(clock()), key_file)
    aid = asked.approval_id
    decide(ws, aid, True, reason, human_channel.actor(by, channel))
    a = read_approvals(ws.ledger).find(aid)
    return _push_view(a, clock(), member, remote, r, o, n), True


def _push_view(a: Approval, now: datetime, member: str, remote: str, ref: str, old: str,
               new: str) -> dict[str, Any]:
    return {**a.as_dict(now), "member": member, "remote": remote, "ref": ref, "old": old,
            "new": new,
            "actor": (a.decided_by or a.requested_by).model_dump(mode="json")}
