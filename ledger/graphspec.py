"""The task graph as a user writes it: nodes, edges and their work, in YAML (pydantic, frozen).

Contract:
- Nodes are `task` (an independently verifiable unit of work, one of `TASK_TYPES`), `repo` (a
  shared repository, a directory under the graph's work dir) or `system` (an external system,
  e.g. a production endpoint, read-only).
- Edges are `handoff` (a verified deliverable flows from task A to task B), `state` (B reads state
  that A, a repo or a system holds; a task may also write a repo) or `control` (`action: start`
  orders B after A, `stop` rejects B's direction when A delivers, `rework` carries rework from A to
  B when A is reworked).
- Only `handoff` and `control/start` edges gate readiness; a cycle through them can never run, so
  `check_graph` refuses it and names the cycle. Dangling and duplicate edges are named too.
- A task's work is pluggable: `command` (an argv or shell line plus verification steps, run and
  recorded by the graph runner) or `loop` (a task YAML run through the Task Loop).

`load_graph_spec(path)` raises `GraphSpecError` with one line naming the file and the culprit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from .clock import digest
from .errors import LedgerError, SpecError
from .ids import InvalidIdError, check_id, from_ledger, shown
from .specs import TASK_TYPES  # a node is a task: the task definition's types, one list
from .yamlio import load_yaml

# Edge kinds that gate readiness (a `control` edge gates only with action `start`).
GATING = ("handoff", "control:start")
# Edge kinds along which rework propagates from a reworked or invalidated node.
REWORK_CARRIERS = ("handoff", "state", "control:rework")


def edge_label(kind: str, action: str | None) -> str:
    """An edge's kind as GATING / REWORK_CARRIERS name it: handoff, state, control:<action>."""
    return f"control:{action}" if kind == "control" else kind


def edge_id(src: str, dst: str, label: str) -> str:
    """An edge's id: one per (source, target, label), in the spec and in the graph's view."""
    return f"{src}->{dst}:{label}"


class GraphSpecError(LedgerError):
    """A graph YAML (or an added node/edge) is invalid; one line naming file and culprit."""


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class VerifyStep(_Spec):
    """One verification step: a command whose exit 0 means verified, or a metrics gate on the
    JSON object the work command printed as its last stdout line."""

    name: str
    argv: list[str] | None = None
    sh: str | None = None
    metric: str | None = None
    at_least: float | None = None
    at_most: float | None = None
    equals: float | None = None
    timeout_s: float = 60.0

    @model_validator(mode="after")
    def _one_kind(self) -> VerifyStep:
        given = [k for k in ("argv", "sh", "metric") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"verify step {self.name!r}: give exactly one of argv, sh, metric")
        bounds = [b for b in (self.at_least, self.at_most, self.equals) if b is not None]
        if self.metric is not None and not bounds:
            raise ValueError(f"verify step {self.name!r}: metric needs at_least/at_most/equals")
        return self


class CommandWork(_Spec):
    """Run an argv (or `bash -c sh`) in the graph's work dir, then verify.

    Placeholders in argv/sh: {python} {graph_dir} {workdir} {node} {attempt}."""

    kind: Literal["command"] = "command"
    argv: list[str] | None = None
    sh: str | None = None
    timeout_s: float = 300.0
    env: dict[str, str] = Field(default_factory=dict)
    verify: list[VerifyStep] = Field(min_length=1)
    deliverables: list[str] = Field(default_factory=list)  # files (workdir-relative) handed off

    @model_validator(mode="after")
    def _one_command(self) -> CommandWork:
        if (self.argv is None) == (self.sh is None):
            raise ValueError("command work: give exactly one of argv, sh")
        if self.argv is not None and not self.argv:
            raise ValueError("command work: argv is empty")
        names = [v.name for v in self.verify]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate verify step names {dup}")
        return self


class LoopWork(_Spec):
    """Run a task YAML (a TaskDefinition) through the Task Loop."""

    kind: Literal["loop"] = "loop"
    task: str  # path, relative to the graph file


Work = Annotated[CommandWork | LoopWork, Field(discriminator="kind")]


class NodeSpec(_Spec):
    id: str
    kind: Literal["task", "repo", "system"] = "task"
    type: str | None = None  # task type (task nodes)
    title: str = ""
    goal: str = ""
    work: Work | None = None
    est_s: float = 1.0  # expected duration, weights the critical path until measured
    path: str | None = None  # repo: directory under the work dir
    # repo: the MonoRepo member it is (a worktree of it, pinned at the run's snapshot);
    # None: a bare folder
    member: str | None = None
    url: str | None = None  # system: where it lives
    read_only: bool = True  # system: never written by tasks

    @model_validator(mode="before")
    @classmethod
    def _default_work_kind(cls, data: Any) -> Any:
        work = data.get("work") if isinstance(data, dict) else None
        if isinstance(work, dict) and "kind" not in work:
            data = {**data, "work": {"kind": "command", **work}}
        return data

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> NodeSpec:
        if not from_ledger(info):  # what the ledger holds was checked when it entered
            _check_part_id(self.id, "node id")
            if self.path is not None:
                check_repo_path(self.path, f"node {self.id}: path")
        if self.kind == "task":
            if self.type not in TASK_TYPES:
                raise ValueError(
                    f"node {self.id}: type {self.type!r} is not one of {', '.join(TASK_TYPES)}")
            if self.work is None:
                raise ValueError(f"node {self.id}: a task node needs work (command or loop)")
        elif self.work is not None:
            raise ValueError(f"node {self.id}: a {self.kind} node has no work")
        if self.member is not None:
            if self.kind != "repo":
                raise ValueError(f"node {self.id}: only a repo node names a MonoRepo member")
            if not from_ledger(info):
                _check_part_id(self.member, f"node {self.id}: member")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("member") is None:
            data.pop("member", None)  # a bare-folder node hashes as before `member` existed
        return data


class EdgeSpec(_Spec):
    src: str = Field(alias="from")
    dst: str = Field(alias="to")
    kind: Literal["handoff", "state", "control"]
    action: Literal["start", "stop", "rework"] | None = None  # control edges (default start)
    deliverable: str = ""  # handoff: what flows
    access: Literal["read", "write"] = "read"  # state

    @model_validator(mode="before")
    @classmethod
    def _default_action(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "control" and not data.get("action"):
            data = {**data, "action": "start"}
        return data

    @model_validator(mode="after")
    def _shape(self) -> EdgeSpec:
        if self.kind != "control" and self.action is not None:
            raise ValueError(f"edge {self.src} -> {self.dst}: only control edges have an action")
        if self.src == self.dst:
            raise ValueError(f"edge {self.src} -> {self.dst}: a node cannot feed itself")
        return self

    @property
    def id(self) -> str:
        return edge_id(self.src, self.dst, self.label)

    @property
    def label(self) -> str:
        """Kind as used in GATING / REWORK_CARRIERS: handoff, state, control:<action>."""
        return edge_label(self.kind, self.action)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class GraphSpec(_Spec):
    name: str
    title: str = ""
    description: str = ""
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _name(self, info: ValidationInfo) -> GraphSpec:
        if not from_ledger(info):
            _check_part_id(self.name, "graph name")
        return self

    def spec_hash(self) -> str:
        return digest(self.model_dump(mode="json", by_alias=True))


def _check_part_id(value: str, what: str) -> None:
    try:
        check_id(value, what, part=True)
    except InvalidIdError as e:
        raise ValueError(str(e)) from None


def check_repo_path(path: str, what: str) -> str:
    """A repo node's directory: relative to the graph's work dir and staying inside it (no
    absolute path, no `..`, no backslash or NUL). The graph runner also resolves it (symlinks
    included) and refuses a directory outside the work dir."""
    p = PurePosixPath(path)
    if (not path.strip() or p.is_absolute() or ".." in p.parts or "\\" in path
            or "\x00" in path or path.startswith("~")):
        raise ValueError(f"{what}: {shown(path)} must be a relative path inside the graph's "
                         "work dir (no absolute path, no '..')")
    return path


class EdgeEnds(Protocol):
    """What the cross-reference checks read of an edge: an EdgeSpec, or a graph view's edge."""

    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def label(self) -> str: ...


def check_graph(nodes: Sequence[NodeSpec], edges: Sequence[EdgeEnds],
                where: str = "graph") -> None:
    """Cross-reference checks: unique node ids, no dangling or duplicate edges, endpoint kinds
    fit the edge kind, and no cycle through gating edges. Raises GraphSpecError naming it."""
    kinds: dict[str, str] = {}
    for i, n in enumerate(nodes):
        if n.id in kinds:
            raise GraphSpecError(f"{where}: nodes[{i}]: duplicate node id {n.id!r}")
        kinds[n.id] = n.kind
    seen: set[str] = set()
    for i, e in enumerate(edges):
        at = f"{where}: edges[{i}] ({e.src} -> {e.dst}, {e.label})"
        for end in (e.src, e.dst):
            if end not in kinds:
                raise GraphSpecError(f"{at}: unknown node {end!r} (dangling edge)")
        if e.id in seen:
            raise GraphSpecError(f"{at}: duplicate edge")
        seen.add(e.id)
        if e.kind in ("handoff", "control") and (kinds[e.src], kinds[e.dst]) != ("task", "task"):
            raise GraphSpecError(f"{at}: {e.kind} edges join two task nodes")
        if e.kind == "state" and "task" not in (kinds[e.src], kinds[e.dst]):
            raise GraphSpecError(f"{at}: a state edge needs a task at one end")
        if e.kind == "state" and kinds[e.dst] == "system":
            raise GraphSpecError(f"{at}: external systems are read-only (no state edge into one)")
    cycle = find_cycle([n.id for n in nodes], [(e.src, e.dst) for e in edges if e.label in GATING])
    if cycle:
        raise GraphSpecError(
            f"{where}: cycle through handoff/control edges: {' -> '.join(cycle)} "
            "(a node on it could never become ready)")


def find_cycle(nodes: list[str], edges: list[tuple[str, str]]) -> list[str] | None:
    """A cycle as [a, b, …, a] or None (iterative DFS, deterministic in input order)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        out.setdefault(a, []).append(b)
        out.setdefault(b, [])
    color: dict[str, int] = dict.fromkeys(out, 0)  # 0 new, 1 on stack, 2 done
    for root in out:
        if color[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        color[root] = 1
        while stack:
            node, i = stack[-1]
            if i < len(out[node]):
                stack[-1] = (node, i + 1)
                nxt = out[node][i]
                if color[nxt] == 1:
                    return path[path.index(nxt):] + [nxt]
                if color[nxt] == 0:
                    color[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                color[node] = 2
                stack.pop()
                path.pop()
    return None


def _first_error(e: ValidationError, data: Any) -> str:
    err = e.errors()[0]
    loc = list(err["loc"])
    # Name the node/edge by id rather than by index where the YAML gives one.
    label = ".".join(str(x) for x in loc)
    if len(loc) >= 2 and loc[0] in ("nodes", "edges") and isinstance(loc[1], int):
        try:
            item = data[loc[0]][loc[1]]
            name = item.get("id") or f"{item.get('from')} -> {item.get('to')}"
            label = f"{loc[0]}[{loc[1]}] ({name})" + "".join(f".{x}" for x in loc[2:])
        except (KeyError, IndexError, TypeError, AttributeError):
            pass
    msg = " ".join(str(err["msg"]).split()).removeprefix("Value error, ")
    return f"{label}: {msg}" if label else msg


def parse_graph_spec(data: Any, where: str = "graph") -> GraphSpec:
    if not isinstance(data, dict):
        raise GraphSpecError(f"{where}: expected a mapping with name, nodes, edges")
    try:
        spec = GraphSpec.model_validate(data)
    except ValidationError as e:
        raise GraphSpecError(f"{where}: {_first_error(e, data)}") from None
    check_graph(spec.nodes, spec.edges, where)
    return spec


def parse_node(data: Any, where: str = "node") -> NodeSpec:
    try:
        return NodeSpec.model_validate(data)
    except ValidationError as e:
        raise GraphSpecError(f"{where}: {_first_error(e, data)}") from None


def parse_edge(data: Any, where: str = "edge") -> EdgeSpec:
    try:
        return EdgeSpec.model_validate(data)
    except ValidationError as e:
        raise GraphSpecError(f"{where}: {_first_error(e, data)}") from None


def load_graph_yaml(path: str | Path) -> Any:
    """A graph or node YAML file's data, read by the specs' bounded loader (size, nesting,
    aliases, UTF-8, duplicate keys, finite numbers); a problem is one GraphSpecError line."""
    try:
        return load_yaml(path)[0]
    except SpecError as e:
        raise GraphSpecError(e.problems[0]) from None


def load_graph_spec(path: str | Path) -> GraphSpec:
    p = Path(path)
    return parse_graph_spec(load_graph_yaml(p), str(p))
