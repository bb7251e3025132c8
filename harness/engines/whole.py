"""Deploying a whole point: its launch plan in the profile's pinned image, every server checked
against the profile, behind the one `RunningEngine` interface the evaluator measures.

Contracts:
- `pin_plan(plan, profile)`: the plan as it will run: in the profile's image by digest when
  it has one (image.py: a container runtime found, the image pulled and its digest checked
  before anything starts), else as planned (no image, or `image_fallback: local` on a host
  without docker/podman). Returns the plan and the ImageUse (None: local).
- `PinnedDeployment`: a `Deployment` (deploy.py) whose every server, once healthy, must
  report the pinned SGLang version and resolve its command line's arguments as asked
  (`image.check_server`: a mismatch fails the deploy naming the process and both values, and
  tears every process down; an encoder-only server has no `/server_info` in any SGLang
  release, so encoders are not checked, nor a server's follower ranks: their rank 0 is),
  and whose containers are removed after their
  clients stop.
- `placement_problem(point, profile)` (pure): why a point cannot be deployed as it is, or
  None: for sglang (with a pinned version), the launch plan's refusal on the point's own
  accelerator (too few devices, a profile contradicting the point's parallelism); for the
  other engines, anything but one colocated server. The sweep skips such candidates and
  `out_of_scope` refuses them.
- `deploy_whole(ws, point, profile, ...)`: a point served by one colocated server starts
  through its engine (`Engine.launch`, which checks image, version and arguments alike);
  any other sglang point (PD, EPD, replicas behind the router) is planned for this host
  (`host_plan.plan_here`: accelerator check, devices, free ports) and started as a
  `PinnedDeployment`. Either way a `RunningEngine` whose `base_url` is the entry (the
  router, or the one server) and whose `describe()` carries the plan.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...ledger.candidate_keys import role_key
from ...ledger.specs import DeploymentPoint, RuntimeProfile
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from . import engine_for
from .base import RunningEngine, engine_config_of
from .deploy import Deployment
from .host_plan import plan_here
from .image import (
    ContainerRuntime,
    ImageUse,
    argv_options,
    check_server,
    clear_stale_container,
    container_name,
    ensure_image,
    image_ref,
    image_use,
    name_of,
    owned,
    profile_label,
    remove_container,
    with_trace_mount,
)
from .image_resolve import resolve_use
from .plan import LaunchPlan, ProcessPlan, plan_point, roles_of, wrap_plan
from .trace_dir import trace_root

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def pin_plan(plan: LaunchPlan, profile: RuntimeProfile, *, vendor: str = "nvidia",
             say: Say = _quiet, ws: Workspace | None = None
             ) -> tuple[LaunchPlan, ImageUse | None]:
    use = resolve_use(ws, image_use(profile, say=say), say=say)  # `resolve`: pinned now
    if use is None:
        return plan, None
    ensure_image(use, say=say)
    for p in plan.processes:  # what a killed forge left on these names goes first
        clear_stale_container(use, container_name(p.name, p.port), say=say)
    host_python = str(profile.config.get("python") or sys.executable)
    return wrap_plan(plan, use, host_python=host_python, vendor=vendor), use


def shown_in_image(plan: LaunchPlan, profile: RuntimeProfile, *, vendor: str = "nvidia"
                   ) -> LaunchPlan:
    """The plan as it would run in the profile's image (pure but for finding the runtime;
    nothing pulled): wrapped for the runtime found, for `docker` when there is none and the
    profile refuses the local install; as planned without an image or with the local
    fallback on a host without a runtime."""
    ref = image_ref(profile)
    if ref is None:
        return plan
    try:
        use = image_use(profile)
    except HarnessError:  # no runtime here; the deploy would refuse: show what would run
        use = ImageUse(ContainerRuntime("docker", "docker"), ref, ref.rpartition("@")[2],
                       profile_label(profile))
    if use is None:
        return plan
    host_python = str(profile.config.get("python") or sys.executable)
    return wrap_plan(plan, use, host_python=host_python, vendor=vendor)


def requested_of(p: ProcessPlan, use: ImageUse | None) -> dict[str, Any]:
    """The server arguments a (possibly wrapped) process's command line asks for."""
    argv = list(p.argv)
    if use is not None and use.target in argv:
        argv = argv[argv.index(use.target) + 1:]
    return argv_options(argv)


class PinnedDeployment(Deployment):
    """A Deployment checked against its runtime profile (see the module docstring)."""

    def __init__(self, plan: LaunchPlan, profile: RuntimeProfile, use: ImageUse | None,
                 **kwargs: Any):
        self.use = use
        self.unreported: dict[str, list[str]] = {}
        pinned_by = f"runtime profile {profile_label(profile)} (framework.version)"
        check_args = profile.config.get("check_args", True) is not False

        def on_ready(p: ProcessPlan, info: dict[str, Any]) -> None:
            if p.role in ("router", "encode") or p.node_rank:  # no /server_info to check
                return
            self.unreported[p.name] = check_server(
                info, version=plan.sglang_version, requested=requested_of(p, use),
                where=f"{p.name} ({p.role} server) at {p.url}", pinned_by=pinned_by,
                args=check_args)

        super().__init__(plan, on_ready=on_ready, **kwargs)

    def _spawn(self, p: ProcessPlan) -> None:
        if self.use is not None and name_of(p.argv) is not None:
            argv = owned(p.argv)
            if self.ws is not None and p.role != "router":  # where /start_profile writes
                argv = with_trace_mount(argv, self.use.target, trace_root(self.ws.home))
            p = p.model_copy(update={"argv": tuple(argv)})
        super()._spawn(p)

    def stop(self, reason: str = "teardown") -> None:
        try:
            super().stop(reason)
        finally:
            if self.use is not None:
                for p in reversed(self.started):
                    if (name := name_of(p.argv)) is not None:
                        remove_container(self.use, name)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        if self.use is not None:
            info["image"] = {"ref": self.use.ref, "digest": self.use.digest,
                             "runtime": self.use.runtime.kind}
        if any(self.unreported.values()):
            info["unreported_args"] = {k: v for k, v in self.unreported.items() if v}
        return info


class RunningPoint(RunningEngine):
    """A started PinnedDeployment as a RunningEngine (entry URL, the plan's model)."""

    def __init__(self, dep: PinnedDeployment):
        self.dep = dep
        self.engine = dep.plan.engine
        self.base_url = dep.plan.entry_url
        self.model = dep.plan.model

    def describe(self) -> dict[str, Any]:
        info = self.dep.describe()
        starts = [p["startup_s"] for p in info["processes"] if p.get("startup_s") is not None]
        return {**info, "engine": self.engine, "base_url": self.base_url, "model": self.model,
                "launch_command": [p.command_line() for p in self.dep.plan.processes],
                "plan": self.dep.plan.to_json(), "startup_s": max(starts, default=0.0),
                "versions": {"sglang": self.dep.plan.sglang_version}}

    def check(self, grace_s: float = 0.0) -> None:
        self.dep.check()

    def stop(self, reason: str = "teardown") -> None:
        self.dep.stop(reason)


def deployable(key: str) -> bool:
    """A candidate key a whole deployment can take (the rest is the experiment or code)."""
    head = key.partition(".")[0]
    return head in ("engine", "profile", "topology") or role_key(key) is not None


def deployment_meta(point: DeploymentPoint, desc: Mapping[str, Any]) -> dict[str, Any]:
    """What was deployed, for a run's meta: architecture, roles, processes, plan, image."""
    topo = point.topology
    out: dict[str, Any] = {
        "architecture": topo.architecture,
        "roles": [{"role": r.role, "count": r.count, **r.parallelism.model_dump()}
                  for r in topo.roles] or [{"role": "colocated", "count": 1,
                                            **topo.parallelism.model_dump()}]}
    if isinstance(desc.get("plan"), Mapping):
        out["plan_digest"] = desc["plan"].get("digest")
        out["processes"] = [p.get("name") for p in desc.get("processes", [])]
    else:
        out["processes"] = [desc.get("engine", "server")]
    if isinstance(desc.get("image"), Mapping):
        out["image"] = {k: desc["image"][k] for k in ("ref", "runtime") if k in desc["image"]}
    return out


def placement_problem(point: DeploymentPoint | None, profile: RuntimeProfile | None
                      ) -> str | None:
    """Why an sglang point (a candidate applied) cannot be planned on its own accelerator:
    too few devices for its roles, a profile contradicting its parallelism, … (pure; the
    launch plan's one-line error), or None. Points of other engines, or without a pinned
    version (the flags' names depend on it), are not planned here."""
    if point is None or profile is None:
        return None
    if profile.engine != "sglang":
        servers = sum(r.count for r in point.topology.roles) or 1
        if point.topology.architecture != "colocated" or servers > 1:
            return (f"engine {profile.engine} serves one colocated server; architecture "
                    f"{point.topology.architecture} with {servers} servers is deployed for "
                    "sglang only")
        return None

    try:
        if not engine_config_of(profile)[1].get("version"):
            return None
        plan_point(point, profile, None, model="-")
    except HarnessError as e:
        return " ".join(str(e).split())
    return None


def single_server(point: DeploymentPoint, config: Mapping[str, Any]) -> bool:
    """One colocated server (no router): the engine's own launch serves it."""
    if point.topology.architecture != "colocated":
        return False
    roles = roles_of(point)
    dp_attention = bool(config.get("enable_dp_attention") or config.get("attn_dp_size"))
    return len(roles) == 1 and roles[0][0].count == 1 and (dp_attention or roles[0][1].dp == 1)


def point_parallelism(point: DeploymentPoint, profile: RuntimeProfile,
                      config: Mapping[str, Any]) -> dict[str, Any]:
    """The one server's parallelism flags as the point's topology says (the authority; a
    profile contradicting it is refused by the plan), when the flags' version is pinned."""
    if not config.get("version"):
        return {}

    plan = plan_point(point, profile, None, model="-")  # pure: the checks and the sizes
    par = plan.processes[0].parallelism
    out: dict[str, Any] = {}
    for key, flag in (("tp", "tp_size"), ("pp", "pp_size"), ("ep", "ep_size")):
        if par.get(key, 1) > 1 or flag in config:
            out[flag] = par.get(key, 1)
    return out


def deploy_whole(ws: Workspace | None, point: DeploymentPoint, profile: RuntimeProfile, *,
                 model: str | Path | None, event_fields: Mapping[str, Any] | None = None,
                 stream: str | None = None, say: Say = _quiet) -> RunningEngine:
    """Start the point as its topology says (see the module docstring); ready when returned.
    Engine events go on `stream` (default `engines`) with `event_fields`."""
    name, config = engine_config_of(profile)
    if name != "sglang":
        if (problem := placement_problem(point, profile)) is not None:
            raise HarnessError(problem)
        return engine_for(name).launch(config, model=model, ws=ws, stream=stream,
                                       event_fields=event_fields)
    if single_server(point, config):
        return engine_for(name).launch(config, model=model, ws=ws, stream=stream,
                                       event_fields=event_fields,
                                       overrides=point_parallelism(point, profile, config))
    plan = plan_here(point, profile, ws=ws, model=str(model) if model else None)
    plan, use = pin_plan(plan, profile, vendor=point.accelerator.vendor, say=say, ws=ws)
    say(f"deploying {plan.architecture}: {len(plan.processes)} processes "
        f"({', '.join(p.name for p in plan.processes)})")
    dep = PinnedDeployment(plan, profile, use, ws=ws, stream=stream,
                           event_fields=event_fields,
                           check_flags=bool(config.get("check_flags")))
    dep.start()
    return RunningPoint(dep)
