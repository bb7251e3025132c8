"""Spec registration: `forge profile record` and `forge task new` (the task, its deployment
point and runtime profile, recorded in one save; idempotent for the same content).

Contract (one owner per task stream): a task stream is owned by a standalone definition
(`forge task new`, the demo) or by a graph's node, and the owner is what its TaskDefined
records: actor `GRAPH_RUNNER` (the one actor graph runs write with) means the node named by
the id's namespace (`ids.graph_namespace`); any other actor, a standalone task. `check_owner`
is the one check, run at every entry: a standalone definition refuses an id in a defined
graph's namespace, and a graph (defining, starting a run, starting a node, defining a loop
node's task) refuses a stream a standalone definition holds. The stream is left untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.clock import digest
from ...ledger.errors import ConflictError, NotFoundError
from ...ledger.ids import check_id, graph_namespace
from ...ledger.payloads import Digest
from ...ledger.specs import (
    RuntimeProfile,
    SpecError,
    StartFrom,
    TaskDefinition,
    canonical,
    diff_values,
    load_point,
    load_profile,
    load_task,
    spec_hash,
    stored_profile,
)
from ...ledger.store import Append
from ...ledger.streams import WORKSPACE_STREAM, graph_stream, task_stream
from ...ledger.titles import task_title
from ...ledger.workspace import Workspace
from ...projections.memory import read_memory
from ...repos.commands import maybe_monorepo
from ...repos.errors import RepoError
from ..errors import HarnessError
from ..models.dummy_weights import dummy_refusal
from ..record import task_append
from ..task import human_actor, workspace_specs
from .code import member_commit
from .code import snapshot as code_snapshot

GRAPH_RUNNER = E.Actor.tool("graph-runner")  # the actor of every graph run's events


def check_owner(ws: Workspace, task_id: str, *, graph_node: tuple[str, str] | None) -> None:
    """Refuse (HarnessError, one line) an entry into task stream `task_id` by a writer that is
    not its owner: `graph_node` (graph, node) for a graph run, None for a standalone task."""
    ns = graph_namespace(task_id)
    if graph_node is not None and ns != graph_node:
        raise HarnessError(f"task {task_id!r} is not in graph {graph_node[0]!r} node "
                           f"{graph_node[1]!r}'s namespace")
    first = ws.ledger.stream(task_stream(task_id), until_version=1)
    ev = first[0].event if first else None
    by_graph = isinstance(ev, E.TaskDefined) and ev.actor == GRAPH_RUNNER and ns is not None
    if graph_node is None:  # a standalone stream may stay one (a ledger from before the rule)
        if by_graph or (ev is None and ns is not None
                        and ws.ledger.version(graph_stream(ns[0]))):
            assert ns is not None
            raise HarnessError(f"task id {task_id!r} belongs to graph {ns[0]!r} (its node "
                               f"{ns[1]!r}'s task stream); give the task another id")
    elif ev is not None and not by_graph:
        who = ev.actor.name if isinstance(ev, E.TaskDefined) else "another writer"
        raise HarnessError(f"graph {graph_node[0]!r} node {graph_node[1]!r}: task {task_id!r} "
                           f"is already defined outside the graph (by {who}); the graph does "
                           "not take it over: rename the node or the graph")


def _profile_event(ws: Workspace, profile: RuntimeProfile, source: str | None,
                   actor: E.Actor) -> tuple[E.RuntimeProfileRevised | None, str]:
    """The RuntimeProfileRevised to record (None when this exact revision is recorded)."""
    h = spec_hash(profile)
    _, profiles = workspace_specs(ws)
    prior = profiles.get((profile.service, profile.rev))
    if prior is not None:
        if prior.profile_hash != h:
            changed = ", ".join(d["path"] for d in diff_values(prior.profile, canonical(profile)))
            top = max(r for s, r in profiles if s == profile.service)
            raise HarnessError(f"{source or 'profile'}: {profile.service} rev {profile.rev} is "
                               f"already recorded with other content (changed: {changed}); "
                               f"give it rev {top + 1}")
        return None, h
    older = [r for s, r in profiles if s == profile.service and r < profile.rev]
    prev = profiles[(profile.service, max(older))] if older else None
    changes = {}
    if prev is not None:
        changes = {"from_rev": prev.rev,
                   "diff": diff_values(prev.profile, canonical(profile))}
    return E.RuntimeProfileRevised(service=profile.service, rev=profile.rev, profile_hash=h,
                                   profile=canonical(profile),
                                   previous_hash=prev.profile_hash if prev else None,
                                   changes=changes, actor=actor), h


def record_profile(ws: Workspace, path: str | Path, actor: E.Actor | None = None) -> dict[str, Any]:
    """Record a runtime profile revision (idempotent; rev N+1 records its diff from rev N)."""
    profile = load_profile(path)
    ev, h = _profile_event(ws, profile, str(path), actor or human_actor())
    if ev is not None:
        ws.ledger.append(WORKSPACE_STREAM, [ev], command_id=f"profile:{profile.service}:"
                         f"{profile.rev}:{h}")
    return {"service": profile.service, "rev": profile.rev, "profile_hash": h,
            "recorded": ev is not None,
            # as recorded: a changed `config.env.MY_API_KEY` prints as [REDACTED…] -> [REDACTED…]
            "changes": ws.ledger.redactor.value(ev.changes) if ev else {}}


def _resolved_base(ws: Workspace, path: Path, base: dict[str, str]) -> dict[str, str]:
    """`code.base`: each member's ref as the commit it names now (the task keeps that)."""
    mono = maybe_monorepo(ws)
    if mono is None:
        raise HarnessError(f"{path}: code.base: the workspace has no MonoRepo "
                           "(forge repos init MANIFEST.yaml)")
    try:
        return {m: member_commit(mono, m, ref, f"{path}: code.base.{m}: {ref!r}")
                for m, ref in sorted(base.items())}
    except RepoError as e:  # a member the manifest does not have
        raise HarnessError(f"{path}: code.base: {e}") from None


def _resolved_repos(ws: Workspace, path: Path, repos: list[str]) -> list[str]:
    """`context.repos`: each `member@ref` as `member@<the commit it names now>`."""
    mono = maybe_monorepo(ws)
    if mono is None:
        raise HarnessError(f"{path}: context.repos: the workspace has no MonoRepo "
                           "(forge repos init MANIFEST.yaml)")
    out = []
    for i, entry in enumerate(repos):
        member, at, ref = entry.partition("@")
        what = f"{path}: context.repos[{i}]: {entry!r}"
        if not at or not member or not ref:
            raise HarnessError(f"{what}: give MEMBER@REF (a commit, branch or tag)")
        try:
            mono.member(member)
        except RepoError as e:
            raise HarnessError(f"{what}: {e}") from None
        out.append(f"{member}@{member_commit(mono, member, ref, what)}")
    return out


def _check_prior_tasks(ws: Workspace, path: Path, task_id: str, task: TaskDefinition) -> None:
    """`context.prior_tasks` name defined tasks other than this one; `context.start_from`
    names one of them."""
    for i, prior in enumerate(task.context.prior_tasks):
        what = f"{path}: context.prior_tasks[{i}]: {prior!r}"
        if prior == task_id:
            raise HarnessError(f"{what} is this task itself")
        first = ws.ledger.stream(task_stream(prior), until_version=1)
        if not first or not isinstance(first[0].event, E.TaskDefined):
            raise HarnessError(f"{what} is not a defined task (forge task list)")
    start = task.context.start_from
    if start is not None and start.task_id not in task.context.prior_tasks:
        raise HarnessError(f"{path}: context.start_from.task_id: {start.task_id!r} is not in "
                           "context.prior_tasks")


def successor_of(ws: Workspace, task: TaskDefinition, prior_id: str) -> TaskDefinition:
    """The task as the successor of `prior_id` (`forge task new --from`): the prior task
    added to `context.prior_tasks` and its handoff as `context.start_from` — its exit (state,
    reason, handoff) and its last block's handoff (state reached, findings, next sub-goal).
    The prior task must have exited (a running task has not handed off yet)."""
    try:
        mem, _ = read_memory(ws.ledger, prior_id)
    except NotFoundError:
        raise HarnessError(f"--from: {prior_id!r} is not a defined task (forge task list)"
                           ) from None
    if mem.status != "exited":
        raise HarnessError(f"--from: task {prior_id!r} has not exited (status {mem.status}): "
                           "a successor starts from an exit's handoff (forge task exit)")
    last = mem.last_handoff or {}
    start = StartFrom(task_id=prior_id, exit_state=mem.exit_state,
                      exit_reason=mem.exit_reason or "", handoff=mem.task.exit_handoff,
                      state_reached=last.get("state_reached", ""),
                      findings=list(last.get("findings", [])),
                      next_sub_goal=last.get("next_sub_goal"))
    prior = [*task.context.prior_tasks, *([] if prior_id in task.context.prior_tasks
                                          else [prior_id])]
    return task.model_copy(update={"context": task.context.model_copy(
        update={"prior_tasks": prior, "start_from": start})})


def define_task(ws: Workspace, path: str | Path, actor: E.Actor | None = None, *,
                task_id: str | None = None, from_task: str | None = None) -> dict[str, Any]:
    """`forge task new`: validate the task, its point and profile; record the profile revision
    and the point pin if new, and TaskDefined — in one save. Idempotent for the same content.
    A standalone task: an id in a defined graph's namespace is refused (`check_owner`).
    `from_task`: define it as that exited task's successor (`successor_of`)."""
    path = Path(path).resolve()
    task = load_task(path)
    if from_task is not None:
        task = successor_of(ws, task, from_task)
    return define_task_spec(ws, task, path, actor, task_id=task_id)


_DEFINE_RETRIES = 20  # optimistic-concurrency retries of one definition


def define_task_spec(ws: Workspace, task: TaskDefinition, path: str | Path,
                     actor: E.Actor | None = None, *, task_id: str | None = None,
                     graph_node: tuple[str, str] | None = None) -> dict[str, Any]:
    """`define_task` for a task already validated (a graph node's loop task, its argv filled
    in: `graph_node` names the node, and the task is recorded by `GRAPH_RUNNER`). `path` is
    the YAML file it came from: its directory resolves the point and profile, its name is
    the id when the task has none, and it is recorded as the source.

    Processes defining tasks at once (several hosts on one ledger) pin a shared point or
    profile once: the pins are saved under the workspace stream's version read, and a save
    that conflicts reads again and decides again (the pin may now be there; a racing
    definition of the same id is then found)."""
    for _ in range(_DEFINE_RETRIES):
        try:
            return _define_task_spec(ws, task, path, actor, task_id=task_id,
                                     graph_node=graph_node)
        except ConflictError:
            continue
    raise HarnessError("task definition: the workspace stream kept moving; try again")


def _define_task_spec(ws: Workspace, task: TaskDefinition, path: str | Path,
                      actor: E.Actor | None, *, task_id: str | None,
                      graph_node: tuple[str, str] | None) -> dict[str, Any]:
    actor = GRAPH_RUNNER if graph_node is not None else actor or human_actor()
    if graph_node is None and actor == GRAPH_RUNNER:
        raise HarnessError("a standalone task is not recorded as the graph runner")
    path = Path(path).resolve()
    # The one id rule, whichever way the id comes: given, the file's `id:` (checked when the
    # file loaded) or the file name.
    if task_id is not None:
        task_id = check_id(task_id, "task id")
    else:
        where = str(path) if str(path).isprintable() else repr(str(path))
        task_id = task.id or check_id(
            path.stem, f"{where}: task id taken from the file name (the task has no id:)")
    check_owner(ws, task_id, graph_node=graph_node)  # before anything is recorded
    _check_prior_tasks(ws, path, task_id, task)
    if task.contract.review is not None:
        # In the function for start-up time: review loads the model client.
        from .review import check_reviewer

        check_reviewer(ws, task, str(path))
    if task.code is not None and task.code.base:
        task = task.model_copy(update={"code": task.code.model_copy(
            update={"base": _resolved_base(ws, path, task.code.base)})})
    if task.context.repos:  # kept as the commits they name now, as code.base is
        task = task.model_copy(update={"context": task.context.model_copy(
            update={"repos": _resolved_repos(ws, path, task.context.repos)})})
    point_path = (path.parent / task.point).resolve()
    point = load_point(point_path)
    ref = point.runtime_profile
    # Read before the pins it guards: a pin appended after this read makes the save conflict.
    ws_version = ws.ledger.version(WORKSPACE_STREAM)
    if task.profile:
        profile_path: Path | None = (path.parent / task.profile).resolve()
    elif ref.file:
        profile_path = (point_path.parent / ref.file).resolve()
    else:
        profile_path = None
    points, profiles = workspace_specs(ws)
    if profile_path is not None:
        profile = load_profile(profile_path)
        if (profile.service, profile.rev) != (ref.service, ref.rev):
            raise SpecError([f"{profile_path}:1: service/rev: {profile.service} rev {profile.rev}"
                             f" does not match the point's runtime_profile {ref.service} rev "
                             f"{ref.rev} ({point_path})"])
    elif (ref.service, ref.rev) in profiles:
        profile = stored_profile(profiles[(ref.service, ref.rev)].profile)
    else:
        raise HarnessError(f"{point_path}: runtime_profile {ref.service} rev {ref.rev} is not "
                           "recorded: give runtime_profile.file or forge profile record FILE")
    refused = dummy_refusal(task.contract, profile, str(profile_path) if profile_path else
                            f"{ref.service} rev {ref.rev} (recorded)")
    if refused:
        raise HarnessError(f"{path}: {refused}")
    prof_ev, profile_hash = _profile_event(ws, profile, str(profile_path), actor)
    point_hash = spec_hash(point)
    contract_hash = digest(task.contract.model_dump(mode="json"))
    content = {k: v for k, v in canonical(task).items() if k not in ("point", "profile")}
    definition_hash = digest({**content, "point": point_hash, "profile": profile_hash})
    existing = ws.ledger.stream(task_stream(task_id), until_version=1)
    if existing:
        ev0 = existing[0].event
        if isinstance(ev0, E.TaskDefined) and ev0.definition_hash == definition_hash:
            return {"task_id": task_id, "created": False, "definition_hash": definition_hash,
                    "point_hash": point_hash, "profile_hash": profile_hash}
        raise HarnessError(f"{path}: task {task_id!r} is already defined with other content; "
                           "give the changed task a new id")
    appends = []
    ws_events: list[E.Event] = []
    if prof_ev is not None:
        ws_events.append(prof_ev)
    if point_hash not in points:
        ws_events.append(E.DeploymentPointPinned(name=point.name or point_path.stem,
                                                 point_hash=point_hash, point=canonical(point),
                                                 source=str(point_path), actor=actor))
    if ws_events:
        appends.append(Append(WORKSPACE_STREAM, ws_events, expected_version=ws_version))
    definition = {**canonical(task), "source": str(path)}
    digests = {"point": point_hash, "profile": profile_hash, "contract": contract_hash}
    if task.code is not None:
        mono = maybe_monorepo(ws)
        if mono is None:
            raise HarnessError(f"{path}: code.members {task.code.members}: the workspace has no "
                               "MonoRepo (forge repos init MANIFEST.yaml)")
        for m in task.code.members:
            try:
                mono.member(m)
            except RepoError as e:
                raise HarnessError(f"{path}: code.members: {e}") from None
    # The MonoRepo's state the task starts from: the pins of its worktrees and baseline.
    sid = code_snapshot(ws, None, f"task {task_id} defined")
    if sid is not None:
        digests[Digest.REPO_SNAPSHOT] = sid
    defined = E.TaskDefined(
        title=task.title or task_title(None, task.goal), task_type=task.type, goal=task.goal,
        definition=definition, definition_hash=definition_hash, point_hash=point_hash,
        profile_hash=profile_hash, task_id=task_id, actor=actor,
        input_digests=digests)
    appends.append(task_append(ws, task_id, [defined], expected_version=0))
    ws.ledger.save(*appends, command_id=f"task-new:{task_id}:{definition_hash}")
    return {"task_id": task_id, "created": True, "definition_hash": definition_hash,
            "point_hash": point_hash, "profile_hash": profile_hash}
