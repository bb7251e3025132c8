"""Planning a deployment point for this host (`plan_here`): the point's accelerator checked
against this host's devices (accelerators.py), the model's local path when pulled, and a
block of free ports (servers', bootstrap, encoder bootstrap, router metrics); the launch
plan itself is plan.py's (pure). Used by `forge engine up --point` (point_up.py) and by
`deploy_whole` (whole.py) for a point of more than one server.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ...ledger.specs import DeploymentPoint, RuntimeProfile
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..models.weights import model_path
from .accelerators import check_accelerator, host_accelerators
from .plan import BOOTSTRAP_OFFSET, LaunchPlan, plan_point
from .process import free_port

PLAN_BASE_PORT = 30000  # a printed plan's first port (a deploy takes a free block)


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _plan_ports(plan: LaunchPlan) -> list[int]:
    return [port for p in plan.processes for port in p.bound_ports()]


def plan_here(point: DeploymentPoint, profile: RuntimeProfile, *, ws: Workspace | None,
              model: str | None = None, overrides: Mapping[str, Any] | None = None,
              base_port: int | None = None, plan_only: bool = False, nvml: Any = None,
              ib_devices: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan for this host: accelerator check, devices, model path and ports. A point
    over several hosts is only printed here, on its own host names (node-0, node-1, ...;
    cluster_plan.py plans it on Node Registry hosts)."""
    nodes = point.accelerator.nodes
    devices: list[int] | None
    if nodes > 1:
        if not plan_only:
            raise HarnessError(f"the point runs on {nodes} hosts (accelerator.nodes): this "
                               "host alone cannot deploy it; --plan (with --hosts) prints "
                               "each host's command lines")
        devices, where = None, (f"the point's own hosts node-0..node-{nodes - 1}; give "
                                "--hosts to plan on Node Registry hosts")
    else:
        inv, source = host_accelerators(ws, nvml)
        try:
            devices = check_accelerator(point.accelerator, inv, source)
            where = source
        except HarnessError as e:
            if not plan_only:
                raise
            devices, where = None, f"the point's own indices; not deployable here: {e}"
    if point.accelerator.vendor == "cpu":
        devices = None
    model_s = model or _model_here(ws, point)
    if base_port is not None or plan_only:
        plan = plan_point(point, profile, devices, model=model_s, overrides=overrides,
                          base_port=base_port or PLAN_BASE_PORT, device_source=where,
                          ib_devices=ib_devices)
        taken = [] if plan_only else [p for p in _plan_ports(plan) if not _port_free(p)]
        if taken:
            raise HarnessError(f"ports {', '.join(map(str, taken))} of the plan are in use "
                               "(choose another --base-port)")
        return plan
    return plan_with_free_ports(lambda base: plan_point(
        point, profile, devices, model=model_s, overrides=overrides, base_port=base,
        device_source=where, ib_devices=ib_devices))


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The range the kernel takes outbound connections' source ports from."""
    try:
        low, high = (int(x) for x in open(path).read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def plan_with_free_ports(build: Callable[[int], LaunchPlan], tries: int = 40,
                         rng: random.Random | None = None) -> LaunchPlan:
    """`build(base)` for a base port whose whole block (the router's, the servers', the
    bootstrap, encoder bootstrap and router metrics ports) is free now. Bases are drawn below
    the ephemeral range: a port in it can be taken between this check and the server's bind
    by any outbound connection's source port (the routers' health checks open one a second),
    a port below it only by another listener."""
    low = ephemeral_ports()[0]
    top = low - BOOTSTRAP_OFFSET - 256  # the block's highest port stays below the range
    pick = rng or random.Random()
    for _ in range(tries):
        base = pick.randrange(10000, top) if top > 10000 else free_port()
        plan = build(base)
        if all(_port_free(p) for p in _plan_ports(plan)):
            return plan
    raise HarnessError("no free block of ports found for the plan (give --base-port)")


def _model_here(ws: Workspace | None, point: DeploymentPoint) -> str:
    """A pulled copy of the point's model when the workspace has one, else its source."""
    if ws is not None:
        try:
            return str(model_path(ws.home, point.model.name))
        except HarnessError:
            pass
    return point.model.source or point.model.name
