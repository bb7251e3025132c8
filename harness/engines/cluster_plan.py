"""Planning a deployment point over several hosts of the Node Registry (`plan_on_hosts`).

A point of `accelerator.nodes` N hosts is planned on N named hosts the registry knows (`forge
nodes observe` run on each, or a Ray inventory): the accelerator check runs on every host's
recorded inventory (accelerators.py; a mismatch names the host), the matching devices become
the plan's per-host pools (plan.py: servers that fit a host stay on one, larger ones span
whole hosts with `--nnodes/--node-rank/--dist-init-addr`), `ib_devices` gives each host's
`--disaggregation-ib-device`, and the router goes on the first host.

Ports cannot be probed on another host, so they are claimed: every port each process binds
on its host (server, bootstrap, encoder bootstrap, router metrics, and the dist-init block of
a spanning server's rank 0) and every GPU it uses (by UUID) is one lease in the claims stream
(harness/nodes/claims.py). A block someone holds is refused there; the next base port is
tried (`tries` times, `BASE_STEP` apart; a GPU held elsewhere stops at once) before giving
up with the holder named. The caller
holds the lease while the deployment runs and releases it after (`claims.release`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...ledger import events as E
from ...ledger.specs import DeploymentPoint, RuntimeProfile
from ...ledger.workspace import Workspace
from ...projections.nodes import read_claims, read_hosts
from ..errors import HarnessError
from ..nodes import claims
from ..nodes.identity import check_host
from .accelerators import check_accelerator
from .plan import DIST_OFFSET, LaunchPlan, plan_point

BASE_STEP = DIST_OFFSET + 1000  # a plan's ports lie in [base, base + DIST_OFFSET + 8k)
CLAIM_HEARTBEAT_S = 60.0


def host_devices(ws: Workspace, point: DeploymentPoint, hosts: Sequence[str]
                 ) -> tuple[dict[str, list[int]], dict[tuple[str, int], str]]:
    """{host: matching device indices} after the accelerator check on every host, and
    {(host, index): GPU UUID} for the claims."""
    if len(hosts) != point.accelerator.nodes:
        raise HarnessError(f"hosts: the point runs on {point.accelerator.nodes} host(s) "
                           f"(accelerator.nodes), {len(hosts)} given ({', '.join(hosts)})")
    if len(set(hosts)) != len(hosts):
        raise HarnessError(f"hosts: a host is named twice ({', '.join(hosts)})")
    book = read_hosts(ws.ledger)
    devices: dict[str, list[int]] = {}
    uuids: dict[tuple[str, int], str] = {}
    for h in hosts:
        check_host(h)
        known = book.hosts.get(h)
        if known is None:
            raise HarnessError(f"host {h} is not in the Node Registry (run `forge nodes "
                               "observe` on it, or join it to the Ray cluster)")
        source = f"host {h} (Node Registry, {known.last_seen:%Y-%m-%d %H:%M})"
        devices[h] = check_accelerator(point.accelerator, known.inventory, source)
        uuids.update({(h, g.index): g.uuid for g in known.inventory.gpus})
    return devices, uuids


def plan_resources(plan: LaunchPlan, uuids: Mapping[tuple[str, int], str]
                   ) -> list[E.ResourceRef]:
    """What the plan takes on each host: every bound port, every GPU (by UUID; a host whose
    inventory has none, as Ray's node table gives, is claimed by its ports only)."""
    out = [E.ResourceRef(host=p.host, kind="port", id=str(port))
           for p in plan.processes for port in p.bound_ports()]
    out += [E.ResourceRef(host=p.host, kind="gpu", id=uuids[(p.host, d)])
            for p in plan.processes for d in p.devices if uuids.get((p.host, d))]
    return out


def plan_on_hosts(ws: Workspace, point: DeploymentPoint, profile: RuntimeProfile,
                  hosts: Sequence[str], *, ib_devices: Mapping[str, str] | None = None,
                  model: str | None = None, overrides: Mapping[str, Any] | None = None,
                  base_port: int = 30000, tries: int = 8, claim: bool = True,
                  purpose: str = "") -> tuple[LaunchPlan, claims.Claim | None]:
    """The plan on `hosts` and its lease (None with `claim=False`: a printed plan)."""
    devices, uuids = host_devices(ws, point, hosts)
    source = f"Node Registry hosts {', '.join(hosts)}"
    last: claims.ClaimConflict | None = None
    for i in range(max(1, tries) if claim else 1):
        base = base_port + i * BASE_STEP
        if base + BASE_STEP > 65536:
            break
        plan = plan_point(point, profile, devices, model=model, overrides=overrides,
                          base_port=base, device_source=source, ib_devices=ib_devices)
        if not claim:
            return plan, None
        try:
            lease = claims.claim(ws, plan_resources(plan, uuids),
                                 heartbeat_s=CLAIM_HEARTBEAT_S,
                                 purpose=purpose or f"launch plan of {plan.point or 'a point'}")
        except claims.ClaimConflict as e:
            gpus = [r for r in plan_resources(plan, uuids) if r.kind == "gpu"]
            if read_claims(ws.ledger).holding(gpus):  # another base port frees no GPU
                raise HarnessError(f"the plan's GPUs are taken: {e}") from None
            last = e
            continue
        return plan, lease
    raise HarnessError(f"no base port from {base_port} gives a plan whose ports and GPUs are "
                       f"free on every host: {last}")
