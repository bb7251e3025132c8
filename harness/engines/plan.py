"""The launch plan of a deployment point: every process, its command line, port and devices.

`plan_point(point, profile, accelerators, sglang_version, ...)` is pure (no I/O, no clock,
no free-port probing: ports count up from `base_port`) and fast (a 64-GPU PD point plans in
well under 100 ms), so a plan can be shown (`forge engine up --plan`), recorded before
anything starts, diffed and tested flag by flag. `harness/engines/deploy.py` runs it.
`wrap_plan(plan, use)` (pure) is the plan with every process run in a pinned image (the
command lines are image.py's).

Topologies (`point.topology.architecture`):
- colocated: one server per replica (a role's `count` × its data-parallel groups); more than
  one server gets the SGLang router in front (`--worker-urls`), one server is its own entry.
- pd: prefill servers (`--disaggregation-mode prefill`, the transfer backend, each its own
  `--disaggregation-bootstrap-port`) and decode servers, then the router with
  `--pd-disaggregation --prefill URL BOOTSTRAP_PORT … --decode URL …`.
- epd: encoder servers (`--encoder-only`) first, prefill servers that are `--language-only`
  with `--encoder-urls` of every encoder (and, where the version binds one, each its own
  `--encoder-bootstrap-port`: from 0.5.13 every language-only server binds it, default 8997,
  so two on a host would collide), decode servers, the router as for pd. A release
  without these flags (per the flag table: before 0.5.7) is refused before anything else.
Bootstrap ports (disaggregation and encoder) count up from base_port + 1000 on each host.
The router gets `--prometheus-host` (its host) and `--prometheus-port` (the next bootstrap-
range port of its host, `ProcessPlan.metrics_port`): otherwise every real router binds
0.0.0.0:29000 and a second one on the host fails. Its flags are the real router's spellings
(`sglang-router` 0.3.2 and `smg` 1.13 alike; checked against their own `--help` by
tests/harness/engines/test_real_router.py).
Every server flag is checked against the pinned release's parser via the flag table
(`sglang.check_options`): a flag it lacks, or a value outside its choices, is a HarnessError.
Start order: encode, prefill, decode (colocated), router; teardown is the reverse.

Parallelism (a role's own, else the topology's): tp → `--tp-size` (always), pp → `--pp-size`
and ep → `--ep-size` (when > 1). dp: data-parallel groups, each its own server behind the
router — unless the engine config asks for DP attention (`enable_dp_attention` or
`attn_dp_size`), where dp is the attention-DP size inside one server (`--attn-dp-size` where
the pinned release's parser has it, else `--enable-dp-attention --dp-size`: `sglang.translate`
and the flag table, sglang_flags.py) and must divide tp. A
server uses tp × pp devices; the profile config may repeat the point's sizes but never
contradict them (the point's topology is the authority).

Devices: `accelerators` is a list of device indices on this host, or {host: indices} for
several hosts, or None: indices 0..count-1 of the point's accelerator on each of its
`accelerator.nodes` hosts (127.0.0.1 for one; node-0, node-1, ... for more). Servers take
devices in start order, contiguously, never overlapping, a server on the first host with
room; too few is a HarnessError naming what each role needs.
Several hosts: a server larger than every host spans whole untouched hosts of one size
(tp × pp = nnodes × devices per host, else a one-line refusal naming tp x pp): one process
per host (`<role>-<i>`, then `<role>-<i>-node<r>`) with `--nnodes --node-rank
--dist-init-addr HOST0:P` (P from rank 0's dist-init block, base_port + 2000, DIST_SPAN ports
a server); rank 0 is the server's entry, a follower's health URL is its /health (SGLang's
health server for node ranks >= 1); every rank gets rank 0's bootstrap port, only rank 0
binds it. The router goes on the first host and lists each server's rank 0. `ib_devices`
({host: value}) sets `--disaggregation-ib-device` for that host's PD servers. Settings SGLang
would rewrite at start are refused per role by plan_rules.py. NVIDIA sets CUDA_VISIBLE_DEVICES (and
CUDA_DEVICE_ORDER=PCI_BUS_ID, so that an index is the GPU nvidia-smi and NVML call by it:
the host state's GPUs are the deployment's), AMD HIP_VISIBLE_DEVICES; a cpu accelerator
assigns none.

Engine-config keys read here besides the ServerArgs flags (`sglang.HARNESS_KEYS`):
`role_config: {prefill|decode|encode|colocated|router: {...}}` merged over the config for
that role's processes (flags, `env`, `extra_args`); `router_launcher` (argv replacing
`python -m sglang_router.launch_router`), `router_args` (extra router flags);
`disaggregation_transfer_backend` (default mooncake) and `encoder_transfer_backend` (default
zmq_to_scheduler) are ordinary flags the plan always states.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ...ledger.clock import digest
from ...ledger.secrets.names import REDACTED, is_secret_name
from ...ledger.specs import DeploymentPoint, Parallelism, Role, RuntimeProfile
from ..errors import HarnessError
from .base import apply_overrides, engine_config_of
from .image import (
    VISIBILITY_ENV,
    ImageUse,
    container_argv,
    container_name,
    model_mounts,
    uses_rdma,
)
from .plan_rules import check_server
from .sglang import HARNESS_KEYS, check_options, options_to_args, parse_version, server_options
from .sglang_routes import binds_encoder_bootstrap

ProcessRole = Literal["encode", "prefill", "decode", "colocated", "router"]
ROLE_ORDER = ("encode", "prefill", "decode", "colocated")
PLAN_KEYS = {"role_config", "router_launcher", "router_args"}
# Flags the topology sets: a profile that sets them itself would fight the plan.
TOPOLOGY_FLAGS = {"disaggregation_mode", "disaggregation_bootstrap_port", "encoder_only",
                  "language_only", "encoder_urls", "nnodes", "node_rank", "dist_init_addr"}
PARALLEL_FLAGS = {"tp_size": "tp", "pp_size": "pp", "ep_size": "ep"}
DEFAULT_TRANSFER_BACKEND = "mooncake"
DEFAULT_ENCODER_BACKEND = "zmq_to_scheduler"
# Encoder disaggregation: which releases have these is the flag table's (sglang_flags.py).
EPD_KEYS = ("encoder_only", "language_only", "encoder_urls")
BOOTSTRAP_OFFSET = 1000  # bootstrap ports: base_port + 1000 + k on each host
# A server over several hosts: rank 0's host gives `--dist-init-addr HOST:P`; SGLang binds P
# (torch's store) and, with DP attention, P+1..P+6 (ZMQ: server_args.py PortArgs): 8 a block.
DIST_OFFSET = 2000
DIST_SPAN = 8
VISIBLE_DEVICES = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES"}
ROUTER_STARTUP_S = 120.0


class ProcessPlan(BaseModel):
    """One process of a deployment. `argv` is the bare command (a container wrapper wraps
    it); `env` holds only what the plan sets (device visibility, the profile's env)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # "prefill-0", "router"
    role: ProcessRole
    index: int
    host: str
    port: int
    url: str
    health_url: str
    bootstrap_port: int | None = None
    encoder_bootstrap_port: int | None = None  # a language-only server's (EPD, 0.5.13+)
    metrics_port: int | None = None  # the router's Prometheus port (its entry has none)
    devices: tuple[int, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    argv: tuple[str, ...]
    parallelism: dict[str, int] = Field(default_factory=dict)  # tp/pp/dp/ep; router: {}
    startup_timeout_s: float = 900.0
    # A server over several hosts: one process per host, rank 0 the server's HTTP entry
    # (the others answer /health only), all with rank 0's `--dist-init-addr`.
    node_rank: int = 0
    nnodes: int = 1
    dist_init_addr: str | None = None

    @model_serializer(mode="wrap")
    def _omit_single_node(self, handler: Any) -> Any:
        # A one-host process shows (and digests) as before multi-node plans existed.
        data = handler(self)
        if isinstance(data, dict) and self.nnodes == 1:
            for k in ("node_rank", "nnodes", "dist_init_addr"):
                data.pop(k, None)
        return data

    def bound_ports(self) -> list[int]:
        """Every port this process binds on its host (a follower rank binds only its own)."""
        out = [self.port, self.bootstrap_port, self.encoder_bootstrap_port, self.metrics_port]
        if self.dist_init_addr and self.node_rank == 0:
            first = int(self.dist_init_addr.rpartition(":")[2])
            out += range(first, first + DIST_SPAN)
        return [p for p in out if p is not None]

    def command_line(self) -> str:
        """The shell line a reader can copy: env assignments, then the command. The value of
        a secret-named variable (a profile's `env: {HF_TOKEN: ...}`) is never shown."""
        env = [f"{k}={REDACTED if is_secret_name(k) else shlex.quote(v)}"
               for k, v in sorted(self.env.items())]
        return " ".join([*env, shlex.join(self.argv)])


class LaunchPlan(BaseModel):
    """Every process of a point's deployment, in start order (stop in reverse)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    point: str | None
    architecture: Literal["colocated", "pd", "epd"]
    engine: str
    sglang_version: str
    model: str
    accelerator: str  # "nvidia H200 x16"
    device_source: str  # "point" or what the caller says (e.g. "registry host-a")
    devices_available: int
    devices_used: int
    transfer_backend: str | None = None
    processes: tuple[ProcessPlan, ...]
    entry_url: str

    def shown(self) -> dict[str, Any]:
        """The plan as recorded and printed: a secret-named env variable's value masked."""
        data = self.model_dump(mode="json")
        for proc in data["processes"]:
            proc["env"] = {k: REDACTED if is_secret_name(k) else v
                           for k, v in proc["env"].items()}
        return data

    def digest(self) -> str:
        return digest(self.shown())

    def process(self, name: str) -> ProcessPlan:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def by_role(self, role: str) -> list[ProcessPlan]:
        return [p for p in self.processes if p.role == role]

    def hosts(self) -> list[str]:
        """The plan's hosts, in order of first use."""
        return list(dict.fromkeys(p.host for p in self.processes))

    def lines(self) -> list[str]:
        """The human rendering `forge engine up --plan` prints."""
        out = [f"launch plan{f' of {self.point}' if self.point else ''}: "
               f"{self.architecture}, {self.engine} {self.sglang_version}, model {self.model}",
               f"  accelerator {self.accelerator}; devices {self.devices_used} of "
               f"{self.devices_available} ({self.device_source})"
               + (f"; transfer backend {self.transfer_backend}" if self.transfer_backend
                  else ""),
               f"  entry {self.entry_url}"]
        for p in self.processes:
            par = " ".join(f"{k}{v}" for k, v in p.parallelism.items() if v > 1 or k == "tp")
            boot = (f" bootstrap {p.bootstrap_port}" if p.bootstrap_port is not None else "") + (
                f" encoder-bootstrap {p.encoder_bootstrap_port}"
                if p.encoder_bootstrap_port is not None else "") + (
                f" metrics {p.metrics_port}" if p.metrics_port is not None else "")
            devs = (f" devices {','.join(map(str, p.devices))}" if p.devices else "")
            rank = (f" node {p.node_rank}/{p.nnodes} dist-init {p.dist_init_addr}"
                    if p.nnodes > 1 else "")
            out.append(f"  [{p.name}] {p.url}{boot}{devs}{rank}"
                       f"{' ' + par if par else ''} health {p.health_url}")
            out.append(f"    {p.command_line()}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {**self.shown(), "digest": self.digest()}


# --- planning -----------------------------------------------------------------------------


def roles_of(point: DeploymentPoint) -> list[tuple[Role, Parallelism]]:
    """(role, its parallelism) in start order; a role without its own parallelism takes the
    topology's; a colocated topology without roles is one colocated server."""
    topo = point.topology
    roles = list(topo.roles) or [Role(role="colocated", count=1)]
    out = [(r, r.parallelism if "parallelism" in r.model_fields_set else topo.parallelism)
           for r in roles]
    return sorted(out, key=lambda rp: ROLE_ORDER.index(rp[0].role))


def _dp_attention(cfg: Mapping[str, Any]) -> bool:
    return bool(cfg.get("enable_dp_attention") or cfg.get("attn_dp_size"))


def _role_config(base: Mapping[str, Any], role: str) -> dict[str, Any]:
    per = base.get("role_config") or {}
    if not isinstance(per, Mapping):
        raise HarnessError("engine config role_config: expected a mapping of role to config")
    bad = sorted(set(per) - {*ROLE_ORDER, "router"})
    if bad:
        raise HarnessError(f"engine config role_config: unknown role(s) {', '.join(bad)} "
                           f"(roles: {', '.join((*ROLE_ORDER, 'router'))})")
    extra = per.get(role) or {}
    if not isinstance(extra, Mapping):
        raise HarnessError(f"engine config role_config.{role}: expected a mapping")
    cfg = {k: v for k, v in base.items() if k not in PLAN_KEYS}
    for k, v in extra.items():
        if k == "env":
            cfg["env"] = {**(cfg.get("env") or {}), **v}
        elif v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def _parallel_options(cfg: dict[str, Any], par: Parallelism, role: str) -> dict[str, Any]:
    """The config with the point's parallelism as flags; contradictions are refused."""
    attn = _dp_attention(cfg)
    want = {"tp_size": par.tp, "pp_size": par.pp, "ep_size": par.ep}
    for key, dim in PARALLEL_FLAGS.items():
        have = cfg.get(key)
        if have is not None and int(have) != want[key]:
            raise HarnessError(f"profile config {key} {have} contradicts the point's {role} "
                               f"{dim} {want[key]} (the point's topology sets parallelism; "
                               f"drop {key} from the profile)")
    for key in ("dp_size", "attn_dp_size"):
        have = cfg.get(key)
        if have is not None and int(have) != par.dp:
            raise HarnessError(f"profile config {key} {have} contradicts the point's {role} "
                               f"dp {par.dp}")
    out = {k: v for k, v in cfg.items()
           if k not in (*PARALLEL_FLAGS, "dp_size", "attn_dp_size", "enable_dp_attention")}
    out["tp_size"] = par.tp
    if par.pp > 1:
        out["pp_size"] = par.pp
    if par.ep > 1:
        if par.ep > par.tp * par.dp:
            raise HarnessError(f"{role}: ep {par.ep} is larger than tp x dp {par.tp * par.dp}")
        out["ep_size"] = par.ep
    if attn:
        if par.tp % par.dp:
            raise HarnessError(f"{role}: DP attention needs dp {par.dp} to divide tp {par.tp}")
        # One spelling here; translate() passes --attn-dp-size N instead to the releases
        # whose parser has it (0.5.22+, per the flag table).
        out["enable_dp_attention"] = True
        out["dp_size"] = par.dp
    return out


def _check_topology_keys(cfg: Mapping[str, Any], role: str) -> None:
    bad = sorted(TOPOLOGY_FLAGS & set(cfg))
    if bad:
        raise HarnessError(f"engine config ({role}): {', '.join(bad)} is set by the point's "
                           "topology, not the profile")


def _device_pools(point: DeploymentPoint, accelerators: Any
                  ) -> tuple[list[tuple[str, list[int]]], int]:
    acc = point.accelerator
    if accelerators is None:
        names = ["127.0.0.1"] if acc.nodes == 1 else [f"node-{i}" for i in range(acc.nodes)]
        return [(h, list(range(acc.count))) for h in names], acc.count * acc.nodes
    if isinstance(accelerators, Mapping):
        pools = [(str(h), [int(d) for d in ds]) for h, ds in accelerators.items()]
    else:
        pools = [("127.0.0.1", [int(d) for d in accelerators])]
    for host, ds in pools:
        if len(set(ds)) != len(ds):
            raise HarnessError(f"accelerators of {host}: device indices repeat ({ds})")
    return pools, sum(len(ds) for _, ds in pools)


class _Ports:
    def __init__(self, base: int):
        self.base = base
        self.next: dict[str, int] = {}
        self.boot: dict[str, int] = {}
        self.dists: dict[str, int] = {}

    def port(self, host: str) -> int:
        p = self.next.get(host, self.base)
        self.next[host] = p + 1
        return p

    def bootstrap(self, host: str) -> int:
        p = self.boot.get(host, self.base + BOOTSTRAP_OFFSET)
        self.boot[host] = p + 1
        return p

    def dist(self, host: str) -> int:
        p = self.dists.get(host, self.base + DIST_OFFSET)
        self.dists[host] = p + DIST_SPAN
        return p


def _place(free: list[tuple[str, list[int]]], pools: list[tuple[str, list[int]]], n: int,
           role: str, par: Parallelism) -> list[tuple[str, tuple[int, ...]]]:
    """(host, devices) per node rank of one server needing `n` devices; takes them from
    `free`. One host with room, else whole untouched hosts of one size that `n` fills."""
    for i, (h, ds) in enumerate(free):
        if len(ds) >= n:
            free[i] = (h, ds[n:])
            return [(h, tuple(ds[:n]))]
    size = max((len(ds) for _, ds in pools), default=0)
    what = f"a {role} server needs tp {par.tp} x pp {par.pp} = {n} devices"
    if n <= size:
        raise HarnessError(f"launch plan: no host has {n} free devices left for a {role} "
                           "server (a server spans hosts only when no host could hold it)")
    if n % size:
        raise HarnessError(f"launch plan: {what}, more than a host's {size}; across hosts "
                           f"tp x pp must be nnodes x {size} devices per host")
    k = n // size
    whole = [i for i, (h, ds) in enumerate(free) if len(ds) == size
             and len(ds) == len(dict(pools)[h])]
    if len(whole) < k:
        raise HarnessError(f"launch plan: {what}: {k} whole hosts of {size} devices "
                           f"(nnodes {k}), {len(whole)} left")
    out = []
    for i in whole[:k]:
        h, ds = free[i]
        free[i] = (h, [])
        out.append((h, tuple(ds)))
    return out


def plan_point(point: DeploymentPoint, profile: RuntimeProfile,
               accelerators: Sequence[int] | Mapping[str, Sequence[int]] | None,
               sglang_version: str | None = None, *, model: str | None = None,
               overrides: Mapping[str, Any] | None = None, base_port: int = 30000,
               device_source: str | None = None,
               ib_devices: Mapping[str, str] | None = None) -> LaunchPlan:
    """The launch plan of `point` served by `profile` (pure; see the module docstring).

    `sglang_version`: the version whose flag names to use (None: the profile's framework
    pin, else its config `version`). `model`: the path or hub id servers load (default: the
    point's model source). `overrides`: engine config keys, as `apply_overrides` takes them.
    `base_port`: the entry's port; servers count up from it, bootstrap ports from +1000,
    dist-init blocks from +2000. `ib_devices`: {host: `--disaggregation-ib-device` value}
    for the PD servers on that host (the KV transfer's InfiniBand devices)."""
    engine, base_cfg = engine_config_of(profile)
    if engine != "sglang":
        raise HarnessError(f"launch plan: runtime profile {profile.service} rev {profile.rev} "
                           f"runs engine {engine}; topologies are planned for sglang")
    base_cfg = apply_overrides(base_cfg, overrides)
    version = str(sglang_version or base_cfg.get("version") or "")
    if not version:
        raise HarnessError(f"launch plan: no SGLang version (profile {profile.service} pins "
                           "no framework version and no version was given)")
    parse_version(version)
    arch = point.topology.architecture
    if arch == "epd":  # refused before any placement: sglang X has no --encoder-only (...)
        check_options(dict.fromkeys(EPD_KEYS, True), version)
    model_s = model or point.model.source or point.model.name
    pools, available = _device_pools(point, accelerators)
    vendor = point.accelerator.vendor
    visible = VISIBLE_DEVICES.get(vendor)
    ports = _Ports(base_port)
    entry_host = pools[0][0] if pools else "127.0.0.1"
    router_port = ports.port(entry_host)

    # Which servers, with which config and device need, in start order.
    servers: list[tuple[str, int, Parallelism, dict[str, Any]]] = []
    for role, par in roles_of(point):
        cfg = _role_config(base_cfg, role.role)
        _check_topology_keys(cfg, role.role)
        check_server(cfg, par, role.role, point.model.experts)
        opts_cfg = _parallel_options(cfg, par, role.role)
        replicas = role.count * (1 if _dp_attention(cfg) else par.dp)
        for _ in range(replicas):
            servers.append((role.role, par.tp * par.pp, par, opts_cfg))

    need = sum(n for _, n, _, _ in servers) if visible else 0
    if visible and need > available:
        per: dict[str, int] = {}
        for r, n, _, _ in servers:
            per[r] = per.get(r, 0) + n
        dp_servers = [f"; {r} dp {p.dp} without DP attention is {p.dp} servers of "
                      f"{n} devices" for r, n, p, c in servers
                      if p.dp > 1 and not c.get("enable_dp_attention")]
        raise HarnessError(
            f"launch plan: the point needs {need} devices "
            f"({', '.join(f'{r} {n}' for r, n in per.items())}) but {available} are available "
            f"({device_source or 'point'})" + (dp_servers[0] if dp_servers else ""))

    # Devices: contiguous, in start order, a server on the first host with room; a server
    # larger than any host spans whole hosts (one process per host, --nnodes/--node-rank).
    free = [(h, list(ds)) for h, ds in pools] or [("127.0.0.1", [])]
    counters: dict[str, int] = {}
    placed: list[tuple[str, int, list[tuple[str, tuple[int, ...]]], Parallelism,
                       dict[str, Any]]] = []
    for role_name, n, par, opts_cfg in servers:
        ranks: list[tuple[str, tuple[int, ...]]] = [(free[0][0], ())]
        if visible:
            ranks = _place(free, pools, n, role_name, par)
        idx = counters.get(role_name, 0)
        counters[role_name] = idx + 1
        placed.append((role_name, idx, ranks, par, opts_cfg))

    # Ports and URLs first: prefill servers need the encoders', the router everyone's.
    # Per rank: (host, port, url); per server: bootstrap, encoder bootstrap, dist-init addr
    # (all on rank 0's host: the followers are given rank 0's values).
    addr: list[tuple[list[tuple[str, int, str]], int | None, int | None, str | None]] = []
    enc_boot = arch == "epd" and binds_encoder_bootstrap(version)
    for role_name, _idx, ranks, _par, _cfg in placed:
        host0 = ranks[0][0]
        where = [(h, p, f"http://{h}:{p}") for h, p in ((h, ports.port(h)) for h, _ in ranks)]
        boot = ports.bootstrap(host0) if role_name == "prefill" and arch != "colocated" \
            else None
        eboot = ports.bootstrap(host0) if role_name == "prefill" and enc_boot else None
        dist = f"{host0}:{ports.dist(host0)}" if len(ranks) > 1 else None
        addr.append((where, boot, eboot, dist))
    encoder_urls = [where[0][2] for (r, *_), (where, *_) in zip(placed, addr, strict=True)
                    if r == "encode"]
    hosts = {h for h, _ in pools}
    bad_ib = sorted(set(ib_devices or {}) - hosts)
    if bad_ib:
        raise HarnessError(f"ib devices: host {bad_ib[0]} is not one of the plan's hosts "
                           f"({', '.join(h for h, _ in pools)})")

    transfer = str(base_cfg.get("disaggregation_transfer_backend") or DEFAULT_TRANSFER_BACKEND)
    processes: list[ProcessPlan] = []
    used: set[tuple[str, int]] = set()
    for (role_name, idx, ranks, par, opts_cfg), (where, boot, eboot, dist) in zip(
            placed, addr, strict=True):
        cfg = dict(opts_cfg)
        if arch != "colocated" and role_name in ("prefill", "decode"):
            cfg["disaggregation_mode"] = role_name
            cfg["disaggregation_transfer_backend"] = cfg.get(
                "disaggregation_transfer_backend") or transfer
            if boot is not None:
                cfg["disaggregation_bootstrap_port"] = boot
        if role_name == "encode":
            cfg["encoder_only"] = True
            cfg.setdefault("encoder_transfer_backend", DEFAULT_ENCODER_BACKEND)
            cfg.pop("disaggregation_transfer_backend", None)
        if arch == "epd" and role_name == "prefill":
            cfg["language_only"] = True
            cfg["encoder_urls"] = list(encoder_urls)
            cfg.setdefault("encoder_transfer_backend", DEFAULT_ENCODER_BACKEND)
            if eboot is not None:
                cfg["encoder_bootstrap_port"] = eboot
        if role_name != "encode" and not (arch == "epd" and role_name == "prefill"):
            cfg.pop("encoder_transfer_backend", None)  # only encoders and their readers
        for rank, ((host, devs), (_, port, url)) in enumerate(zip(ranks, where, strict=True)):
            rcfg = dict(cfg)
            if dist is not None:
                rcfg.update(nnodes=len(ranks), node_rank=rank, dist_init_addr=dist)
            if ib_devices and host in ib_devices and "disaggregation_mode" in rcfg:
                rcfg["disaggregation_ib_device"] = ib_devices[host]
            argv = _server_argv(rcfg, model=model_s, host=host, port=port, version=version)
            env = {str(k): str(v) for k, v in (rcfg.get("env") or {}).items()}
            if visible:
                for d in devs:
                    if (host, d) in used:  # by construction never; a plan must not overlap
                        raise HarnessError(f"launch plan: device {d} on {host} assigned "
                                           "twice")
                    used.add((host, d))
                env[visible] = ",".join(map(str, devs))
                if vendor == "nvidia":  # indices as nvidia-smi and NVML number them
                    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            # A follower rank answers /health only (SGLang's dummy health server).
            health = "/health_generate" if arch == "colocated" and rank == 0 else "/health"
            processes.append(ProcessPlan(
                name=f"{role_name}-{idx}" + (f"-node{rank}" if rank else ""), role=role_name,
                index=idx, host=host, port=port, url=url, health_url=url + health,
                bootstrap_port=boot if rank == 0 else None,
                encoder_bootstrap_port=eboot if rank == 0 else None, devices=devs, env=env,
                argv=tuple(argv),
                parallelism={"tp": par.tp, "pp": par.pp, "dp": par.dp, "ep": par.ep},
                startup_timeout_s=float(rcfg.get("startup_timeout_s", 900)),
                node_rank=rank, nnodes=len(ranks), dist_init_addr=dist))

    entry = f"http://{entry_host}:{router_port}"
    if arch != "colocated" or sum(p.node_rank == 0 for p in processes) > 1:
        processes.append(_router(base_cfg, processes, arch, entry_host, router_port, entry,
                                 ports.bootstrap(entry_host)))
    else:
        entry = processes[0].url
    return LaunchPlan(
        point=point.name, architecture=arch, engine=engine, sglang_version=version,
        model=model_s,
        accelerator=f"{vendor} {point.accelerator.model} x{point.accelerator.count}"
                    + (f" on {point.accelerator.nodes} hosts" if point.accelerator.nodes > 1
                       else "")
                    + (f" {point.accelerator.memory_gb:g} GB" if point.accelerator.memory_gb
                       else ""),
        device_source=device_source or ("point" if accelerators is None else "given"),
        devices_available=available, devices_used=len(used),
        transfer_backend=transfer if arch != "colocated" else None,
        processes=tuple(processes), entry_url=entry)


def _server_argv(cfg: Mapping[str, Any], *, model: str, host: str, port: int,
                 version: str) -> list[str]:
    opts = server_options(cfg, version)
    launcher = cfg.get("launcher") or [cfg.get("python") or sys.executable, "-m",
                                       "sglang.launch_server"]
    if isinstance(launcher, str) or not all(isinstance(x, str) for x in launcher):
        raise HarnessError("sglang config: launcher must be a list of strings")
    extra = cfg.get("extra_args") or []
    if isinstance(extra, str) or not all(isinstance(x, str) for x in extra):
        raise HarnessError("sglang config: extra_args must be a list of strings")
    return [*launcher, "--model-path", model, "--host", host, "--port", str(port),
            *options_to_args(opts), *extra]


def _router(base_cfg: Mapping[str, Any], servers: list[ProcessPlan], arch: str, host: str,
            port: int, url: str, metrics_port: int) -> ProcessPlan:
    rcfg = _role_config(base_cfg, "router")
    launcher = base_cfg.get("router_launcher") or [
        base_cfg.get("python") or sys.executable, "-m", "sglang_router.launch_router"]
    extra = base_cfg.get("router_args") or []
    for name, v in (("router_launcher", launcher), ("router_args", extra)):
        if isinstance(v, str) or not all(isinstance(x, str) for x in v):
            raise HarnessError(f"engine config {name}: expected a list of strings")
    argv = [*launcher]
    servers = [p for p in servers if p.node_rank == 0]  # a server's entry is its rank 0
    if arch == "colocated":
        argv += ["--worker-urls", *(p.url for p in servers)]
    else:
        argv.append("--pd-disaggregation")
        for p in servers:
            if p.role == "prefill":
                argv += ["--prefill", p.url, str(p.bootstrap_port)]
        for p in servers:
            if p.role == "decode":
                argv += ["--decode", p.url]
    argv += ["--host", host, "--port", str(port), "--prometheus-host", host,
             "--prometheus-port", str(metrics_port), *extra]
    env = {str(k): str(v) for k, v in (rcfg.get("env") or {}).items()}
    return ProcessPlan(name="router", role="router", index=0, host=host, port=port, url=url,
                       health_url=url + "/health", metrics_port=metrics_port, env=env,
                       argv=tuple(argv),
                       startup_timeout_s=float(rcfg.get("router_startup_timeout_s",
                                                        ROUTER_STARTUP_S)))


def plan_json(plan: LaunchPlan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=True)


__all__ = ["HARNESS_KEYS", "LaunchPlan", "ProcessPlan", "plan_point", "roles_of"]


def wrap_plan(plan: LaunchPlan, use: ImageUse, *, host_python: str = sys.executable,
              vendor: str = "nvidia") -> LaunchPlan:
    """The plan with every process run in the image (pure; `forge engine up --plan` shows
    it). GPUs by the plan's devices; the router (no devices) gets none; a server given
    InfiniBand devices gets them (image.uses_rdma)."""
    procs = []
    mounts = model_mounts(plan.model)
    for p in plan.processes:
        devices: tuple[int, ...] | None = p.devices if p.devices or p.role == "router" \
            else None
        argv = container_argv(use, p.argv, name=container_name(p.name, p.port), vendor=vendor,
                              devices=devices, env_names=p.env, mounts=mounts,
                              host_python=host_python, rdma=uses_rdma(p.argv))
        env = {k: v for k, v in p.env.items() if k not in VISIBILITY_ENV}
        procs.append(p.model_copy(update={"argv": tuple(argv), "env": env}))
    return plan.model_copy(update={"processes": tuple(procs)})
