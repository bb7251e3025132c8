"""The Ray backend of `forge graph run --backend ray [--address ADDR]`: ready task nodes run
as Ray tasks; the ledger stays the single source of truth.

Contracts:
- The driver (`run_graph_ray`, in the forge process) records the run as the local runner
  does (`run_record.start_run` / `finish_run`: GraphRunStarted, GraphRunFinished, the summary),
  feeds Ray's node table (`ray.nodes()`) to the Node Registry (`register_host`, source
  "ray"), and submits each ready task node as one Ray task, at most `jobs` in flight
  (default: the cluster's CPUs). It decides from the graph stream only; a Ray task's return
  value just says that the task ended.
- Resources: each task asks for `num_cpus=1` and `num_gpus` = the GPUs of its deployment
  point's topology (`point_gpus`: over the roles, count × tp × pp × dp; a colocated point
  without roles, tp × pp × dp; 0 on a CPU point). A loop node's point is its task YAML's
  `point`; a command node names no point and asks for no GPU. A node asking for more GPUs
  than the largest alive node of the cluster has is not submitted (Ray would keep it pending
  forever): it is echoed, reported as blocked in the summary with why, and the run ends stuck.
- A Ray task (`run_node_task`) opens the workspace by the home path the driver gives it (with
  a PostgreSQL ledger, the same path with the same forge.toml on every host), claims the node
  with `worker.claim_node` (NodeStarted under the graph stream's version; the worker is the
  task's ticket, `ray-<n>@<host>`) and runs `work.execute_node`. A node no longer ready, or a
  run already finished, is left alone.
- Retries: tasks are submitted with `max_retries`; Ray re-executes a task only when its worker
  process (or its node) died. The re-execution finds the node in flight under its own ticket:
  it marks that attempt NodeAbandoned and claims the next one in one save under the stream's
  version, so a dead attempt is abandoned once and a node never claimed twice; every save
  carries a deterministic command id, so a repeated save adds nothing. The dead attempt's
  task-stream events stay (its open block is closed as abandoned by the next attempt, as on
  resume). When Ray gives up (retries spent, or the task raised), the driver abandons the
  attempt (deterministic command id), does not resubmit the node, and the run ends failed.
- Commands a node starts die with their Ray worker (PR_SET_PDEATHSIG, as with local workers)
  and inherit its environment: Ray sets OMP_NUM_THREADS to the task's CPUs (1) and, for a
  task given GPUs, CUDA_VISIBLE_DEVICES to the ones it assigned.
- An interrupted driver cancels its tasks and records the run interrupted; the nodes they held
  stay in flight until `forge graph resume` (either backend) abandons and re-runs them.
- Connection: a driver already connected (`ray.is_initialized()`) uses that connection and
  leaves it up; otherwise it connects to `address` (else, as Ray resolves it: RAY_ADDRESS,
  the cluster `ray start` began on this machine) and disconnects at the end; an unreachable
  host:port is refused at once (Ray would retry it for minutes). Workers on other hosts need
  infer-forge installed.
- A Ray instance of its own: where no cluster is found, the driver starts one
  (`ray start --head --block` on 127.0.0.1, no dashboard, its own temp dir, a random auth
  token) in a session of its own under `proc.session_launch`'s leader, and ends that whole
  process group when the run ends. When
  forge dies, even by kill -9, the leader kills the group: the GCS, raylet, dashboard and
  runtime-env agents and the workers (whose node commands then die with them). Ray's own
  `ray.init()` instance left its agents running after a kill -9 of forge.
- `ray` is imported inside these functions only (`forge --help` stays fast).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.graphspec import LoopWork
from ...ledger.specs import DeploymentPoint, SpecError, load_point
from ...ledger.store import Append
from ...ledger.streams import graph_stream
from ...ledger.workspace import Workspace, open_workspace
from ...ledger.yamlio import load_yaml
from ...projections.graph import GraphView, catch_up, load_graph
from ..errors import HarnessError
from ..nodes.ray_table import ray_inventory
from ..nodes.registry import register_host
from ..proc import kill_group, session_launch
from . import lease
from .run_record import Echo, RunSummary, echo_progress, finish_run, interrupted, quiet, start_run
from .work import NodeContext, execute_node
from .worker import claim_node

MAX_RETRIES = 3  # Ray re-executions of a task whose worker died
IN_FLIGHT = ("running", "verified")


def point_gpus(point: DeploymentPoint) -> int:
    """The accelerators a deployment point runs on, from its topology (0 on a CPU point)."""
    if point.accelerator.vendor == "cpu":
        return 0
    t = point.topology
    if t.roles:
        return sum(r.count * r.parallelism.tp * r.parallelism.pp * r.parallelism.dp
                   for r in t.roles)
    p = t.parallelism
    return p.tp * p.pp * p.dp


def node_gpus(view: GraphView, node: str) -> int:
    """The GPUs a task node asks Ray for: its loop task's deployment point's (0 otherwise).
    A point that cannot be read asks for none: the node's own run reports the problem, as
    it does on the local backend."""
    work = view.nodes[node].spec.work
    if not isinstance(work, LoopWork):
        return 0
    src = Path(view.graph_dir or ".") / work.task
    try:
        data, _ = load_yaml(src)
        point = data.get("point") if isinstance(data, dict) else None
        if not isinstance(point, str):
            return 0
        return point_gpus(load_point(src.parent / point))
    except (SpecError, OSError):
        return 0


def _owns(n_worker: str | None, ticket: str) -> bool:
    return (n_worker or "").split("@", 1)[0] == ticket


def run_node_task(home: str, graph_id: str, run_id: str, node: str, ticket: str
                  ) -> dict[str, Any]:
    """The body of one Ray task: claim `node` for this task (abandoning the attempt a dead
    execution of the same task left in flight) and run it. Returns what happened."""
    worker = f"{ticket}@{socket.gethostname()}"
    ws = open_workspace(home)
    try:
        view = load_graph(ws.ledger, graph_id)
        while True:
            catch_up(ws.ledger, view)
            run = next((r for r in view.runs if r.run_id == run_id), None)
            n = view.nodes[node]
            if run is None or run.outcome is not None:
                return {"node": node, "state": n.state, "ran": False, "why": "run ended"}
            before: list[E.Event] = []
            if n.state in IN_FLIGHT and n.run_id == run_id and _owns(n.worker, ticket):
                # Ray re-executes a task only when its worker died: that attempt is dead.
                before = [E.NodeAbandoned(
                    node=node, attempt=n.attempt,
                    reason=f"Ray worker {n.worker} (pid {n.pid}) died mid-node; Ray retried "
                           "the task")]
            elif not view.is_ready(node):
                return {"node": node, "state": n.state, "ran": False, "why": "not ready"}
            attempt = claim_node(ws, view, node, run_id, worker, before)
            if attempt is not None:
                break
        catch_up(ws.ledger, view)
        state = execute_node(NodeContext(ws, view, node, attempt, run_id, worker))
        return {"node": node, "state": state, "ran": True, "attempt": attempt,
                "pid": os.getpid()}
    finally:
        ws.close()


def register_ray_nodes(ws: Workspace, nodes: list[dict[str, Any]], echo: Echo = quiet
                       ) -> list[str]:
    """Feed the alive rows of Ray's node table to the Node Registry. Returns the hosts."""
    hosts = []
    for row in nodes:
        if not row.get("Alive"):
            continue
        host, inv = ray_inventory(row)
        try:
            register_host(ws, host, inv)
        except HarnessError as e:  # a host name the registry cannot hold
            echo(f"Ray node {row.get('NodeID', '')[:12]} not registered: {e}")
            continue
        hosts.append(host)
    return hosts


def _one_line(e: BaseException) -> str:
    cause = getattr(e, "cause", None)  # a RayTaskError wraps the task's own exception
    text = str(cause if isinstance(cause, BaseException) else e).strip()
    lines = [x for x in text.splitlines() if x.strip()]
    return (f"{type(cause or e).__name__}: {lines[-1]}" if lines else type(e).__name__)[:300]


def _give_up(ws: Workspace, graph_id: str, run_id: str, node: str, ticket: str,
             why: str) -> None:
    """Abandon the attempt a failed Ray task left in flight (once: deterministic id)."""
    n = load_graph(ws.ledger, graph_id).nodes[node]
    if n.state in IN_FLIGHT and n.run_id == run_id and _owns(n.worker, ticket):
        gone: list[E.Event] = [E.NodeAbandoned(
            node=node, attempt=n.attempt, reason=f"Ray task {ticket} failed: {why}")]
        ws.ledger.save(Append(graph_stream(graph_id), gone),
                       *lease.releases_for(graph_id, gone),
                       command_id=f"{graph_id}:{node}:a{n.attempt}:abandoned:{run_id}")


HEAD_START_S = 120.0  # how long a head of our own may take to listen


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _found_cluster() -> bool:
    """Does Ray, left to itself, find a cluster to join (RAY_ADDRESS, the one `ray start`
    began on this machine), rather than start a new local instance?"""
    try:
        from ray._private.services import get_ray_address_from_environment
    except ImportError:  # Ray moved it: let Ray resolve it as before
        return True
    try:
        # None: as ray.init() without an address asks it (Ray's own annotation says str).
        return get_ray_address_from_environment(None, None) is not None  # type: ignore[arg-type]
    except (ConnectionError, OSError, ValueError):
        return True


# The head's workers stay in its process group (the leader's kill reaches them at once), and
# a dying worker leaves its children alone: a node command's own session leader ends the
# command's group when its worker dies (a SIGKILL from Ray would orphan the command).
_HEAD_ENV = {"RAY_process_group_cleanup_enabled": "0",
             "RAY_kill_child_processes_on_worker_exit": "0"}


@dataclass
class Head:
    """A local Ray head of our own: its leader process, its temp dir, the token it admits."""

    proc: subprocess.Popen[bytes]
    tmp: str
    env: dict[str, str]  # what the driver sets while it runs (the head's auth token)


def _start_head() -> tuple[Head, str]:
    """A local Ray head of our own in its own session under `session_launch`'s leader (it
    dies with forge), with its own temp dir (the machine's `ray_current_cluster` never
    names it) and a random token; the head and its GCS address once it listens."""
    port = _free_port()
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    cmd = [ray_cli] if ray_cli else [sys.executable, "-c",
                                     "from ray.scripts.scripts import main; main()"]
    argv = [*cmd, "start", "--head", "--block", f"--port={port}",
            "--node-ip-address=127.0.0.1", "--include-dashboard=false",
            "--disable-usage-stats"]
    # Short (Ray's sockets live below it), where Ray keeps its own (RAY_TMPDIR, else /tmp).
    # A kill -9 of forge leaves it behind, as Ray's own sessions are.
    tmp = tempfile.mkdtemp(prefix="forge-ray-", dir=os.environ.get("RAY_TMPDIR") or None)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    launch, keywords = session_launch(argv)
    head = Head(subprocess.Popen(launch, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE,
                                 env={**os.environ, **auth, **_HEAD_ENV, "RAY_TMPDIR": tmp},
                                 **keywords),
                tmp, auth)
    p = head.proc
    deadline = time.monotonic() + HEAD_START_S
    while True:  # the GCS listens once the head is up (or the head exits: its error)
        if p.poll() is not None:
            err = (p.stderr.read() if p.stderr else b"").decode(errors="replace")
            _stop_head(head)
            raise HarnessError(f"cannot start a local Ray instance: ray start exited "
                               f"{p.returncode}: {_one_line(RuntimeError(err[-300:]))}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                _stop_head(head)
                raise HarnessError(f"cannot start a local Ray instance: nothing listens on "
                                   f"127.0.0.1:{port} after {HEAD_START_S:g}s") from None
            time.sleep(0.2)
    if p.stderr is not None:  # nothing more is read from it: never let it fill
        p.stderr.close()
    return head, f"127.0.0.1:{port}"


def _stop_head(head: Head | None) -> None:
    """End the head's whole process group (its leader is the session's: `session_launch`)
    and remove its temp dir."""
    if head is not None:
        kill_group(head.proc.pid)
        head.proc.wait()
        shutil.rmtree(head.tmp, ignore_errors=True)


def _reload_ray_config() -> None:
    """Ray reads its auth mode into a cached config (set when ray was imported): read the
    environment again, as Ray's own `ray.init()` does when it turns token auth on."""
    try:
        from ray._raylet import Config  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - Ray moved it; its own default then applies
        return
    Config.initialize("")


def _connect(address: str | None) -> tuple[bool, Head | None]:
    """Connect to Ray unless already connected. Returns whether this call connected, and the
    head it started (module docstring) if it started one."""
    try:
        import ray
    except ImportError:
        raise HarnessError("the Ray backend needs ray: pip install 'infer-forge[ray]'") from None
    if ray.is_initialized():
        return False, None
    if address and (m := re.fullmatch(r"([\w.-]+|\[[0-9a-fA-F:]+\]):(\d+)", address)):
        # Ray retries an unreachable address for minutes; a refused port is known at once.
        try:
            socket.create_connection((m[1].strip("[]"), int(m[2])), timeout=10).close()
        except OSError as e:
            raise HarnessError(f"cannot reach Ray at {address}: {e.strerror or e}") from None
    head = None
    if address is None and not _found_cluster():
        head, address = _start_head()
        os.environ.update(head.env)  # the driver's token, while it runs
        _reload_ray_config()
    try:
        if address is None:
            ray.init(log_to_driver=False, include_dashboard=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        _stop_head(head)
        for k in head.env if head else ():
            os.environ.pop(k, None)
        raise HarnessError(f"cannot connect to Ray at {address or 'a new local instance'}: "
                           f"{_one_line(e)}") from None
    return True, head


def run_graph_ray(ws: Workspace, graph_id: str, *, jobs: int | None = None,
                  resume: bool = False, echo: Echo = quiet, address: str | None = None,
                  poll_s: float = 0.2, max_retries: int = MAX_RETRIES,
                  by: E.Actor | None = None) -> RunSummary:
    """Run the graph's ready nodes as Ray tasks until nothing more can run (started by
    `by`, the person: `run_record.start_run`)."""
    own, head = _connect(address)
    import ray

    try:
        nodes = ray.nodes()
        hosts = register_ray_nodes(ws, nodes, echo)
        alive = [x for x in nodes if x.get("Alive")]
        cpus = int(sum(x["Resources"].get("CPU", 0) for x in alive))
        max_gpus = max((int(x["Resources"].get("GPU", 0)) for x in alive), default=0)
        jobs = max(1, jobs or cpus or 1)
        rs = start_run(ws, graph_id, jobs, resume, echo, by)
        todo = [n for n in rs.view.tasks() if n.state != "delivered"]
        echo(f"graph {graph_id}: {len(rs.view.tasks())} tasks, {len(todo)} to do, Ray cluster "
             f"of {len(alive)} node(s) ({', '.join(hosts)}; {cpus} CPUs, up to {max_gpus} "
             f"GPUs per node), at most {jobs} in flight, run {rs.run_id}")
        remote = ray.remote(run_node_task)
        home = str(ws.home)
        live = load_graph(ws.ledger, graph_id)
        inflight: dict[Any, tuple[str, str]] = {}  # ObjectRef -> (node, ticket)
        gpus: dict[str, int] = {}
        unschedulable: dict[str, list[str]] = {}
        gave_up: set[str] = set()
        submitted = 0
        failed = False
        try:
            while True:
                echo_progress(ws.ledger, live, rs.t0, echo)
                placed = {node for node, _ in inflight.values()}
                for node in live.ready():
                    if len(inflight) >= jobs:
                        break
                    if node in placed or node in gave_up or node in unschedulable:
                        continue
                    if node not in gpus:
                        gpus[node] = node_gpus(live, node)
                    g = gpus[node]
                    if g > max_gpus:
                        why = (f"needs {g} GPU(s) (its deployment point's topology); the "
                               f"largest node of the Ray cluster has {max_gpus}")
                        unschedulable[node] = [why]
                        echo(f"cannot schedule {node}: {why}")
                        continue
                    submitted += 1
                    ticket = f"ray-{submitted}"
                    ref = remote.options(num_cpus=1, num_gpus=g, max_retries=max_retries,
                                         name=f"forge:{graph_id}:{node}").remote(
                        home, graph_id, rs.run_id, node, ticket)
                    inflight[ref] = (node, ticket)
                if not inflight:
                    break
                done, _ = ray.wait(list(inflight), num_returns=1, timeout=poll_s)
                for ref in done:
                    node, ticket = inflight.pop(ref)
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayError as e:
                        why = _one_line(e)
                        echo(f"Ray task {ticket} for {node} failed: {why}")
                        _give_up(ws, graph_id, rs.run_id, node, ticket, why)
                        gave_up.add(node)
                        failed = True
            echo_progress(ws.ledger, live, rs.t0, echo)
        except BaseException:
            for ref in inflight:
                ray.cancel(ref, force=True)
            interrupted(ws, graph_id, rs)
            raise
        return finish_run(ws, graph_id, rs, jobs, failed, unschedulable)
    finally:
        if own:
            ray.shutdown()
        _stop_head(head)
        for k in head.env if head else ():
            os.environ.pop(k, None)
