"""Acceptance under `contract.human: required`: the loop's acceptance waits for a person.

`gate_acceptance(ws, lt, events)` sits between the loop computing a step that accepts a
deliverable (the decide step's `DeliverableAccepted`, or a best_in_scope stop delivering the
best contender) and saving it. Without `human: required`, or without an acceptance among
the events, it returns them as they are. Otherwise the acceptance is an action of the human
gate (kind `accept`, target `task:block`, arguments the candidate and the verification it
rests on; harness/guard/approvals.py):

- granted (unexpired, unused): the events, the acceptance citing the approval id in its
  evidence, and the `Append` that uses the approval, to be saved in the same transaction
  (the approvals stream's version read: it is used once, whoever races);
- denied: the acceptance becomes a `DirectionRejected` naming who denied it and why; a
  handoff that said `delivered` says `no-progress`; a `TaskExited(delivered)` is dropped
  (the loop goes on: a best_in_scope search offers its next contender);
- otherwise a request is made (or the pending one kept) and `AwaitingApproval` is raised:
  the loop records nothing more and returns `waiting`, with the line to decide it;
  `forge task resume` after `forge approve` (or `forge deny`) continues from the ledger.
"""

from __future__ import annotations

from typing import Any

from ...ledger import events as E
from ...ledger.store import Append
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import approvals
from ..task import LOOP_ACTOR, LoadedTask
from .decision import describe


class AwaitingApproval(HarnessError):
    def __init__(self, approval_id: str, message: str):
        self.approval_id = approval_id
        super().__init__(message)


def accept_action(acc: E.DeliverableAccepted) -> tuple[str, str, dict[str, Any]]:
    """An acceptance as the human gate names it: (kind, target, arguments)."""
    vid = str(acc.verification_event_id) if acc.verification_event_id else None
    return "accept", f"{acc.task_id}:{acc.block_id}", {"candidate": acc.candidate,
                                                       "verification": vid}


def _denied(events: list[E.Event], acc: E.DeliverableAccepted, a: Any) -> list[E.Event]:
    who = a.decided_by.name if a.decided_by is not None else "?"
    rej = E.DirectionRejected(
        candidate=acc.candidate, reason=f"acceptance denied by {who} ({a.approval_id}): "
        f"{a.reason}", evidence=[*acc.evidence, a.approval_id], task_id=acc.task_id,
        block_id=acc.block_id, actor=acc.actor, input_digests=acc.input_digests)
    out: list[E.Event] = []
    for e in events:
        if e is acc:
            out.append(rej)
        elif isinstance(e, E.LoopBlockHandedOff) and e.outcome == "delivered":
            out.append(e.model_copy(update={"outcome": "no-progress",
                                            "findings": [*e.findings, rej.reason]}))
        elif not (isinstance(e, E.TaskExited) and e.state == "delivered"):
            out.append(e)
    return out


def gate_acceptance(ws: Workspace, lt: LoadedTask, events: list[E.Event]
                    ) -> tuple[list[E.Event], list[Append]]:
    """(events to save, appends to save with them); AwaitingApproval (module docstring)."""
    if lt.task.contract.human != "required":
        return events, []
    acc = next((e for e in events if isinstance(e, E.DeliverableAccepted)), None)
    if acc is None:
        return events, []
    kind, target, args = accept_action(acc)
    g = approvals.check(ws, kind, target, args, actor=LOOP_ACTOR)
    if g.state == "granted":
        assert g.use is not None and g.approval is not None
        cited = acc.model_copy(update={"evidence": [*acc.evidence, g.approval.approval_id]})
        return [cited if e is acc else e for e in events], [g.use]
    if g.state == "denied" and g.approval is not None:
        return _denied(events, acc, g.approval), []
    aid = approvals.request(ws, kind, target, args, f"accept {describe(acc.candidate)} as "
                            f"the deliverable of task {lt.task_id} ({acc.summary})",
                            LOOP_ACTOR)
    raise AwaitingApproval(aid, f"{approvals.waiting_line(aid)}; then forge task resume "
                           f"{lt.task_id}")
