"""Launching a multi-node plan through Ray: one actor per host, the one-host lifecycle.

`RayDeployment(plan, nodes, ...)` is a `Deployment` (deploy.py) whose processes run on the
plan's hosts instead of this one; everything else is the one-host lifecycle unchanged: the
plan recorded (`LaunchPlanned`) before anything starts, each server's health URL polled from
here while every started process is watched (one that dies fails the deploy at once, named),
each server's `/server_info` checked against its role, the router started last and its
`/workers` view checked to list every planned server, `EngineLaunched`/`EngineStopped` per
process, teardown in reverse start order.

Placement: `nodes` maps each plan host to a Ray node id (`ray_nodes(hosts)` finds them: the
node offering the custom resource `host:<name>`, else the node whose hostname or address is
the host). Each host gets one `HostAgent` actor pinned to its node (a hard
`NodeAffinitySchedulingStrategy`, 0 CPUs, as many GPUs as the plan uses there: Ray then
schedules no other GPU work, a graph node's task for one, on them; the ids Ray gives it must
be the plan's, else the start is refused naming both), which starts that host's processes as
`process.ServerProcess`es (own process group, log on that host) and answers liveness, exit
codes, log tails and stops for them. No remote shell: Ray is the only way in. With the
profile's `check_flags`, each host's launcher answers `--help` through its agent (once per
host and launcher) and every server's flags are checked against its own host's. On stop each
process's log comes back through its agent (its last 16 MiB) into the local logs directory
and, with a workspace, into the artifact store, redacted: `EngineStopped.log_digest` names
it as for a local server.

No orphans: the agents are ordinary (not detached) actors, so Ray ends them when the driver
dies (a crash, SIGKILL, Ctrl-C). Ray then kills the worker and its direct children (the
process group leaders), which leaves a server's other processes (SGLang's scheduler and
detokenizer) behind; so each agent has a keeper (forked off into its own session, not the
worker's child, so Ray's kill misses it) reading a pipe from the agent with the process
groups still running: when the agent dies, however, the pipe closes and the keeper kills
those groups. An agent gone (`AgentGone`) reads as its processes killed (-9): `check()`
names the process and host, and its teardown has nothing left to do. `stop()` stops the
processes in reverse order, then every agent's leftovers, then kills the agents.

`ray_point_up` is `forge engine up --point P --hosts A,B --ray ADDRESS`: join the cluster,
register its nodes in the Node Registry (`register_nodes`: under their `host:` names), plan
on the hosts with ports (and GPUs with a UUID) claimed, run a `RayPinnedDeployment` (the
servers checked against the runtime profile, whole.py) with the lease heartbeated, release
it after. A profile with an image (`pin_on_hosts`): on every host a Ray task pulls it by
digest where missing, checks the digest and removes containers a dead forge left there;
each host's processes are wrapped for the runtime found on that host; the agent labels each
container with itself as owner, and the containers are removed through the agents at the end.

Ray is optional (`pip install 'infer-forge[ray]'`): importing this module does not import it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from ...ledger.specs import RESOLVE_DIGEST, DeploymentPoint, RuntimeProfile
from ...ledger.workspace import Workspace
from ...projections.images import resolved_image
from ..errors import HarnessError
from ..nodes import claims
from ..nodes.ray_table import ray_inventory
from ..nodes.registry import register_host
from .cluster_plan import CLAIM_HEARTBEAT_S, plan_on_hosts
from .deploy import Deployment
from .image import (
    PULL_TIMEOUT_S,
    ContainerRuntime,
    ImageUse,
    RuntimeKind,
    clear_stale_container,
    container_name,
    ensure_image,
    image_ref,
    image_use_of,
    name_of,
    owned,
    profile_label,
    pull_digest,
    remove_container,
    with_trace_mount,
)
from .image_resolve import record_resolution
from .plan import LaunchPlan, ProcessPlan, wrap_plan
from .process import ServerProcess, tail
from .sglang import server_help
from .trace_dir import trace_root
from .up import watch
from .whole import PinnedDeployment

HOST_RESOURCE = "host:"  # a node offering {"host:<name>": 1} is that plan host
AGENT_START_TIMEOUT_S = 120.0
AGENT_STOP_TIMEOUT_S = 10.0
AGENT_HELP_TIMEOUT_S = 330.0  # a launcher's --help is given 300 s on its host (sglang.py)
REMOTE_LOG_CAP = 16 * 2**20  # bytes of a host's log brought back on stop (its end)
# The agent's keeper (its own session): reads "PGID" (held) and "-PGID" (stopped) lines;
# when the agent's end of the pipe closes, for any reason, kills every group still held.
KEEPER = """
import os, signal, sys
if os.fork():  # not the worker's child: Ray kills a dead worker's children too
    os._exit(0)
held = set()
for line in sys.stdin:
    g = int(line)
    held.add(g) if g > 0 else held.discard(-g)
for g in held:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise HarnessError("Ray is not installed: pip install 'infer-forge[ray]'") from None
    return ray


def connect(address: str) -> None:
    """This process as a driver of the Ray cluster at `address` (once)."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    except Exception as e:  # ConnectionError, RuntimeError, ...: one line for the CLI
        raise HarnessError(f"--ray {address}: cannot join the Ray cluster: {e}") from None


def match_nodes(hosts: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """{plan host: Ray node id} from Ray's node table (pure): the alive node offering the
    resource `host:<host>`, else the one whose hostname or address is the host. A host
    matched by no node, or by two, is refused naming it."""
    alive = [r for r in rows if r.get("Alive", True)]
    out: dict[str, str] = {}
    for h in hosts:
        by_res = [r for r in alive if f"{HOST_RESOURCE}{h}" in (r.get("Resources") or {})]
        found = by_res or [r for r in alive
                           if h in (r.get("NodeManagerHostname"), r.get("NodeManagerAddress"))]
        if len(found) != 1:
            seen = ", ".join(f"{r.get('NodeManagerHostname')}/{r.get('NodeManagerAddress')}"
                             for r in alive) or "none"
            how = "no Ray node" if not found else f"{len(found)} Ray nodes"
            raise HarnessError(f"host {h}: {how} offers resource {HOST_RESOURCE}{h} or has "
                               f"that hostname or address (alive nodes: {seen})")
        out[h] = str(found[0]["NodeID"])
    return out


def ray_nodes(hosts: Sequence[str]) -> dict[str, str]:
    """{plan host: node id} in the connected cluster (`match_nodes` on `ray.nodes()`)."""
    return match_nodes(hosts, _ray().nodes())


class HostAgent:
    """Runs on one host (a Ray actor): that host's processes of the plan."""

    def __init__(self, host: str, logs: str, grace_s: float = 10.0):
        self.host = host
        self.logs = Path(logs)
        self.grace_s = grace_s
        self.servers: dict[str, ServerProcess] = {}
        self._lock = threading.Lock()
        # The keeper outlives this worker however it ends (Ray kills an orphaned actor's
        # worker without running its cleanup) and then kills every group still held.
        self.keeper = subprocess.Popen([sys.executable, "-c", KEEPER], stdin=subprocess.PIPE,
                                       start_new_session=True)
        self.keeper.wait()  # its fork keeps the pipe

    def where(self) -> dict[str, Any]:
        """Its node, pid, and the GPUs Ray reserved for it (ids on its node)."""
        ray = _ray()
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "gpu_ids": [int(g) for g in ray.get_gpu_ids()]}

    def start(self, p: ProcessPlan) -> dict[str, Any]:
        # A container's owner is this agent (host, pid, start): after the agent's death the
        # next launch on this host finds the owner gone and removes what was left.
        argv = owned(p.argv) if name_of(p.argv) is not None else list(p.argv)
        server = ServerProcess(
            argv, health_url=p.health_url, name=f"{p.name} on {self.host}", env=p.env,
            log_path=self.logs / f"{p.name}-{p.port}-{os.getpid()}.log",
            startup_timeout_s=p.startup_timeout_s, grace_s=self.grace_s)
        with self._lock:
            self.servers[p.name] = server
            server.start()
            assert server.pid is not None
            self._keep(server.pid, True)
        return {"pid": server.pid, "log": str(server.log_path)}

    def poll(self, name: str) -> int | None:
        """None while running, else its exit code."""
        proc = self.servers[name].proc
        return proc.poll() if proc is not None else None

    def tail(self, name: str) -> str:
        return tail(self.servers[name].log_path)

    def help(self, argv: list[str]) -> str:
        """The launcher's `--help` as this host has it (deploy.py's flag check)."""
        return server_help(argv)

    def remove_containers(self, runtime: tuple[str, str], names: list[str]) -> None:
        """`rm -f` each container (best effort) with this host's runtime (kind, exe)."""
        use = ImageUse(ContainerRuntime(cast(RuntimeKind, runtime[0]), runtime[1]), "", "", "")
        for name in names:
            remove_container(use, name)

    def log_bytes(self, name: str, cap: int) -> bytes:
        """The process's log as written on this host (its last `cap` bytes, after a line
        saying how much was left out when longer)."""
        path = self.servers[name].log_path
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= cap:
                return f.read()
            f.seek(size - cap)
            return (f"[forge] the first {size - cap} bytes of this log were left on host "
                    f"{self.host} ({path})\n").encode() + f.read()

    def stop(self, name: str, reason: str) -> int | None:
        s = self.servers[name]
        code = s.stop(reason=reason)
        if s.pid is not None:
            self._keep(s.pid, False)
        return code

    def stop_all(self, reason: str = "agent-exit") -> None:
        with self._lock:
            for s in reversed(list(self.servers.values())):
                with contextlib.suppress(Exception):
                    s.stop(reason=reason)
                if s.pid is not None:
                    self._keep(s.pid, False)

    def _keep(self, pgid: int, held: bool) -> None:
        pipe = self.keeper.stdin
        assert pipe is not None
        with contextlib.suppress(OSError):  # a keeper gone has already killed them
            pipe.write(f"{'' if held else '-'}{pgid}\n".encode())
            pipe.flush()


def _wait_dead(agent: Any, seconds: float = AGENT_STOP_TIMEOUT_S) -> None:
    """Return once Ray reports the killed `agent` dead (a call to it fails), or after
    `seconds`: `ray.kill` only asks, and a launch right after would share the nodes with
    agents still ending."""
    ray = _ray()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(agent.where.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            return
        time.sleep(0.05)  # poll interval of a wait loop, not a synchronization


def _get_on(host: str, ref: Any, timeout: float) -> Any:
    """`ray.get` of what runs on `host`; its failure one line naming the host (a RayTaskError
    wraps the host's own HarnessError: that one's text)."""
    try:
        return _ray().get(ref, timeout=timeout)
    except Exception as e:
        cause = getattr(e, "cause", None)
        raise HarnessError(f"host {host}: {cause if cause is not None else e}") from None


def _ids(ids: Iterable[int]) -> str:
    return ",".join(map(str, ids)) or "none"


class AgentGone(HarnessError):
    """A host's agent died (its worker killed, its node lost)."""


class RemoteProcess:
    """The driver's handle of one process an agent runs: what `Deployment` asks of a
    `ServerProcess` (pid, alive, poll, stop, startup_s, log_path, log_digest)."""

    def __init__(self, agent: Any, p: ProcessPlan, node_id: str, logs: Path,
                 artifacts: Any = None):
        self.agent = agent
        self.plan = p
        self.node_id = node_id
        self.logs = logs
        self.artifacts = artifacts
        self.log_path = logs / f"{p.name}-{p.port}.log"  # on its host; the agent's, once started
        self.pid: int | None = None
        self.proc: RemoteProcess | None = None
        self.startup_s: float | None = None
        self.exit_code: int | None = None
        self.log_digest: str | None = None

    def start(self) -> RemoteProcess:
        started = self._call("start", self.plan)
        self.pid, self.log_path = int(started["pid"]), Path(started["log"])
        self.proc = self
        return self

    def _call(self, method: str, *args: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(getattr(self.agent, method).remote(*args))
        except ray.exceptions.RayActorError as e:
            raise AgentGone(f"{self.plan.name} on host {self.plan.host}: its Ray agent is "
                            f"gone ({type(e).__name__}); its keeper kills what it ran") from None

    def poll(self) -> int | None:
        """None while running, else its exit code (an agent gone: SIGKILL's, -9)."""
        if self.proc is None:
            return None
        try:
            code = self._call("poll", self.plan.name)
        except AgentGone:
            code = -9
        if code is not None:
            self.exit_code = code
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.poll() is None

    def tail(self) -> str:
        with contextlib.suppress(Exception):
            return str(_ray().get(self.agent.tail.remote(self.plan.name), timeout=10))
        return "(no log: its host's agent did not answer)"

    def stop(self, reason: str = "teardown") -> int | None:
        if self.proc is None:
            return None
        try:
            code = self._call("stop", self.plan.name, reason)
        except AgentGone:  # nothing left to stop there (the keeper's work)
            code = -9
        self.exit_code = code if self.exit_code is None else self.exit_code
        self._fetch_log()
        return self.exit_code

    def _fetch_log(self) -> None:
        """The host's log brought here (next to the local logs, `<name>-<port>-<host>.log`)
        and, with an artifact store, stored as the process's `log_digest`, redacted as a
        local server's log is. An agent gone leaves no log to fetch: the digest stays None."""
        if self.log_digest is not None:
            return
        try:
            data = _ray().get(self.agent.log_bytes.remote(self.plan.name, REMOTE_LOG_CAP),
                              timeout=60)
        except Exception:  # the agent or its host gone: nothing to bring back
            return
        self.logs.mkdir(parents=True, exist_ok=True)
        local = self.logs / f"{self.plan.name}-{self.plan.port}-{self.plan.host}.log"
        local.write_bytes(data)
        self.log_path = local
        if self.artifacts is not None:
            red = getattr(self.artifacts, "redactor", None)
            red = red.for_env(self.plan.env) if red is not None and self.plan.env else None
            self.log_digest = self.artifacts.put_file(local, redactor=red)


class RayDeployment(Deployment):
    """A multi-node plan run through Ray (see the module docstring)."""

    LOCAL_ONLY = False

    def __init__(self, plan: LaunchPlan, nodes: Mapping[str, str], **kwargs: Any):
        missing = [h for h in plan.hosts() if h not in nodes]
        if missing:
            raise HarnessError(f"host {missing[0]} of the plan has no Ray node")
        super().__init__(plan, **kwargs)
        self.nodes = dict(nodes)
        self.agents: dict[str, Any] = {}
        self.agent_info: dict[str, dict[str, Any]] = {}

    def _agent(self, host: str) -> Any:
        if host in self.agents:
            return self.agents[host]
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        devices = self.host_devices(host)
        actor = ray.remote(num_cpus=0, num_gpus=len(devices), max_restarts=0)(HostAgent).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.nodes[host], soft=False),
            name=None)
        agent = actor.remote(host, str(self.logs), self.grace_s)
        self.agents[host] = agent
        try:
            info = ray.get(agent.where.remote(), timeout=AGENT_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            held = f"; it asks for {len(devices)} GPUs: is other Ray work holding them?" \
                if devices else ""
            raise HarnessError(f"host {host}: its agent did not start on Ray node "
                               f"{self.nodes[host]} within {AGENT_START_TIMEOUT_S:.0f} s"
                               f"{held}") from None
        except Exception as e:
            raise HarnessError(f"host {host}: its agent did not start on Ray node "
                               f"{self.nodes[host]}: {e}") from None
        self.agent_info[host] = info
        if info["node_id"] != self.nodes[host]:  # the hard affinity makes this impossible
            raise HarnessError(f"host {host}: agent placed on node {info['node_id']}, "
                               f"not {self.nodes[host]}")
        if devices and sorted(info["gpu_ids"]) != devices:
            raise HarnessError(
                f"host {host}: Ray gave its agent GPUs {_ids(info['gpu_ids'])}, the plan uses "
                f"{_ids(devices)} (other Ray work holds some of the plan's GPUs: stop it, or "
                "plan on the GPUs Ray has free)")
        return agent

    def _prepare(self) -> None:
        """Every host's agent up (and its GPUs held) before any process starts: a host Ray
        cannot serve refuses the deployment with nothing started."""
        for host in self.plan.hosts():
            self._agent(host)

    def host_devices(self, host: str) -> list[int]:
        """The GPUs the plan's processes on `host` use: what its agent reserves in Ray."""
        return sorted({d for p in self.plan.processes if p.host == host for d in p.devices})

    def _help_key(self, p: ProcessPlan) -> tuple[str, ...]:
        return (p.host, *super()._help_key(p))  # each host has its own install

    def _launcher_help(self, p: ProcessPlan) -> str:
        """The `--help` of `p`'s launcher on `p`'s host, through its agent."""
        return str(_get_on(p.host, self._agent(p.host).help.remote(list(p.argv)),
                           AGENT_HELP_TIMEOUT_S))

    def _spawn(self, p: ProcessPlan) -> None:
        agent = self._agent(p.host)
        server = RemoteProcess(agent, p, self.nodes[p.host], self.logs,
                               artifacts=self.ws.artifacts if self.ws is not None else None)
        self.servers[p.name] = server  # type: ignore[assignment]
        self.started.append(p)
        server.start()

    def _died(self, p: ProcessPlan, when: str) -> HarnessError:
        s = self.servers[p.name]
        code = s.poll() if isinstance(s, RemoteProcess) else None
        how = f"killed by signal {-code}" if code is not None and code < 0 else \
            f"exit code {code}"
        log = s.tail() if isinstance(s, RemoteProcess) else ""
        return HarnessError(f"{p.name} ({p.role}) on host {p.host} exited {when} ({how}); "
                            f"last lines of its log:\n{log}")

    def stop(self, reason: str = "teardown") -> None:
        try:
            super().stop(reason)
        finally:
            self._end_agents(reason)

    def _end_agents(self, reason: str) -> None:
        """Each agent stops what it still runs, then is killed (and seen dead)."""
        ray = _ray()
        for host in reversed(list(self.agents)):
            agent = self.agents.pop(host)
            with contextlib.suppress(Exception):
                ray.get(agent.stop_all.remote(reason), timeout=60)
            with contextlib.suppress(Exception):
                ray.kill(agent)
                _wait_dead(agent)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        for row in info["processes"]:
            host = self.plan.process(row["name"]).host
            row["host"] = host
            row["ray_node"] = self.nodes[host]
        info["ray_nodes"] = dict(self.nodes)
        return info


def ray_deploy(plan: LaunchPlan, address: str, *, nodes: Mapping[str, str] | None = None,
               **kwargs: Any) -> RayDeployment:
    """Join the cluster at `address`, map the plan's hosts to its nodes (unless given), and
    start the plan; ready when returned (stop it, or use it as a context manager)."""
    connect(address)
    dep = RayDeployment(plan, nodes or ray_nodes(plan.hosts()), **kwargs)
    dep.start()
    return dep


def node_host(row: Mapping[str, Any]) -> str | None:
    """The plan host a Ray node says it is (its `host:<name>` resource), or None."""
    names = [k[len(HOST_RESOURCE):] for k in (row.get("Resources") or {})
             if k.startswith(HOST_RESOURCE)]
    return names[0] if len(names) == 1 else None


def register_nodes(ws: Workspace, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Ray's alive nodes into the Node Registry (nodes/ray_table.py's inventory), each
    under its `host:<name>` resource's name where it offers one, else its hostname."""
    out = []
    for row in rows:
        if not row.get("Alive"):
            continue
        host, inv = ray_inventory(dict(row))
        host = node_host(row) or host
        register_host(ws, host, inv)
        out.append(host)
    return out


class RayPinnedDeployment(PinnedDeployment, RayDeployment):
    """A plan through Ray whose servers are checked against the runtime profile (whole.py:
    version and resolved arguments), as `forge engine up --point` does on one host. In the
    profile's image: `runtimes` ({host: (kind, exe)}, from `pin_on_hosts`) says which
    container runtime runs each host's containers; they are removed there, through the
    host's agent, before the agents end."""

    def __init__(self, *args: Any, runtimes: Mapping[str, tuple[str, str]] | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.runtimes = dict(runtimes or {})

    def _spawn(self, p: ProcessPlan) -> None:
        # The trace root as on one host; the owner label is the agent's (HostAgent.start).
        if self.use is not None and name_of(p.argv) is not None and self.ws is not None \
                and p.role != "router":
            p = p.model_copy(update={"argv": tuple(
                with_trace_mount(p.argv, self.use.target, trace_root(self.ws.home)))})
        RayDeployment._spawn(self, p)

    def stop(self, reason: str = "teardown") -> None:
        # Not PinnedDeployment.stop: its containers are on the hosts, removed by the agents
        # while they live; then the agents end.
        try:
            Deployment.stop(self, reason)
        finally:
            try:
                for host in reversed(list(self.agents)):
                    names = [n for p in self.started if p.host == host
                             and (n := name_of(p.argv)) is not None]
                    if names and host in self.runtimes:
                        with contextlib.suppress(Exception):
                            _ray().get(self.agents[host].remove_containers.remote(
                                self.runtimes[host], names), timeout=120)
            finally:
                self._end_agents(reason)


def _pin_here(ref: str, fallback: str, label: str, names: list[str]) -> dict[str, Any] | None:
    """On one host (a Ray task): the image pulled by digest when missing and its digest
    checked, containers a dead forge left on `names` removed; the runtime that runs it
    ({kind, exe}), or None where the host has none and the profile allows the local install."""
    use = image_use_of({"image": ref, "image_fallback": fallback})
    if use is None:
        return None
    use = ImageUse(use.runtime, use.ref, use.digest, label)
    said: list[str] = []
    ensure_image(use, say=said.append)
    for name in names:
        clear_stale_container(use, name, say=said.append)
    return {"kind": use.runtime.kind, "exe": use.runtime.exe, "said": said}


def _resolve_here(name: str, fallback: str) -> dict[str, Any] | None:
    """On one host (a Ray task): the digest its runtime pulls for the tag `name` (None: no
    runtime and the profile allows the local install)."""
    use = image_use_of({"image": f"{name}@{RESOLVE_DIGEST}", "image_fallback": fallback})
    if use is None:
        return None
    return {"digest": pull_digest(use, name), "kind": use.runtime.kind}


def resolved_ref(ws: Workspace | None, ref: str, profile: RuntimeProfile,
                 nodes: Mapping[str, str], host: str,
                 echo: Callable[[str], None] = print) -> str:
    """A `repo:tag@resolve` ref by digest: the workspace's record, else resolved on `host`
    (a Ray task) and recorded; other refs as they are."""
    name, _, digest = ref.rpartition("@")
    if digest != RESOLVE_DIGEST:
        return ref
    if ws is None:
        raise HarnessError(f"image {name} (digest: resolve) needs a workspace to record its "
                           "resolution")
    known = resolved_image(ws.ledger, name)
    if known is not None:
        return f"{name}@{known.digest}"
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_resolve_here).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[host], soft=False))
    got = _get_on(host, task.remote(name, profile.image_fallback), PULL_TIMEOUT_S + 60)
    if got is None:
        raise HarnessError(f"image {name} (digest: resolve): host {host} has no container "
                           "runtime to resolve it with")
    return f"{name}@{record_resolution(ws, name, got['digest'], got['kind'], say=echo)}"


def pin_on_hosts(plan: LaunchPlan, profile: RuntimeProfile, nodes: Mapping[str, str], *,
                 vendor: str = "nvidia", echo: Callable[[str], None] = print,
                 ws: Workspace | None = None
                 ) -> tuple[LaunchPlan, ImageUse | None, dict[str, tuple[str, str]]]:
    """`whole.pin_plan` across hosts: on each host (a Ray task pinned to its node) the
    profile's image is made present and checked (`_pin_here`), and that host's processes are
    wrapped for the runtime found there. Returns the plan as it will run, the ImageUse the
    servers are checked with (None: no image anywhere), and {host: (kind, exe)}."""
    ref = image_ref(profile)
    if ref is None:
        return plan, None, {}
    ref = resolved_ref(ws, ref, profile, nodes, plan.hosts()[0], echo)  # `resolve`: pinned
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_pin_here)
    asked = {h: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        nodes[h], soft=False)).remote(ref, profile.image_fallback, profile_label(profile),
                                      [container_name(p.name, p.port)
                                       for p in plan.processes if p.host == h])
        for h in plan.hosts()}
    host_python = str(profile.config.get("python") or sys.executable)
    runtimes: dict[str, tuple[str, str]] = {}
    wrapped: dict[str, ProcessPlan] = {}
    first: ImageUse | None = None
    for h, ref_h in asked.items():
        got = _get_on(h, ref_h, PULL_TIMEOUT_S + 60)
        if got is None:
            echo(f"host {h}: no container runtime; its processes run the local install "
                 "(image_fallback: local)")
            continue
        for line in got["said"]:
            echo(f"host {h}: {line}")
        use = ImageUse(ContainerRuntime(got["kind"], got["exe"]), ref,
                       ref.rpartition("@")[2], profile_label(profile))
        first = first or use
        runtimes[h] = (use.runtime.kind, use.runtime.exe)
        mine = plan.model_copy(update={"processes": tuple(
            p for p in plan.processes if p.host == h)})
        for p in wrap_plan(mine, use, host_python=host_python, vendor=vendor).processes:
            wrapped[p.name] = p
    return plan.model_copy(update={"processes": tuple(
        wrapped.get(p.name, p) for p in plan.processes)}), first, runtimes


def ray_point_up(ws: Workspace, point: DeploymentPoint, profile: RuntimeProfile,
                 hosts: Sequence[str], address: str, *,
                 ib_devices: Mapping[str, str] | None = None, model: str | None = None,
                 overrides: Mapping[str, Any] | None = None, base_port: int = 30000,
                 once: bool = False, stream: str | None = None,
                 event_fields: Mapping[str, Any] | None = None,
                 echo: Callable[[str], None] = print) -> dict[str, Any]:
    """`forge engine up --point P --hosts A,B --ray ADDRESS`: join the cluster, register its
    nodes, plan on `hosts` with their ports and GPUs claimed (cluster_plan.py), run the plan
    through Ray (the lease held meanwhile, released after), until Ctrl-C or at once."""
    connect(address)
    register_nodes(ws, _ray().nodes())
    nodes = ray_nodes(hosts)
    plan, lease = plan_on_hosts(ws, point, profile, hosts, ib_devices=ib_devices, model=model,
                                overrides=overrides, base_port=base_port,
                                purpose=f"ray launch of {point.name}")
    beats = contextlib.nullcontext() if lease is None else claims.Lease(
        str(ws.home), lease.claim_id, CLAIM_HEARTBEAT_S)
    try:
        plan, use, runtimes = pin_on_hosts(plan, profile, nodes, vendor=point.accelerator.vendor,
                                           echo=echo, ws=ws)
        with beats, RayPinnedDeployment(plan, profile, use, nodes=nodes, ws=ws,
                                        stream=stream, event_fields=event_fields,
                                        runtimes=runtimes) as dep:
            info = dep.describe()
            if not once:
                echo(f"{plan.architecture} deployment of {plan.point} up at {plan.entry_url} "
                     f"({len(plan.processes)} processes on {len(nodes)} Ray nodes); Ctrl-C "
                     "to stop")
                watch(dep.check, echo)
    finally:
        if lease is not None:
            claims.release(ws, lease.claim_id, reason="deployment stopped", missing_ok=True)
    return {"plan": plan.to_json(), "deployment": info}
