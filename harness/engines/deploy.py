"""Run a launch plan: every process of a deployment point under one lifecycle.

`Deployment(plan, ws=..., stream=..., event_fields=...)` contract:
- `start()` records `LaunchPlanned` (the whole plan and its digest) before any process
  starts; then starts every server of the plan (encode, prefill, decode / colocated: each its
  own process group, log and `ServerProcess`), waits until each answers its health URL while
  watching all of them (one that dies while the others start fails the deploy at once), checks
  each server's `/server_info` answers as its role (`disaggregation_mode`; by the route of the
  plan's SGLang version, `/get_server_info` before 0.5.6: sglang_routes.py) — an encoder-only
  server has no info route in any SGLang version, so an encoder is ready when its `/health`
  answers and records no server info, and so is a follower rank (node rank >= 1) of a server
  over several hosts — then starts the router and waits until its `/workers` view (the real
  router has no `/list_workers`) lists every planned prefill, decode or colocated server
  (by its rank 0) with the right type, healthy. Each ready process records
  `EngineLaunched`; `on_ready(process_plan, server_info)` runs after each (a version check
  belongs there).
- Any failure or interrupt while starting (an exception, Ctrl-C, SIGTERM through the process
  lifecycle's safety net) stops every started process in reverse order and re-raises; the
  error names the process and its role ("decode-0 (decode server) exited while starting …").
- `check()` raises a HarnessError naming the role of a process that died later; `stop()`
  stops router, then decode, prefill, encode (reverse start order), each process group TERM
  then KILL, recording `EngineStopped` for each; idempotent; also on leaving `with`.
- With `check_flags`, every server's flags are checked against its launcher's own `--help`
  before any server starts (the help texts become artifacts); an unknown flag names the
  process.
- Processes are started on this host only: a plan placing one on another host is refused
  (ray_launch.py's `RayDeployment` places them on their hosts through Ray).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard.engine_sandbox import for_launch
from .base import EventSink, log_dir, request_json
from .plan import LaunchPlan, ProcessPlan
from .process import ServerProcess, exit_reason, http_get, tail
from .sglang import check_flags, server_help, validate_server_info
from .sglang_routes import get_info

LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}
ROUTER_VIEW_TIMEOUT_S = 60.0
# Health polls back off to 0.1 s, not further: a GET to each starting server ten times a
# second costs nothing beside a server start, and a later poll only delays the deploy.
POLL_MAX_S = 0.1
OnReady = Callable[[ProcessPlan, dict[str, Any]], None]


def _what(p: ProcessPlan) -> str:
    return f"{p.name} ({'router' if p.role == 'router' else p.role + ' server'})"


class Deployment:
    """A point's processes, started and stopped together (see the module docstring)."""

    LOCAL_ONLY = True  # a subclass placing processes on other hosts (ray_launch.py) clears it

    def __init__(self, plan: LaunchPlan, *, ws: Workspace | None = None,
                 stream: str | None = None, event_fields: Mapping[str, Any] | None = None,
                 logs: Path | None = None, grace_s: float = 10.0,
                 on_ready: OnReady | None = None,
                 router_view_timeout_s: float = ROUTER_VIEW_TIMEOUT_S,
                 check_flags: bool = False):
        local = LOCAL_HOSTS | {socket.gethostname()}
        for p in plan.processes if self.LOCAL_ONLY else ():
            if p.host not in local:
                raise HarnessError(f"{p.name} is planned on host {p.host}: forge starts "
                                   "processes on this host only (run it there)")
        self.plan = plan
        self.ws = ws
        self.sink = EventSink(ws, stream, event_fields)
        self.logs = log_dir(ws, logs)
        self.grace_s = grace_s
        self.on_ready = on_ready
        self.router_view_timeout_s = router_view_timeout_s
        self.check_flags = check_flags
        self.help_digests: dict[str, str] = {}
        self.servers: dict[str, ServerProcess] = {}
        self.started: list[ProcessPlan] = []
        self.server_info: dict[str, dict[str, Any]] = {}
        self.router_workers: list[dict[str, Any]] = []
        self._stopped = False

    @property
    def entry_url(self) -> str:
        return self.plan.entry_url

    # --- start ----------------------------------------------------------------------------

    def start(self) -> Deployment:
        self.sink._record(E.LaunchPlanned(
            point=self.plan.point, architecture=self.plan.architecture,
            entry_url=self.plan.entry_url, plan=self.plan.shown(),
            plan_digest=self.plan.digest(), **self.sink.fields))
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._prepare()
            if self.check_flags:  # inside: a Ray deployment's agents asked end with it
                self._check_flags()
            roles = [p for p in self.plan.processes if p.role != "router"]
            for p in roles:
                self._spawn(p)
            self._wait(roles)
            for p in self.plan.processes:
                if p.role == "router":
                    self._spawn(p)
                    self._wait([p])
                    self._check_router_view(p)
        except BaseException as e:
            # The start's own error is the one to report; a failure to stop is secondary.
            with contextlib.suppress(Exception):
                self.stop(reason="failed-start" if isinstance(e, Exception)
                          else exit_reason(type(e)))
            raise
        return self

    def _check_flags(self) -> None:
        """Every server's flags against its own launcher's `--help` (run once per launcher,
        so a container-wrapped command asks the image's server), before any server starts."""
        helps: dict[tuple[str, ...], str] = {}
        for p in self.plan.processes:
            if p.role == "router":
                continue
            i = p.argv.index("--model-path")
            launcher = self._help_key(p)
            if launcher not in helps:
                helps[launcher] = self._launcher_help(p)
                if self.ws is not None:
                    self.help_digests[p.name] = self.ws.artifacts.put(helps[launcher])
            try:
                check_flags(list(p.argv[i:]), helps[launcher], self.plan.sglang_version)
            except HarnessError as e:
                raise HarnessError(f"{_what(p)}: {e}") from None

    def _prepare(self) -> None:
        """Before the flag check and the first process: nothing here (a subclass placing
        processes elsewhere readies every host first: ray_launch.py's agents)."""

    def _help_key(self, p: ProcessPlan) -> tuple[str, ...]:
        """What one `--help` answers for: the launcher (the argv before `--model-path`)."""
        return tuple(p.argv[:p.argv.index("--model-path")])

    def _launcher_help(self, p: ProcessPlan) -> str:
        """`p`'s launcher's `--help`, run where `p` runs (here)."""
        return server_help(list(p.argv), for_launch(self.ws, self.sink.fields))

    def _spawn(self, p: ProcessPlan) -> None:
        server = ServerProcess(
            p.argv, health_url=p.health_url, name=_what(p), env=p.env,
            log_path=self.logs / f"{p.name}-{p.port}-{os.getpid()}.log",
            startup_timeout_s=p.startup_timeout_s, grace_s=self.grace_s,
            artifacts=self.ws.artifacts if self.ws is not None else None,
            sandbox=for_launch(self.ws, self.sink.fields))
        self.servers[p.name] = server
        self.started.append(p)
        server.start()

    def _died(self, p: ProcessPlan, when: str) -> HarnessError:
        s = self.servers[p.name]
        code = s.proc.poll() if s.proc is not None else None
        s.exit_code = code
        how = f"killed by signal {-code}" if code is not None and code < 0 else \
            f"exit code {code}"
        return HarnessError(f"{_what(p)} exited {when} ({how}); last lines of "
                            f"{s.log_path}:\n{tail(s.log_path)}")

    def _wait(self, pending_plans: list[ProcessPlan]) -> None:
        """Until every one answers its health URL; any started process dying fails it."""
        t0 = time.monotonic()
        pending = list(pending_plans)
        interval = 0.02
        while pending:
            for p in self.started:
                if not self.servers[p.name].alive():
                    raise self._died(p, "while starting" if p in pending
                                     else "while the deployment started")
            for p in list(pending):
                status, _ = http_get(p.health_url, timeout=2.0)
                if status == 200:
                    pending.remove(p)
                    self.servers[p.name].startup_s = time.monotonic() - t0
                    self._ready(p)
                elif time.monotonic() - t0 > p.startup_timeout_s:
                    s = self.servers[p.name]
                    raise HarnessError(f"{_what(p)} not healthy at {p.health_url} after "
                                       f"{p.startup_timeout_s:.0f}s; log {s.log_path}:\n"
                                       f"{tail(s.log_path)}")
            if pending:
                time.sleep(interval)  # poll interval of a wait loop, not a synchronization
                interval = min(POLL_MAX_S, interval * 1.5)

    def _ready(self, p: ProcessPlan) -> None:
        info: dict[str, Any] = {}
        # An encoder has no info route (module doc), nor has a follower rank of a server
        # over several hosts (SGLang's dummy health server: /health only).
        if p.role not in ("router", "encode") and p.node_rank == 0:
            info = validate_server_info(*get_info(p.url, "server", self.plan.sglang_version))
            self._check_role(p, info)
        self.server_info[p.name] = info
        if self.on_ready is not None:
            self.on_ready(p, info)
        self.sink.launched("sglang-router" if p.role == "router" else "sglang",
                           list(p.argv), p.url, self.servers[p.name].pid, info)

    def _check_role(self, p: ProcessPlan, info: Mapping[str, Any]) -> None:
        if p.role in ("prefill", "decode") and self.plan.architecture != "colocated":
            mode = info.get("disaggregation_mode")
            if mode is not None and mode != p.role:
                raise HarnessError(f"{_what(p)} at {p.url} reports disaggregation_mode "
                                   f"{mode!r}; the plan says {p.role}")

    def _check_router_view(self, router: ProcessPlan) -> None:
        """Poll the router's worker list until it shows every planned server, healthy."""
        want = {p.url.rstrip("/"): ("regular" if p.role == "colocated" else p.role)
                for p in self.plan.processes
                if p.role in ("prefill", "decode", "colocated") and p.node_rank == 0}
        deadline = time.monotonic() + self.router_view_timeout_s
        interval, problem = 0.02, ""
        while True:
            if not self.servers[router.name].alive():
                raise self._died(router, "while listing its workers")
            view = request_json("GET", router.url + "/workers", timeout=10)
            workers = [w for w in (view or {}).get("workers", []) if isinstance(w, dict)]
            have = {str(w.get("url", "")).rstrip("/"): w for w in workers}
            problem = ""
            for url, kind in want.items():
                w = have.get(url)
                if w is None:
                    problem = f"does not list {url} ({kind})"
                elif w.get("worker_type") not in (kind, None):
                    problem = f"lists {url} as {w.get('worker_type')}, planned {kind}"
                elif w.get("is_healthy") is False:
                    problem = f"reports {url} ({kind}) unhealthy"
                if problem:
                    break
            if not problem:
                self.router_workers = workers
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"router at {router.url} {problem} after "
                                   f"{self.router_view_timeout_s:.0f}s")
            time.sleep(interval)  # poll interval of a wait loop, not a synchronization
            interval = min(POLL_MAX_S, interval * 1.5)

    # --- running --------------------------------------------------------------------------

    def check(self) -> None:
        """Raise a HarnessError naming the process (and role) that is no longer running."""
        for p in self.started:
            if not self.servers[p.name].alive():
                raise self._died(p, "while running")

    def stop(self, reason: str = "teardown") -> None:
        """Stop every started process, last started first; record each stop."""
        if self._stopped:
            return
        self._stopped = True
        errors: list[str] = []
        for p in reversed(self.started):
            s = self.servers[p.name]
            why = reason
            if s.proc is not None and not s.alive() and reason in ("teardown", "failed-start"):
                why = "crashed"
            try:
                code = s.stop(reason=why)
            except Exception as e:  # keep stopping the others
                errors.append(f"{p.name}: {e}")
                continue
            try:
                self.sink.stopped("sglang-router" if p.role == "router" else "sglang", p.url,
                                  code, why, s.log_digest)
            except Exception as e:  # a ledger failure must not leave processes behind
                errors.append(f"{p.name}: recording its stop: {e}")
        if errors:
            raise HarnessError("stopping the deployment: " + "; ".join(errors))

    def describe(self) -> dict[str, Any]:
        return {
            "point": self.plan.point, "architecture": self.plan.architecture,
            "entry_url": self.plan.entry_url, "plan_digest": self.plan.digest(),
            "processes": [{
                "name": p.name, "role": p.role, "url": p.url, "pid": self.servers[p.name].pid,
                "devices": list(p.devices), "bootstrap_port": p.bootstrap_port,
                "encoder_bootstrap_port": p.encoder_bootstrap_port,
                "metrics_port": p.metrics_port,
                "startup_s": self.servers[p.name].startup_s,
                "log_path": str(self.servers[p.name].log_path),
                "version": self.server_info.get(p.name, {}).get("version"),
                "disaggregation_mode": self.server_info.get(p.name, {}).get(
                    "disaggregation_mode")} for p in self.started],
            "router_workers": self.router_workers,
            **({"help_digests": dict(self.help_digests)} if self.help_digests else {}),
        }

    def __enter__(self) -> Deployment:
        if not self.started:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        self.stop(reason=exit_reason(exc_type))
