"""`forge engine up --point POINT`: deploy a whole deployment point (or only print its plan).

`point_up(ws, point_path, ...)`:
1. loads the point and its runtime profile (the point's `runtime_profile.file`, or the
   profile given, which must be the service and revision the point names);
2. checks the point's accelerator against this host (`accelerators.py`); the matching GPUs
   are the devices the plan assigns. With `hosts` (a point over several hosts, `--plan`
   only), against each named host's Node Registry inventory instead (cluster_plan.py);
   with `ray` (a Ray cluster's address), the plan is launched there (ray_launch.py).
   With `plan_only`, a host that does not match does not stop the plan from printing: it
   is planned on the point's own device indices (a point over several hosts: on its own
   host names node-0, node-1, ...) and the plan's `device_source` says why;
3. plans (`plan.py`) on ports from `base_port` (default: 30000 for a printed plan; a free
   block of ports for a deploy; a given base whose ports are taken is refused);
4. with an image in the profile, wraps every process to run in it by digest (whole.py,
   image.py: `--plan` shows the wrapped lines and pulls nothing; a deploy pulls and checks
   the digest first);
5. unless `plan_only`, starts the deployment (the plan is recorded first; each server's
   version and resolved arguments checked against the profile: `whole.PinnedDeployment`)
   and keeps it up until Ctrl-C (or stops at once with `once`), returning the plan and
   what ran.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...ledger.specs import DeploymentPoint, RuntimeProfile, load_point, load_profile
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from .base import apply_overrides
from .cluster_plan import plan_on_hosts
from .host_plan import PLAN_BASE_PORT, plan_here
from .plan import LaunchPlan
from .ray_launch import ray_point_up
from .sglang_flags import parse_with_release
from .up import watch
from .whole import PinnedDeployment, pin_plan, shown_in_image


def point_and_profile(point_path: str | Path, profile_path: str | Path | None = None
                      ) -> tuple[DeploymentPoint, RuntimeProfile]:
    point = load_point(point_path)
    ref = point.runtime_profile
    if profile_path is None:
        if not ref.file:
            raise HarnessError(f"{point_path}: names no runtime_profile.file (give the "
                               "profile file too)")
        profile_path = (Path(point_path).parent / ref.file).resolve()
    profile = load_profile(profile_path)
    if (profile.service, profile.rev) != (ref.service, ref.rev):
        raise HarnessError(f"{profile_path}: {profile.service} rev {profile.rev} is not the "
                           f"point's runtime_profile {ref.service} rev {ref.rev}")
    return point, profile


def parser_check(plan: LaunchPlan, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every server's argv of `plan` parsed by the real argument parser of the plan's SGLang
    release (its wheel fetched once, sglang_release.py): `{"version", "ok", "servers":
    [{"name", "ok", "error"}]}`. What a GPU host's `sglang.launch_server` would say about
    the flags, known before a GPU is taken."""
    servers = [p for p in plan.processes if p.role != "router"]
    echo(f"parsing {len(servers)} server command line(s) with SGLang {plan.sglang_version}'s "
         "own parser (its wheel is fetched once)")
    results = parse_with_release(plan.sglang_version,
                                 [p.argv[p.argv.index("--model-path"):] for p in servers])
    rows = [{"name": p.name, "ok": r["ok"], "error": r["error"]}
            for p, r in zip(servers, results, strict=True)]
    return {"version": plan.sglang_version, "ok": all(r["ok"] for r in rows), "servers": rows}


def point_up(ws: Workspace | None, point_path: str | Path, *,
             profile_path: str | Path | None = None, model: str | None = None,
             overrides: Mapping[str, Any] | None = None, base_port: int | None = None,
             plan_only: bool = False, once: bool = False, nvml: Any = None,
             stream: str | None = None, event_fields: Mapping[str, Any] | None = None,
             echo: Callable[[str], None] = print, check_parser: bool = False,
             hosts: Sequence[str] | None = None, ib_devices: Mapping[str, str] | None = None,
             ray: str | None = None) -> dict[str, Any]:
    point, profile = point_and_profile(point_path, profile_path)
    if ray is not None and (plan_only or not hosts):
        raise HarnessError("--ray launches a plan over --hosts (without --plan)")
    if hosts:
        if ws is None:
            raise HarnessError("--hosts needs a workspace: the hosts are the Node Registry's")
        if ray is not None:
            return ray_point_up(ws, point, profile, hosts, ray, ib_devices=ib_devices,
                                model=model, overrides=overrides,
                                base_port=base_port or PLAN_BASE_PORT, once=once,
                                stream=stream, event_fields=event_fields, echo=echo)
        if not plan_only:
            raise HarnessError("--hosts: launching on several hosts goes through Ray "
                               "(--ray ADDRESS); --plan --hosts prints each host's command "
                               "lines")
        plan, _ = plan_on_hosts(ws, point, profile, hosts, ib_devices=ib_devices,
                                model=model, overrides=overrides,
                                base_port=base_port or PLAN_BASE_PORT, claim=False)
    else:
        plan = plan_here(point, profile, ws=ws, model=model, overrides=overrides,
                         base_port=base_port, plan_only=plan_only, nvml=nvml,
                         ib_devices=ib_devices)
    vendor = point.accelerator.vendor
    if plan_only:  # in the profile's image as it would run; nothing pulled
        out = {"plan": shown_in_image(plan, profile, vendor=vendor).to_json()}
        if check_parser:
            out["parser_check"] = parser_check(plan, echo)
        return out
    plan, use = pin_plan(plan, profile, vendor=vendor, say=echo, ws=ws)
    check = bool(apply_overrides(profile.config, overrides).get("check_flags"))
    with PinnedDeployment(plan, profile, use, ws=ws, stream=stream, event_fields=event_fields,
                          check_flags=check) as dep:
        info = dep.describe()
        if not once:
            echo(f"{plan.architecture} deployment of {plan.point or point_path} up at "
                 f"{plan.entry_url} ({len(plan.processes)} processes); Ctrl-C to stop")
            watch(dep.check, echo)
    return {"plan": plan.to_json(), "deployment": info}
