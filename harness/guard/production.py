"""Production read-only: what forge may send to an endpoint marked production in forge.toml.

Contracts:
- `is_production(ws, url)`: `url` matches an entry of `[guard] production_endpoints`. An entry
  with a scheme (`https://prod:30000/v1`) is a URL prefix: same scheme, host and port (default
  ports filled in) and a path prefix on a segment boundary. An entry without one is `host` or
  `host:port` (any scheme; a port, when given, must match). Hosts compare case-insensitively.
  Beyond spellings, endpoints are addresses: `url` is production too when its host resolves
  (addresses.resolve: getaddrinfo, inet_aton's `127.1` and `2130706433`) to an address an
  entry's host resolves to, canonically (IPv4-mapped IPv6 as IPv4; every address of this
  machine, `localhost`, `0.0.0.0`, `[::1]`, as one), on the entry's port (an entry without
  one: any port); the path does not matter there, a server is production whatever path is
  asked of it. `resolved` (the IPs a sender will connect to) is used instead of a lookup.
- `check(ws, url, action, *, rps, duration_s, requests, actor, task_id, ...)` returns for a
  call forge may make and raises `ProductionRefusedError` (a HarnessError, one line) after
  recording `ProductionRefused(url, action, reason)` for one it may not. `action` is
  `METHOD /path` or a bare name (`flush_cache` = `POST /flush_cache`). Against a production
  endpoint:
  - reads pass: GET/HEAD of `/health`, `/ready`, `/metrics`, `/workers` (a router's worker
    view), `/server_info`, `/get_server_info`, `/model_info`, `/get_model_info`,
    `/v1/models` (and below it);
  - probe traffic (`POST /v1/completions`, `/v1/chat/completions`, `/generate`) passes when
    the plan is within `[guard] production_probe`: a finite `rps` ≤ max_rps, `requests` ≤
    max_requests and a duration (given, or requests / rps) ≤ max_duration_s; the returned
    `ProbeLimits` are what the sender must hold to while it runs (pacing and caps);
  - everything else is refused: `flush_cache` (any method: SGLang also serves it on GET),
    profiling, weight and memory updates, any other path, and load above the budget —
    whatever a task, a runtime profile or an engine config (`read_only: false`) says.
  Only forge.toml lifts a refusal: the endpoint taken out of `production_endpoints`, or the
  action named in `[guard] production_allow` (`flush_cache`, `/start_profile`, `load` for
  probe traffic over the budget) AND an approval of this exact call from the human gate
  (`approvals.require`, kind `production-call`, bound to the URL, action and plan).
- Where a refusal is recorded: the task's stream when `task_id` names a defined task that has
  not exited (in its open block), else the `guard` stream. `in_step=True` (a call made inside
  a loop step, whose save owns the task stream's version) writes to the `guard` stream with
  the task and block named, so the step's own save never conflicts; `ledger.events(task=…)`
  still finds it. The URL is recorded without user info, query or fragment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...ledger import events as E
from ...ledger.config import CONFIG_NAME, resolve_home
from ...ledger.errors import LedgerError, NotFoundError
from ...ledger.streams import GUARD_STREAM
from ...ledger.workspace import Workspace, open_workspace
from ...projections.memory import read_memory
from ..errors import HarnessError
from ..record import append_to_task
from . import addresses
from .approvals import require  # the gate's writes are its own (the approvals stream)

APPROVAL_KIND = "production-call"
READ_PATHS = frozenset({"/health", "/ready", "/metrics", "/workers", "/server_info",
                        "/get_server_info", "/model_info", "/get_model_info", "/v1/models"})
PROBE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/generate"})
LOAD = "load"  # the production_allow name of probe traffic over the budget
# Why a named mutating call is refused (SGLang's endpoint names; anything else not a read or
# a probe is refused as "not a read").
_WHY = {
    "flush_cache": "flush_cache empties the production server's cache",
    "start_profile": "profiling slows the production server",
    "stop_profile": "profiling slows the production server",
    "start_expert_distribution_record": "profiling slows the production server",
    "stop_expert_distribution_record": "profiling slows the production server",
    "update_weights_from_disk": "a weight update changes what production serves",
    "update_weights_from_tensor": "a weight update changes what production serves",
    "update_weights_from_distributed": "a weight update changes what production serves",
    "init_weights_update_group": "a weight update changes what production serves",
    "load_lora_adapter": "an adapter change alters what production serves",
    "unload_lora_adapter": "an adapter change alters what production serves",
    "release_memory_occupation": "releasing memory stops the production server serving",
    "resume_memory_occupation": "memory control belongs to the production server's owners",
    "abort_request": "aborting cancels production users' requests",
    "pause_generation": "pausing stops production serving",
    "continue_generation": "generation control belongs to the production server's owners",
    "configure_logging": "logging changes alter the production server",
    "set_internal_state": "internal state changes alter the production server",
}


class ProductionRefusedError(HarnessError):
    """A call to a production endpoint refused (and recorded as ProductionRefused)."""


@dataclass(frozen=True)
class ProbeLimits:
    """What a sender holds to while it sends probe traffic: at most one request start per
    1/max_rps seconds, no start after `max_requests` or past `max_duration_s` from the first,
    nothing in flight after that."""

    max_rps: float
    max_duration_s: float
    max_requests: int


# --- matching endpoints ------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432}


def _split(text: str, where: str) -> tuple[str | None, str, int | None, str]:
    """(scheme or None, host, port or None, path) of a URL or a `host[:port]`."""
    t = text.strip()
    has_scheme = "://" in t
    try:
        u = urlsplit(t if has_scheme else "//" + t)
        port = u.port
    except ValueError:
        raise HarnessError(f"{where}: {text!r} is not a URL or host[:port]") from None
    host = (u.hostname or "").lower()
    if not host:
        raise HarnessError(f"{where}: {text!r} is not a URL or host[:port]")
    scheme = u.scheme.lower() if has_scheme else None
    if port is None and scheme is not None:
        port = _DEFAULT_PORTS.get(scheme)
    return scheme, host, port, u.path.rstrip("/")


def endpoint_matches(pattern: str, url: str, where: str = "forge.toml") -> bool:
    """Whether `url` falls under `pattern` (a URL prefix or `host[:port]`, module contract)."""
    ps, ph, pp, ppath = _split(pattern, where)
    try:
        us, uh, up, upath = _split(url, "url")
    except HarnessError:
        return False
    if ph != uh:
        return False
    if ps is None:  # host[:port]: any scheme
        return pp is None or pp == up
    return ps == us and pp == up and (upath == ppath or upath.startswith(ppath + "/"))


def is_production(ws: Workspace, url: str, resolved: Sequence[str] | None = None) -> bool:
    """Whether forge.toml marks `url` production (`[guard] production_endpoints`): by its
    spelling or by its resolved address (module contract)."""
    entries = ws.config.settings.guard.production_endpoints
    where = "forge.toml: guard.production_endpoints"
    if any(endpoint_matches(p, url, where) for p in entries):
        return True
    if not entries:
        return False
    try:
        _, host, port, _ = _split(url, "url")
    except HarnessError:
        return False
    if port is None:
        return False
    if resolved is None:
        try:
            resolved = [ip for _, ip in addresses.resolve(host, port)]
        except HarnessError:
            return False  # nothing to connect to: nothing reaches production either
    mine = {addresses.canonical(ip) for ip in resolved}
    for p in entries:
        _, ph, pp, _ = _split(p, where)
        if (pp is None or pp == port) and mine & addresses.host_addresses(ph):
            return True
    return False


def workspace_for_guard(home: str | Path | None = None) -> Workspace | None:
    """The workspace at `home` (FORGE_HOME, ./.forge) when it has a forge.toml, else None:
    a command that does not otherwise need a workspace (`forge bench` without --record)
    still obeys the production endpoints it names. The caller closes it."""
    if not (resolve_home(home) / CONFIG_NAME).is_file():
        return None
    return open_workspace(home)


def shown_url(url: str) -> str:
    """`url` as recorded: scheme, host, port and path; no user info, query or fragment."""
    try:
        u = urlsplit(url)
        host = u.hostname or ""
        port = f":{u.port}" if u.port else ""
    except ValueError:
        return url.split("?", 1)[0].split("#", 1)[0][:300]
    host = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{host}{port}{u.path}" if u.scheme else f"{host}{port}{u.path}"


# --- classifying a call ------------------------------------------------------------------

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def canonical(action: str) -> tuple[str, str]:
    """(METHOD, /path) of `action`: `GET /metrics`, `/metrics` (a read path: GET) or a bare
    name (`flush_cache`: POST /flush_cache)."""
    parts = action.strip().split(None, 1)
    if len(parts) == 2 and parts[0].upper() in _METHODS:
        method, path = parts[0].upper(), parts[1].strip()
    elif len(parts) == 1:
        path = parts[0]
        method = ""
    else:
        raise HarnessError(f"production guard: action {action!r} is not METHOD /path or a name")
    path = "/" + path.split("?", 1)[0].strip("/")
    if not method:
        method = "GET" if _is_read_path(path) else "POST"
    return method, path


def _is_read_path(path: str) -> bool:
    return path in READ_PATHS or path.startswith("/v1/models/")


def _allowed_names(ws: Workspace) -> set[str]:
    """`[guard] production_allow` as bare names (`/flush_cache`, `POST /flush_cache` and
    `flush_cache` are one)."""
    out = set()
    for entry in ws.config.settings.guard.production_allow:
        if entry.strip() == LOAD:
            out.add(LOAD)
        else:
            out.add(canonical(entry)[1].strip("/"))
    return out


# --- the check ---------------------------------------------------------------------------


def check(ws: Workspace, url: str, action: str, *, rps: float | None = None,
          duration_s: float | None = None, requests: int | None = None, actor: E.Actor,
          task_id: str | None = None, block_id: str | None = None, in_step: bool = False,
          wait: bool = False, timeout_s: float = 0.0,
          resolved: Sequence[str] | None = None) -> ProbeLimits | None:
    """Pass or refuse one call (module contract). Returns the limits to hold to for probe
    traffic against a production endpoint; None for any other call that passes."""
    if not is_production(ws, url, resolved):
        return None
    method, path = canonical(action)
    act = f"{method} {path}"
    name = path.strip("/")
    if method in ("GET", "HEAD") and _is_read_path(path):
        return None
    budget = ws.config.settings.guard.production_probe
    if method == "POST" and path in PROBE_PATHS:
        over = _over_budget(budget, rps, duration_s, requests)
        if over is None:
            return ProbeLimits(budget.max_rps, budget.max_duration_s, budget.max_requests)
        reason = f"load above the probe budget: {over}"
        lift = LOAD
    else:
        reason = _WHY.get(name, f"{act} is not a read (against production only GET "
                                "/health, /metrics, /server_info, /v1/models and probe traffic "
                                "within [guard] production_probe)")
        lift = name
    plan = {"rps": rps, "duration_s": duration_s, "requests": requests}
    if lift not in _allowed_names(ws):
        _refuse(ws, url, act, reason, actor=actor, task_id=task_id, block_id=block_id,
                in_step=in_step)
    # forge.toml lets it through: only with an approval of this exact call.
    arguments = {"action": act, **{k: _plain(v) for k, v in plan.items() if v is not None}}
    try:
        approve_call(ws, shown_url(url), arguments, actor=actor, wait=wait, timeout_s=timeout_s,
                     summary=f"{act} on production endpoint {shown_url(url)} ({reason})")
    except HarnessError as e:
        _refuse(ws, url, act, f"{reason}; listed in production_allow but not approved: "
                f"{' '.join(str(e).split())}", actor=actor, task_id=task_id,
                block_id=block_id, in_step=in_step)
    if lift == LOAD:  # the approved plan is the limit
        r = rps if rps is not None and rps > 0 else math.inf
        n = requests if requests is not None else 1_000_000_000
        d = duration_s if duration_s is not None else (n / r if math.isfinite(r) else math.inf)
        return ProbeLimits(r, d, n)
    return None


def _plain(v: Any) -> Any:
    return "inf" if isinstance(v, float) and math.isinf(v) else v


def _over_budget(budget: Any, rps: float | None, duration_s: float | None,
                 requests: int | None) -> str | None:
    """Why a probe plan exceeds the budget (None: within it)."""
    if rps is None or not math.isfinite(rps) or rps <= 0:
        return (f"no finite request rate (give a rate ≤ max_rps {budget.max_rps:g}/s; "
                "closed-loop or unbounded load is not probe traffic)")
    if rps > budget.max_rps:
        return f"{rps:g} requests/s > max_rps {budget.max_rps:g}"
    if requests is None:
        return f"no request count (give ≤ max_requests {budget.max_requests})"
    if requests > budget.max_requests:
        return f"{requests} requests > max_requests {budget.max_requests}"
    planned = duration_s if duration_s is not None else requests / rps
    if planned > budget.max_duration_s:
        return f"{planned:g} s > max_duration_s {budget.max_duration_s:g}"
    return None


def approve_call(ws: Workspace, target: str, arguments: Mapping[str, Any], *,
                 actor: E.Actor, wait: bool, timeout_s: float, summary: str) -> str:
    """The human gate for one production call: an approval of kind `production-call` bound
    to `target` and `arguments` (approvals.require: used once; without one it asks and
    raises ApprovalWaiting, or waits up to `timeout_s`). Returns the approval's id."""
    return require(ws, APPROVAL_KIND, target, dict(arguments), actor=actor, wait=wait,
                   timeout_s=timeout_s, summary=summary)


def _refuse(ws: Workspace, url: str, action: str, reason: str, *, actor: E.Actor,
            task_id: str | None, block_id: str | None, in_step: bool) -> None:
    """Record ProductionRefused (module contract) and raise ProductionRefusedError."""
    shown = shown_url(url)
    record_refusal(ws, E.ProductionRefused(url=shown, action=action, reason=reason,
                                           actor=actor), task_id=task_id, block_id=block_id,
                   in_step=in_step)
    raise ProductionRefusedError(f"production endpoint {shown}: {action} refused: {reason} "
                                 "(forge.toml [guard] production_endpoints)")


def record_refusal(ws: Workspace, ev: E.ProductionRefused, *, task_id: str | None,
                   block_id: str | None = None, in_step: bool = False) -> None:
    """On the task's stream (its open block) when the task is open and not in a step, else
    on the `guard` stream (naming the task in a step)."""
    if task_id and not in_step:
        try:
            mem: Any = read_memory(ws.ledger, task_id)[0]
        except (NotFoundError, LedgerError):
            mem = None
        if mem is not None and mem.status not in ("undefined", "exited"):
            blk = mem.current_block.block_id if mem.current_block else None
            append_to_task(ws, task_id, [ev.model_copy(update={"task_id": task_id,
                                                              "block_id": blk})])
            return
    named = {"task_id": task_id, "block_id": block_id} if in_step else {}
    ws.ledger.append(GUARD_STREAM, [ev.model_copy(update=named)])
