"""Planning a deployment point for this host (`plan_here`): the point's accelerator checked
against this host's devices (accelerators.py), the model's local path when pulled, and a
block of free ports (servers', bootstrap, encoder bootstrap, router metrics); the launch
plan itself is plan.py's (pure). Used by `forge engine up --point` (point_up.py) and by
`deploy_whole` (whole.py) for a point of more than one server.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
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
    return [port for p in plan.processes
            for port in (p.port, p.bootstrap_port, p.encoder_bootstrap_port, p.metrics_port)
            if port is not None]


def plan_here(point: DeploymentPoint, profile: RuntimeProfile, *, ws: Workspace | None,
              model: str | None = None, overrides: Mapping[str, Any] | None = None,
              base_port: int | None = None, plan_only: bool = False, nvml: Any = None
              ) -> LaunchPlan:
    """The plan for this host: accelerator check, devices, model path and ports."""
    inv, source = host_accelerators(ws, nvml)
    try:
        devices: list[int] | None = check_accelerator(point.accelerator, inv, source)
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
                          base_port=base_port or PLAN_BASE_PORT, device_source=where)
        taken = [] if plan_only else [p for p in _plan_ports(plan) if not _port_free(p)]
        if taken:
            raise HarnessError(f"ports {', '.join(map(str, taken))} of the plan are in use "
                               "(choose another --base-port)")
        return plan
    for _ in range(20):  # a free block: the router's port, the servers', the bootstrap ports
        base = free_port()
        if base + BOOTSTRAP_OFFSET + 64 > 65535:
            continue
        plan = plan_point(point, profile, devices, model=model_s, overrides=overrides,
                          base_port=base, device_source=where)
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
