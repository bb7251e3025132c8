"""The artifacts a task's own events reference: what an agent working on the task may read
back (`artifact_read`, harness/agents/task_tools.py), and where each was referenced.

Contract:
- `artifact_refs(events)` (pure): digest -> the references to it, in stream order. Only
  fields forge itself fills count: a tool call's stdout and stderr, an engine's log, a
  measurement's record and its evaluator's captures (its meta's `*_digest` values, a
  build's output), a model call's prompt and response, a review's response, a profile's
  traces. Never text an agent or a person wrote (a handoff, a sub-goal, a refused call's
  arguments): such text could name any digest, and naming one must not bring it in scope.
- `task_artifacts(ledger, task_id, pending=())`: the same over the task's stream, plus
  `pending` events not saved yet (the agent executor's decision collects its tool calls and
  saves them with the block it starts). An unknown task raises `NotFoundError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..ledger import events as E
from ..ledger.errors import NotFoundError
from ..ledger.ids import shown, unknown_id_hint
from ..ledger.store import Ledger
from ..ledger.streams import task_stream

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

# Event type -> its fields that hold artifact digests (one digest, or a tuple of them).
FIELDS: dict[type[E.Event], tuple[str, ...]] = {
    E.ToolInvoked: ("stdout_digest", "stderr_digest"),
    E.EngineLaunched: ("log_digest",),
    E.EngineStopped: ("log_digest",),
    E.MeasurementRecorded: ("artifact_digest",),
    E.ProfileCaptured: ("traces",),
    E.ModelCalled: ("prompt_digest", "response_digest"),
    E.ReviewRecorded: ("response_digest",),
}


@dataclass(frozen=True)
class ArtifactRef:
    """One reference: the event (type, id, block) and its field (dotted, `meta.` inside a
    measurement's meta)."""

    event: str
    field: str
    event_id: str
    block_id: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "field": self.field, "event_id": self.event_id,
                "block_id": self.block_id}


def _meta_digests(meta: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """A measurement's meta: its `*_digest` values (the evaluator's captures: stdout, stderr,
    server info, outputs) and each build's output (`builds.<member>.*_digest`)."""
    for k, v in meta.items():
        if k.endswith("_digest"):
            yield f"meta.{k}", v
    builds = meta.get("builds")
    if isinstance(builds, Mapping):
        for member, rec in builds.items():
            if isinstance(rec, Mapping):
                for k, v in rec.items():
                    if k.endswith("_digest"):
                        yield f"meta.builds.{member}.{k}", v


def _digests_of(ev: E.Event) -> Iterator[tuple[str, Any]]:
    for name in FIELDS.get(type(ev), ()):
        value = getattr(ev, name)
        if isinstance(value, tuple | list):
            for i, v in enumerate(value):
                yield f"{name}.{i}", v
        else:
            yield name, value
    if isinstance(ev, E.MeasurementRecorded):
        yield from _meta_digests(ev.meta)


def artifact_refs(events: Iterable[E.Event]) -> dict[str, list[ArtifactRef]]:
    """Digest -> its references in these events (module contract)."""
    out: dict[str, list[ArtifactRef]] = {}
    for ev in events:
        for name, value in _digests_of(ev):
            if isinstance(value, str) and DIGEST.fullmatch(value):
                out.setdefault(value, []).append(ArtifactRef(
                    ev.TYPE, name, str(ev.event_id), ev.block_id))
    return out


def task_artifacts(ledger: Ledger, task_id: str, pending: Iterable[E.Event] = ()
                   ) -> dict[str, list[ArtifactRef]]:
    """The artifacts task `task_id`'s events reference, with `pending` ones of the task."""
    records = ledger.stream(task_stream(task_id))
    if not records:
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)}")
    mine = [e for e in pending if e.task_id == task_id]
    return artifact_refs([*(r.event for r in records), *mine])
