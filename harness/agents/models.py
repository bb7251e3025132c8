"""Model tiers and the one way forge calls a model (`[models.<tier>]` in forge.toml).

`call_model(ws, tier, messages, ...)` sends one chat completion to the tier's OpenAI-compatible
endpoint with the official `openai` client and returns a `ModelReply`; it never raises for what
the endpoint does (down, timeout, HTTP error, a body that is not a chat completion): that is
a reply with `success=False` and a one-line `error`. Every call yields a `ModelCalled` event
(tier, model, family, purpose, tokens in/out, latency, cost from the tier's prices, the prompt
and the response as redacted artifacts); the caller saves it where it belongs (the task's
open block). The API key is read from `api_key_env` at call time and is never recorded.
The client's transport follows the outbound rules (guard/outbound.py `httpx_client`): no
redirect followed (a 3xx is an `http` error), a body over `MODEL_MAX_BYTES` or not done
within the tier's `timeout_s` is a `bad-response` reply naming the URL.
Data policy (harness/guard/data_policy.py): when the tier's endpoint is of class production,
the stored prompt and response keep their shape, numbers (token usage) and structural names
but every text becomes its length and sha256 (`data_policy.for_storage`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...ledger import events as E
from ...ledger.config import ModelSettings
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import data_policy

Purpose = str  # executor | planner | sub-agent | reviewer


@dataclass(frozen=True)
class ToolCall:
    """A tool call a model asked for; `arguments` is the raw JSON text as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass
class ModelReply:
    success: bool
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
    finish_reason: str | None = None
    event: E.ModelCalled | None = None
    # Why the call failed: down (no connection) | timeout | http | bad-response; None: ok.
    error_kind: str | None = None


def tier_settings(ws: Workspace, tier: str) -> ModelSettings:
    models = ws.config.settings.models
    if tier not in models:
        raise HarnessError(f"no model for tier {tier!r}: add [models.{tier}] (url, model, "
                           f"family) to forge.toml (tiers configured: "
                           f"{', '.join(sorted(models)) or 'none'})")
    return models[tier]


def cost(settings: ModelSettings, tokens_in: int, tokens_out: int) -> float:
    return round((tokens_in * settings.price_in_per_mtok
                  + tokens_out * settings.price_out_per_mtok) / 1e6, 8)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:300]


# One client per endpoint and key for the process: a client builds its TLS context and
# connection pool (~30 ms), which would otherwise be paid on every call.
_CLIENTS: dict[tuple[str, str, float], Any] = {}
MODEL_MAX_BYTES = 32 * 1024 * 1024  # a chat completion this big is not one


def _client(url: str, key: str, timeout_s: float) -> Any:
    import openai  # loaded when a model is called: `forge --help` stays fast

    # In the function for start-up time: the one outbound client loads when a model is called.
    from ..guard import outbound

    c = _CLIENTS.get((url, key, timeout_s))
    if c is None:  # on the outbound rules: no redirect, a byte cap, the body's deadline
        c = _CLIENTS[(url, key, timeout_s)] = openai.OpenAI(
            base_url=url, api_key=key or "none", max_retries=0,
            http_client=outbound.httpx_client(timeout_s, MODEL_MAX_BYTES))
    return c


_POOL: list[Any] = []


def _background() -> Any:
    from concurrent.futures import ThreadPoolExecutor

    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="forge-prompts"))
    return _POOL[0]


def put_json(ws: Workspace, value: Any) -> str:
    """Store a JSON value (a request, a response, a tool's result) as a redacted artifact.
    Redacted value by value, each string by its own lines: a prompt is one long JSON line
    whose texts (skills, memory) trip the redactor's screens, and scrubbing that whole line
    with every rule costs ~25 ms a call; the stored bytes are the same JSON either way."""
    data = json.dumps(value, sort_keys=True, default=str).encode("utf-8")
    red = ws.artifacts.redactor
    return ws.artifacts.put(data if red is None else red.json_bytes(data), verbatim=True)


def call_model(ws: Workspace, tier: str, messages: Sequence[dict[str, Any]], *,
               tools: Sequence[dict[str, Any]] | None = None, purpose: Purpose = "executor",
               event_fields: dict[str, Any] | None = None,
               settings: ModelSettings | None = None) -> ModelReply:
    """One chat completion on `tier` (module contract). `event_fields` go on the event
    (task_id, block_id, actor)."""
    import openai  # loaded when a model is called: `forge --help` stays fast

    s = settings or tier_settings(ws, tier)
    key = os.environ.get(s.api_key_env, "") if s.api_key_env else ""
    client = _client(s.url, key, s.timeout_s)
    request: dict[str, Any] = {"model": s.model, "messages": list(messages),
                               "max_tokens": s.max_tokens, "temperature": s.temperature}
    if tools:
        request["tools"] = list(tools)
    cls = data_policy.class_of(ws, url=s.url)
    # The prompt is stored (redacted, fsynced) while the model answers, not before.
    stored = _background().submit(put_json, ws, data_policy.for_storage(ws, request, cls))
    t0 = time.perf_counter()
    reply = ModelReply(success=False)
    raw: Any = None
    try:
        resp = client.chat.completions.create(**request, timeout=s.timeout_s)
        raw = resp.model_dump(mode="json") if hasattr(resp, "model_dump") else resp
        reply = _read(resp)
    except openai.APITimeoutError:
        reply.error, reply.error_kind = f"timed out after {s.timeout_s}s ({s.url})", "timeout"
    except openai.APIConnectionError as e:
        if isinstance(e.__cause__, HarnessError):  # cut at the cap or the deadline
            reply.error, reply.error_kind = _one_line(e.__cause__), "bad-response"
        else:
            reply.error = f"endpoint {s.url} is down: {_one_line(e.__cause__ or e)}"
            reply.error_kind = "down"
    except openai.APIStatusError as e:
        reply.error = f"HTTP {e.status_code} from {s.url}: {_one_line(e)}"
        reply.error_kind = "http"
    except Exception as e:  # a body that is not a chat completion, among others
        reply.error = f"bad response from {s.url}: {_one_line(e)}"
        reply.error_kind = "bad-response"
    reply.latency_s = round(time.perf_counter() - t0, 6)
    prompt_digest = stored.result()
    reply.cost_usd = cost(s, reply.tokens_in, reply.tokens_out)
    response_digest = None
    if raw is not None:
        response_digest = put_json(ws, data_policy.for_storage(ws, raw, cls))
    reply.event = E.ModelCalled(
        tier=tier, model=s.model, family=s.family, purpose=purpose,
        tokens_in=reply.tokens_in, tokens_out=reply.tokens_out, latency_s=reply.latency_s,
        cost_usd=reply.cost_usd, prompt_digest=prompt_digest, response_digest=response_digest,
        success=reply.success, error=reply.error, **(event_fields or {}))
    return reply


def _read(resp: Any) -> ModelReply:
    """A chat completion object as a reply; raises on a shape that is not one."""
    choice = resp.choices[0]
    msg = choice.message
    calls = [ToolCall(id=str(c.id), name=str(c.function.name),
                      arguments=str(c.function.arguments or ""))
             for c in (msg.tool_calls or []) if getattr(c, "function", None) is not None]
    usage = resp.usage
    return ModelReply(success=True, content=msg.content or "", tool_calls=calls,
                      tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
                      tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
                      finish_reason=choice.finish_reason)
