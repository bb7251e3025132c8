"""A task as the harness sees it: its definition, point and profile loaded from the ledger
(its state and stream version come from Task Memory, `projections.memory.read_memory`); the
actors of the loop and of a person at the terminal. Shared by spec registration, the
automatic loop, the manual path, `forge build`, the MCP tools and the demo: below all of them.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..ledger import events as E
from ..ledger.clock import digest
from ..ledger.errors import NotFoundError
from ..ledger.ids import LEDGER_CONTEXT, shown, unknown_id_hint
from ..ledger.payloads import Digest
from ..ledger.specs import (
    DeploymentPoint,
    RuntimeProfile,
    TaskDefinition,
    stored_point,
    stored_profile,
)
from ..ledger.streams import WORKSPACE_STREAM, task_stream
from ..ledger.workspace import Workspace
from .errors import HarnessError

LOOP_ACTOR = E.Actor.tool("forge-loop")
Progress = Callable[[str], None]


def human_actor() -> E.Actor:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = os.environ.get("USER", "human")
    return E.Actor.human(name)


# --- loading a task from the ledger -----------------------------------------------------


@dataclass(frozen=True)
class LoadedTask:
    task_id: str
    task: TaskDefinition
    point: DeploymentPoint
    profile: RuntimeProfile | None
    definition_hash: str
    point_hash: str
    profile_hash: str | None
    contract_hash: str
    base_dir: Path | None
    repo_snapshot: str | None = None  # the MonoRepo snapshot taken when it was defined

    @property
    def digests(self) -> dict[str, str]:
        d = {"definition": self.definition_hash, "point": self.point_hash,
             "contract": self.contract_hash}
        if self.profile_hash:
            d["profile"] = self.profile_hash
        return d


ProfileIndex = dict[tuple[str, int], E.RuntimeProfileRevised]


def workspace_specs(ws: Workspace) -> tuple[dict[str, dict], ProfileIndex]:
    points: dict[str, dict] = {}
    profiles: ProfileIndex = {}
    for r in ws.ledger.stream(WORKSPACE_STREAM):
        ev = r.event
        if isinstance(ev, E.DeploymentPointPinned):
            points[ev.point_hash] = dict(ev.point)
        elif isinstance(ev, E.RuntimeProfileRevised):
            profiles[(ev.service, ev.rev)] = ev
    return points, profiles


def load_task_from_ledger(ws: Workspace, task_id: str) -> LoadedTask:
    records = ws.ledger.stream(task_stream(task_id), until_version=1)
    if not records or not isinstance(records[0].event, E.TaskDefined):
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                            "(define it with forge task new FILE.yaml)")
    ev = records[0].event
    definition = {k: v for k, v in ev.definition.items() if k != "source"}
    task = TaskDefinition.model_validate(definition, context=LEDGER_CONTEXT)
    points, profiles = workspace_specs(ws)
    if ev.point_hash not in points:
        raise HarnessError(f"task {task_id}: deployment point {ev.point_hash} is not pinned")
    point = stored_point(points[ev.point_hash])
    prof_ev = profiles.get((point.runtime_profile.service, point.runtime_profile.rev))
    profile = stored_profile(prof_ev.profile) if prof_ev else None
    source = ev.definition.get("source")
    return LoadedTask(task_id, task, point, profile, ev.definition_hash, ev.point_hash or "",
                      ev.profile_hash, ev.input_digests.get("contract") or
                      digest(task.contract.model_dump(mode="json")),
                      Path(source).parent if source else None,
                      ev.input_digests.get(Digest.REPO_SNAPSHOT))

