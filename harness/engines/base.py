"""The one engine interface: launch from a runtime profile's engine configuration, wait
ready, describe, scrape metrics, profile, stop.

Contracts:
- `Engine.launch(config, model=..., ws=..., overrides=...)` takes the profile's engine
  configuration as a plain mapping (e.g. `{"continuous_batching": true, "dtype": "float32"}`)
  plus candidate overrides (`{"engine.dtype": "bfloat16"}`; the `engine.` prefix is optional,
  a `None` value removes the key) and returns a ready `RunningEngine`, or raises a one-line
  HarnessError (unknown key, bad value, server died while starting — with its log tail).
- `RunningEngine` is a context manager; leaving it stops the server (also on Ctrl-C).
  `.base_url` is the OpenAI-compatible root, `.model` the model name requests must carry.
  `.describe()` returns what ran: engine, launch command, resolved args, server info,
  versions. `.metrics()` scrapes the server's own counters. `.check()` raises if the server
  died. `.start_profile()/.stop_profile()` raise `NotSupported` where the engine has none.
- With a workspace, launching records `EngineLaunched` (command, url, pid, server info) and
  stopping records `EngineStopped` (exit code, reason, the log as an artifact digest) on
  `stream` (default `engines`), with the given event fields (task_id, block_id, actor).
"""

from __future__ import annotations

import json
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.specs import RuntimeProfile
from ...ledger.streams import ENGINES_STREAM, task_of
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import outbound
from ..guard.engine_sandbox import for_launch
from ..record import append_to_task
from .image import image_ref
from .process import ServerProcess, exit_reason

JSON = dict[str, Any]


class NotSupported(HarnessError):
    """The engine has no such operation (e.g. profiling on `transformers serve`)."""


class ReadOnlyError(HarnessError):
    """A mutating call on an endpoint configured read-only (production)."""


# --- configuration ----------------------------------------------------------------------


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> JSON:
    """The engine configuration with candidate overrides applied (a new dict)."""
    out = dict(config or {})
    for key, value in (overrides or {}).items():
        k = key[len("engine."):] if key.startswith("engine.") else key
        if "." in k:
            raise HarnessError(f"override {key!r}: not an engine configuration key")
        if value is None:
            out.pop(k, None)
        else:
            out[k] = value
    return out


def engine_config_of(profile: RuntimeProfile) -> tuple[str, JSON]:
    """(engine name, engine configuration) of a runtime profile: its `config`, plus an
    external endpoint's `base_url` and an sglang framework's `version` when the config does
    not give them; an sglang profile's image as `image` (`name@sha256:…`; a tag without a
    digest is refused) and `image_fallback` (harness/engines/image.py). A profile stored in
    the ledger is read back with `specs.stored_profile`. `weights: dummy` is SGLang's
    `load_format: dummy` (the profile refuses it for other engines)."""
    engine, config = profile.engine, dict(profile.config)
    if engine == "sglang" and profile.weights == "dummy":
        config["load_format"] = "dummy"
    if engine == "external" and profile.endpoint and "base_url" not in config:
        config["base_url"] = profile.endpoint
    fw = profile.framework
    if engine == "sglang" and fw is not None and fw.kind == "sglang" and fw.version:
        config.setdefault("version", str(fw.version))
    if engine == "sglang" and profile.image is not None:
        config["image"] = image_ref(profile)  # refuses a tag without a digest
        config["image_fallback"] = profile.image_fallback
    return engine, config


def check_keys(engine: str, config: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(config) - known)
    if unknown:
        raise HarnessError(f"{engine} engine config: unknown key(s) {', '.join(unknown)} "
                           f"(known: {', '.join(sorted(known))})")


# --- HTTP -------------------------------------------------------------------------------


def request_json(method: str, url: str, payload: Any = None, *, timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None,
                 max_bytes: int = outbound.DEFAULT_MAX_BYTES,
                 guard: outbound.Guard | None = None) -> Any:
    """One JSON request; any failure is a one-line HarnessError naming the URL."""
    raw = _request(method, url, payload, timeout=timeout, headers=headers,
                   max_bytes=max_bytes, guard=guard)
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        raise HarnessError(f"{method} {url}: response is not JSON: {raw[:120]!r}") from None


def request_text(method: str, url: str, payload: Any = None, *, timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None,
                 max_bytes: int = outbound.DEFAULT_MAX_BYTES,
                 guard: outbound.Guard | None = None) -> str:
    return _request(method, url, payload, timeout=timeout, headers=headers,
                    max_bytes=max_bytes, guard=guard).decode("utf-8", errors="replace")


def _request(method: str, url: str, payload: Any, *, timeout: float,
             headers: Mapping[str, str] | None, max_bytes: int,
             guard: outbound.Guard | None) -> bytes:
    """Through the one outbound client (guard/outbound.py): `timeout` is the whole
    exchange's deadline, `max_bytes` the body's cap; redirects re-checked by `guard` (the
    caller checked the first hop itself), without one kept to the origin."""
    data = None if payload is None else json.dumps(payload).encode()
    return outbound.fetch(method, url, body=data, headers=headers, timeout_s=timeout,
                          max_bytes=max_bytes, guard=guard, first_checked=True).ok(method).body


# --- the interface ----------------------------------------------------------------------


class RunningEngine(ABC):
    """A server that is up (or an endpoint that is there). Stop it by leaving `with`."""

    engine: str
    base_url: str
    model: str

    @abstractmethod
    def describe(self) -> JSON: ...

    def metrics(self) -> JSON:
        return {}

    def start_profile(self, **options: Any) -> JSON:
        raise NotSupported(f"{self.engine} engine at {self.base_url}: no profiler")

    def stop_profile(self) -> JSON:
        raise NotSupported(f"{self.engine} engine at {self.base_url}: no profiler")

    def check(self, grace_s: float = 0.0) -> None:  # noqa: B027 - endpoints without a process
        """Raise HarnessError if the server is gone (waiting up to `grace_s` for a dying one)."""

    def stop(self, reason: str = "teardown") -> None:  # noqa: B027 - optional, see check
        """Stop the server (idempotent). No-op for endpoints we did not start."""

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, exc_type, *_exc: object) -> None:
        self.stop(reason=exit_reason(exc_type))


class Engine(ABC):
    name: str

    @abstractmethod
    def launch(self, config: Mapping[str, Any], *, model: str | Path | None = None,
               ws: Workspace | None = None, overrides: Mapping[str, Any] | None = None,
               stream: str | None = None, event_fields: Mapping[str, Any] | None = None,
               logs: Path | None = None, host: str = "127.0.0.1", port: int | None = None
               ) -> RunningEngine: ...


class EventSink:
    """Records EngineLaunched/EngineStopped for one running engine (no-op without a ledger)."""

    def __init__(self, ws: Workspace | None, stream: str | None = None,
                 fields: Mapping[str, Any] | None = None):
        self.ws = ws
        self.stream = stream or ENGINES_STREAM
        self.fields = dict(fields or {})
        self.fields.setdefault("actor", E.Actor.tool("forge-engine"))

    def launched(self, engine: str, command: list[str], url: str, pid: int | None,
                 server_info: JSON, log_digest: str | None = None) -> None:
        self._record(E.EngineLaunched(
            engine=engine, command=command, url=url, pid=pid, server_info=server_info,
            log_digest=log_digest, **self.fields))

    def stopped(self, engine: str, url: str, exit_code: int | None, reason: str,
                log_digest: str | None) -> None:
        self._record(E.EngineStopped(
            engine=engine, url=url, exit_code=exit_code, reason=reason, log_digest=log_digest,
            **self.fields))

    def _record(self, ev: E.Event) -> None:
        """On a task's stream through the one task-stream writer; else on `stream`."""
        if self.ws is None:
            return
        task_id = task_of(self.stream)
        if task_id is not None:
            append_to_task(self.ws, task_id, [ev])
        else:
            self.ws.ledger.append(self.stream, [ev])


def log_dir(ws: Workspace | None, explicit: Path | None = None) -> Path:
    """Where server logs are written while a server runs (the artifact keeps them after)."""
    if explicit is not None:
        return Path(explicit)
    if ws is not None:
        return Path(ws.home) / "logs"
    return Path(tempfile.gettempdir()) / "forge-logs"


class ManagedEngine(RunningEngine):
    """A RunningEngine backed by a ServerProcess we started: check/stop/log/events."""

    def __init__(self, engine: str, server, *, base_url: str, model: str, config: JSON,
                 sink: EventSink, versions: JSON | None = None):
        self.engine = engine
        self.server = server
        self.base_url = base_url
        self.model = model
        self.config = config
        self.sink = sink
        self.versions = versions or {}
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return self.server.pid

    def check(self, grace_s: float = 0.0) -> None:
        self.server.check(grace_s)

    def stop(self, reason: str = "teardown") -> None:
        if self._stopped:
            return
        self._stopped = True
        if not self.server.alive() and self.server.exit_code is None and reason == "teardown":
            reason = "crashed"
        code = self.server.stop(reason=reason)
        self.sink.stopped(self.engine, self.base_url, code, reason, self.server.log_digest)

    def base_description(self) -> JSON:
        return {"engine": self.engine, "base_url": self.base_url, "model": self.model,
                "pid": self.server.pid, "launch_command": list(self.server.cmd),
                "startup_s": self.server.startup_s, "log_path": str(self.server.log_path),
                "resolved_args": dict(self.config), "versions": dict(self.versions)}


def start_server(engine: str, cmd: list[str], *, base_url: str, health_path: str,
                 ws: Workspace | None,
                 sink: EventSink, log_path: Path, env: Mapping[str, str] | None,
                 startup_timeout_s: float, ready=None):
    """Start and wait for a server; a failed start is recorded (with its log) and re-raised.
    An agent's launch (the sink's actor) runs in the sandbox (`guard/engine_sandbox.py`)."""
    server = ServerProcess(cmd, health_url=base_url + health_path, log_path=log_path,
                           name=f"{engine} server", env=env, startup_timeout_s=startup_timeout_s,
                           ready=ready, artifacts=ws.artifacts if ws is not None else None,
                           sandbox=for_launch(ws, sink.fields))
    server.start()
    try:
        server.wait_ready()
    except BaseException as e:
        reason = "failed-start" if isinstance(e, Exception) else exit_reason(type(e))
        sink.stopped(engine, base_url, server.exit_code, reason, server.log_digest)
        raise
    return server
