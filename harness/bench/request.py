"""What a bench run sends, and how one request goes: shared by the client (`client.py`, this
process) and its worker processes (`workers.py`), below both.

Contracts:
- `BenchConfig`: a run's configuration (URL, model, endpoint, load, transport, workers, and
  the probe limits the production guard set); `validate()` names a bad field in one line;
  `worker_count(n)` the processes to send `n` requests with (`auto`: one per 64 streams, at
  most half the CPUs; 1 for an open loop, probe limits, or a daemonic process).
- `request_body(cfg, prompt, max_tokens, extra)`: one request's JSON body: streaming with
  usage, greedy, the engine's extra body fields (`ENGINE_EXTRA_BODY`) and `extra_body`;
  images as OpenAI `image_url` parts of a chat message.
- `stream_request(session, url, body, rec, chat)`: one streamed request over aiohttp,
  filling `rec`; failures are data (never raises but for cancellation); no redirect followed.
- `open_session(limit, timeout_s)`: an aiohttp session whose resolver answers with
  guard/addresses.py's `resolve` (the addresses the run's production check judged).
- `freeze_gc()` / `thaw_gc(frozen)`: the measured run out of the cyclic collector's way.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import HarnessError
from ..guard import addresses, production
from .datasets import Prompt
from .media import image_part
from .metrics import RequestRecord
from .sse_client import StreamState

# Body fields an engine needs beyond the OpenAI basics. transformers serve rejects unknown
# fields with 422, so only sglang gets ignore_eos (fixed output lengths).
ENGINE_EXTRA_BODY: dict[str, dict[str, Any]] = {
    "sglang": {"ignore_eos": True},
    "hf": {},
    "external": {},
    "scripted": {},
}
_JSON = {"Content-Type": "application/json"}


@dataclass
class BenchConfig:
    url: str  # base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str
    endpoint: str = "completions"  # completions | chat
    max_concurrency: int | None = None
    request_rate: float = math.inf
    warmup: int = 1
    seed: int = 42
    engine: str = "hf"
    extra_body: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, float] | None = None
    timeout_s: float = 6 * 3600
    transport: str = "auto"  # auto (raw for http://, else aiohttp) | raw | aiohttp
    workers: int | str = "auto"  # processes sending the closed loop: "auto" | n ≥ 1
    # Set by the production guard (`guarded`): pacing and caps for probe traffic.
    probe: production.ProbeLimits | None = None

    def api_url(self) -> str:
        base = self.url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        if self.endpoint not in ("completions", "chat"):
            raise HarnessError(f"endpoint {self.endpoint!r} is not 'completions' or 'chat'")
        return base + ("/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions")

    def body_extra(self) -> dict[str, Any]:
        return {**ENGINE_EXTRA_BODY.get(self.engine, {}), **self.extra_body}

    def validate(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise HarnessError(f"max_concurrency {self.max_concurrency} must be at least 1")
        if not (self.request_rate > 0):
            raise HarnessError(f"request_rate {self.request_rate} must be > 0 (inf allowed)")
        if self.warmup < 0:
            raise HarnessError(f"warmup {self.warmup} must be ≥ 0")
        if self.transport not in ("auto", "raw", "aiohttp"):
            raise HarnessError(f"transport {self.transport!r} is not auto, raw or aiohttp")
        parse_workers(self.workers)
        if isinstance(self.workers, int) and self.workers > 1 and not self.closed_loop():
            raise HarnessError(f"workers {self.workers} needs a closed loop "
                               "(max_concurrency set, request_rate inf)")
        self.api_url()

    def closed_loop(self) -> bool:
        return math.isinf(self.request_rate) and bool(self.max_concurrency)

    def worker_count(self, n: int) -> int:
        """Processes to send `n` requests with (see module contract)."""
        if self.workers == "auto":
            # A daemonic process (a multiprocessing pool's worker) may not start children.
            if (not self.closed_loop() or self.probe is not None
                    or multiprocessing.current_process().daemon):
                return 1
            assert self.max_concurrency is not None  # closed_loop
            want = min((os.cpu_count() or 1) // 2, math.ceil(self.max_concurrency / 64))
        else:
            want = int(self.workers)
        return max(1, min(want, n, self.max_concurrency or 1))

    def use_raw(self) -> bool:
        return self.transport == "raw" or (self.transport == "auto"
                                           and self.api_url().startswith("http://"))


def freeze_gc() -> bool:
    """Before a measured run: every object alive now (modules, prompts, payloads) leaves the
    cyclic collector's view, so its collections scan only the run's own objects. A full
    collection over all that was imported paused the loop 10–100 ms on the 2-core machine,
    long enough for every stream's next tokens to arrive in one read (bench/RESULTS.md,
    issue 16). True when this call froze (and `thaw_gc` must undo it)."""
    if gc.get_freeze_count():
        return False  # frozen by someone else (another run, a forking server): theirs
    gc.freeze()
    return True


def thaw_gc(frozen: bool) -> None:
    if frozen:
        gc.unfreeze()


def parse_workers(value: int | str) -> int | str:
    """`auto` or a count ≥ 1 (a CLI string too); HarnessError naming the value otherwise."""
    if isinstance(value, str) and value.strip().lower() != "auto":
        try:
            value = int(value)
        except ValueError:
            raise HarnessError(f"workers {value!r} is not 'auto' or an integer ≥ 1") from None
    elif isinstance(value, str):
        value = "auto"
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise HarnessError(f"workers {value!r} is not 'auto' or an integer ≥ 1")
    return value


def request_body(cfg: BenchConfig, p: Prompt, max_tokens: int, extra: Mapping[str, Any]) -> bytes:
    body: dict[str, Any] = {"model": cfg.model, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if cfg.endpoint == "chat":
        # Images (bench/media.py) follow the text as OpenAI image_url parts of one message.
        content: Any = [{"type": "text", "text": p.prompt}, *map(image_part, p.media)] \
            if p.media else p.prompt
        body["messages"] = [{"role": "user", "content": content}]
    elif p.media:
        raise HarnessError("prompts with images need the chat endpoint (endpoint='chat')")
    else:
        body["prompt"] = p.prompt
    body.update(extra)
    return orjson.dumps(body)


async def stream_request(session, url: str, payload: bytes, rec: RequestRecord, chat: bool) -> None:
    """One streamed request over aiohttp, filling `rec` (never raises)."""
    perf = time.perf_counter
    st = perf()
    rec.start_time = st
    sse = StreamState(rec, chat, st)
    try:
        # No redirect followed: a hop elsewhere would skip the run's production check.
        async with session.post(url, data=payload, headers=_JSON,
                                allow_redirects=False) as resp:
            if resp.status != 200:
                body = (await resp.read())[:300].decode("utf-8", "replace")
                rec.error = f"HTTP {resp.status} {resp.reason or ''}: {' '.join(body.split())}"
                return
            async for data in resp.content.iter_any():
                sse.feed(data, perf())
                if sse.error:
                    break
            sse.finish(perf())
    except asyncio.CancelledError:
        raise
    except Exception as e:  # failures are data
        rec.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]
        rec.generated_text = "".join(sse.parts)


def _pinned_resolver():
    """aiohttp's resolver on guard/addresses.py's `resolve`: the addresses the run's production
    check judged, not a lookup of aiohttp's own."""
    import socket

    from aiohttp.abc import AbstractResolver


    class Pinned(AbstractResolver):
        async def resolve(self, host: str, port: int = 0,
                          family: int = socket.AF_INET) -> Any:
            try:
                addrs = addresses.resolve(host, port)
            except HarnessError as e:
                raise OSError(str(e)) from None
            return [{"hostname": host, "host": ip, "port": port, "family": fam, "proto": 0,
                     "flags": socket.AI_NUMERICHOST} for fam, ip in addrs]

        async def close(self) -> None:
            return None

    return Pinned()


def open_session(limit: int, timeout_s: float):
    import aiohttp

    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, ttl_dns_cache=300,
                                     resolver=_pinned_resolver())
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        read_bufsize=4 * 1024 * 1024,
        skip_auto_headers=("User-Agent",),
    )
