"""The `external` engine: an OpenAI-compatible endpoint that is already running.

Never started or stopped by forge. Configuration: `base_url` (required), `api`
("openai", default, or "sglang": also /server_info, /metrics, profiler), `model` (the name
requests carry; default: the first id of /v1/models), `read_only` (default true: profiling
and cache flushes are refused with ReadOnlyError — production endpoints are observed, not
touched), `api_key_env` (name of the variable holding a bearer token; the value itself is
never stored), `timeout_s`.

Production (harness/guard/production.py): launched with a workspace, every mutating call
(start_profile, stop_profile, flush_cache) is first put to the production guard: against an
endpoint forge.toml marks production it is refused and recorded (ProductionRefused, on the
launching task's stream or `guard`), whatever `read_only` says; only forge.toml plus an
approval lifts that, and `read_only` still applies after. Reads (/v1/models, /server_info,
/metrics) always pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.streams import task_of
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import outbound, production
from .base import (
    Engine,
    NotSupported,
    ReadOnlyError,
    RunningEngine,
    apply_overrides,
    check_keys,
    request_json,
)
from .sglang import SGLangClient, resolved_args

KEYS = {"base_url", "api", "model", "read_only", "api_key_env", "timeout_s"}


class ExternalRunning(RunningEngine, SGLangClient):
    engine = "external"

    def __init__(self, config: Mapping[str, Any], *, ws: Workspace | None = None,
                 actor: E.Actor | None = None, task_id: str | None = None):
        self.ws, self.task_id = ws, task_id
        self.actor = actor or E.Actor.tool("forge-engine")
        # Every request's redirect hops pass the production guard (the first hop: reads
        # pass it, mutating calls are checked in _mutating before anything is sent).
        self.guard = outbound.Guard(ws, self.actor, task_id) if ws is not None else None
        self.config = dict(config)
        self.base_url = str(config["base_url"]).rstrip("/")
        self.api = config.get("api", "openai")
        self.read_only = bool(config.get("read_only", True))
        self.timeout = float(config.get("timeout_s", 30))
        key_env = config.get("api_key_env")
        token = os.environ.get(key_env, "") if key_env else ""
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.model = str(config.get("model") or self._first_model())

    def _models(self) -> Any:
        return request_json("GET", self.base_url + "/v1/models", timeout=self.timeout,
                            guard=self.guard,
                            headers=self.headers)

    def _first_model(self) -> str:
        data = self._models()
        try:
            return str(data["data"][0]["id"])
        except (TypeError, KeyError, IndexError):
            raise HarnessError(f"{self.base_url}/v1/models: no model listed; set 'model' in the "
                               "external engine config") from None

    def check(self, grace_s: float = 0.0) -> None:
        self._models()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "engine": "external", "base_url": self.base_url, "model": self.model,
            "api": self.api, "read_only": self.read_only, "launch_command": None,
            "server_info": {"models": self._models()},
            "resolved_args": {k: v for k, v in self.config.items() if k != "api_key_env"},
        }
        if self.api == "sglang":
            si = self.server_info()
            info["server_info"].update(si)
            info["resolved_args"] = resolved_args(si)
            info["version"] = si["version"]
        return info

    def metrics(self) -> dict[str, float]:
        return self.scrape() if self.api == "sglang" else {}

    def _mutating(self, what: str) -> None:
        if self.ws is not None:
            production.check(self.ws, self.base_url, f"POST /{what}", actor=self.actor,
                             task_id=self.task_id)
        if self.read_only:
            raise ReadOnlyError(f"external endpoint {self.base_url} is read-only: {what} refused "
                                "(set read_only: false in its engine config to allow it)")
        if self.api != "sglang":
            raise NotSupported(f"external endpoint {self.base_url} ({self.api}): no {what}")

    def start_profile(self, **options: Any) -> dict[str, Any]:
        self._mutating("start_profile")
        return self._start_profile(options)

    def stop_profile(self) -> dict[str, Any]:
        self._mutating("stop_profile")
        return self._post("/stop_profile")

    def flush_cache(self) -> dict[str, Any]:
        self._mutating("flush_cache")
        return self._post("/flush_cache")

    def stop(self, reason: str = "teardown") -> None:
        """Nothing to stop: forge never owns an external endpoint."""


class ExternalEngine(Engine):
    name = "external"

    def launch(self, config: Mapping[str, Any], *, model: str | Path | None = None,
               ws: Workspace | None = None,
               overrides: Mapping[str, Any] | None = None, stream: str | None = None,
               event_fields: Mapping[str, Any] | None = None, **_kwargs: Any
               ) -> ExternalRunning:
        cfg = apply_overrides(config, overrides)
        check_keys("external", cfg, KEYS)
        if not isinstance(cfg.get("base_url"), str) or not cfg["base_url"].startswith(
                ("http://", "https://")):
            raise HarnessError("external engine config: base_url must be an http(s) URL")
        if cfg.get("api", "openai") not in ("openai", "sglang"):
            raise HarnessError(f"external engine config: api={cfg['api']!r}: openai or sglang")
        if model is not None and "model" not in cfg:
            cfg["model"] = str(model)
        fields = dict(event_fields or {})
        return ExternalRunning(cfg, ws=ws, actor=fields.get("actor"),
                               task_id=fields.get("task_id") or (task_of(stream) if stream
                                                                 else None))
