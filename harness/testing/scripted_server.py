"""A local OpenAI-compatible streaming server with known timing, for tests and benchmarks.

Speaks the wire format of a real server: `POST /v1/completions` and `/v1/chat/completions`
stream Server-Sent Events over chunked HTTP/1.1 (`data: {...}\\n\\n` per token, a final chunk
with `finish_reason`, a usage chunk when `stream_options.include_usage` is set, then
`data: [DONE]`); non-streaming requests get one JSON body. `POST /generate` speaks SGLang's
native format (`text`, `sampling_params.max_new_tokens`; streamed: an event per token whose
`text` is the whole text so far, with `meta_info.completion_tokens`), as SGLang's own bench
client's default backend `sglang` reads it. `GET /health`, `GET /v1/models`,
and `GET /metrics` when the script has a `metrics` callable (the text of each scrape).

Timing contract (the "truth" a client's measurements are compared with): the first token is
written `first_token_ms` after the request was fully read, token k (0-based) at
`first_token_ms + k * itl_ms`, scheduled against absolute deadlines so lateness never
accumulates. `GET /forge/stats` reports how late the server actually wrote (its own error);
with `record_timeline`, `GET /forge/timeline` gives per prompt (keyed by the prompt's crc32)
the perf_counter times the request was read and each token written — the same system-wide
monotonic clock a client on this machine reads, so client measurements can be compared with
what the server actually did. With `record_received`, `GET /forge/received` lists a summary
of each completion request's body in arrival order (received.py: its text, max_tokens, and
each image part decoded to its format and size), so tests can check what a client sent.
`POST /forge/reset` clears all three. With both delays 0
("instant") the whole response is written at once, so the server costs as little as possible
and the client is what is measured.

Generated text is deterministic per prompt (token k of a prompt is ` w<n>`), so greedy
outputs of two runs match. `tokens` fixes the number of tokens (default: the request's
`max_tokens`). `reject_fields` answers 422 to those body fields (as `transformers serve`
does for `ignore_eos`, `min_tokens`); `fail_every` answers 500 to every N-th request.

Run: `python -m infer_forge.harness.testing.scripted_server --port 8123 --first-token-ms 50
--itl-ms 10` (prints `listening on http://127.0.0.1:PORT` once ready; `--port 0` picks a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import orjson

from .received import message_text, summarize

MODEL = "scripted"


@dataclass
class Script:
    first_token_ms: float = 0.0
    itl_ms: float = 0.0
    tokens: int | None = None
    reject_fields: frozenset[str] = frozenset()
    fail_every: int = 0
    model: str = MODEL
    record_timeline: bool = False  # keep per-prompt write times for /forge/timeline
    idle_close_ms: float = 0.0  # close a keep-alive connection idle this long (as uvicorn does)
    # `GET /metrics`: called with the scrape's number (0, 1, ...) for the Prometheus text to
    # serve, so a test can make a metric move between scrapes; None: 404, as without metrics.
    metrics: Callable[[int], str] | None = None
    # Keep a summary of each completion request's body (received.py) for /forge/received.
    record_received: bool = False

    @property
    def instant(self) -> bool:
        return self.first_token_ms <= 0 and self.itl_ms <= 0


@dataclass
class Stats:
    requests: int = 0
    idle_closed: int = 0
    late_s: list[float] = field(default_factory=list)  # actual − scheduled, per timed write
    cap: int = 500_000
    # prompt seed (crc32 of the prompt) -> {"recv": t, "writes": [t, ...]} (perf_counter)
    timeline: dict[int, dict] = field(default_factory=dict)
    received: list[dict] = field(default_factory=list)  # received.summarize, in arrival order

    def note(self, late: float) -> None:
        if len(self.late_s) < self.cap:
            self.late_s.append(late)

    def summary(self) -> dict[str, float]:
        xs = sorted(self.late_s)
        n = len(xs)

        def q(p: float) -> float:
            return xs[min(n - 1, int(p * n))] * 1000 if n else 0.0

        return {"requests": self.requests, "writes": n, "idle_closed": self.idle_closed,
                "mean_late_ms": (sum(xs) / n * 1000) if n else 0.0,
                "p50_late_ms": q(0.5), "p99_late_ms": q(0.99),
                "max_late_ms": (xs[-1] * 1000) if n else 0.0}


def token_text(prompt_seed: int, k: int) -> str:
    return f" w{(prompt_seed * 31 + k * 7919) % 997}"


def _prompt_seed(body: dict) -> int:
    if "messages" in body:
        text = message_text(body)
    else:
        p = body.get("prompt", "")
        text = p if isinstance(p, str) else orjson.dumps(p).decode()
    return zlib.crc32(text.encode("utf-8", "replace"))


def _prompt_tokens(body: dict) -> int:
    if "messages" in body:
        return len(message_text(body).split())
    p = body.get("prompt", "")
    return len(p) if isinstance(p, list) else len(str(p).split())


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk carrying one SSE event."""
    event = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


class _Request:
    __slots__ = ("method", "path", "body", "close")

    def __init__(self, method: str, path: str, body: bytes, close: bool):
        self.method, self.path, self.body, self.close = method, path, body, close


class _Protocol(asyncio.Protocol):
    """Minimal HTTP/1.1 with keep-alive; one request at a time per connection."""

    def __init__(self, server: ScriptedServer):
        self.server = server
        self.buf = b""
        self.queue: list[_Request] = []
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            close = False
            for line in head[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip() or 0)
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            parts = head[0].split(" ")
            if len(parts) < 2:
                self._write(self._plain(400, b'{"error":"bad request line"}', True))
                return
            self.queue.append(_Request(parts[0], parts[1].split("?")[0], body, close))
            self._next()

    def _next(self) -> None:
        if self.busy or not self.queue or self.transport is None:
            return
        req = self.queue.pop(0)
        self.busy = True
        done = self.server.handle(self, req)
        if done is None:
            self._done(req)

    def _done(self, req: _Request) -> None:
        self.busy = False
        if req.close and self.transport is not None:
            self.transport.close()
            return
        self._next()
        idle = self.server.script.idle_close_ms
        if idle > 0 and not self.busy and self.transport is not None:
            asyncio.get_running_loop().call_later(idle / 1000, self._close_if_idle, req)

    def _close_if_idle(self, last: _Request) -> None:
        if not self.busy and not self.queue and self.transport is not None:
            self.server.stats.idle_closed += 1
            self.transport.close()

    def _write(self, data: bytes) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(data)
        return True

    @staticmethod
    def _plain(status: int, body: bytes, close: bool = False,
               content_type: bytes = b"application/json") -> bytes:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 422: "Unprocessable Entity",
                  500: "Internal Server Error"}.get(status, "OK")
        conn = b"Connection: close\r\n" if close else b""
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        return head % (status, reason.encode(), content_type, len(body)) + conn + b"\r\n" + body


class ScriptedServer:
    """The server; `serve()` on a loop, or `start_in_thread()` for an in-process one."""

    def __init__(self, script: Script | None = None, host: str = "127.0.0.1", port: int = 0):
        self.script = script or Script()
        self.host, self.port = host, port
        self.stats = Stats()
        self._count = 0
        self.scrapes = 0  # GET /metrics answered
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Protocol(self), self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    def serve_until_interrupted(self) -> None:
        """Serve on this thread until Ctrl-C, saying `listening on URL` once bound (the line
        a launcher waits for)."""

        async def run() -> None:
            await self.start()
            print(f"listening on {self.url}", flush=True)
            assert self._server is not None
            async with self._server:
                await self._server.serve_forever()

        try:
            asyncio.run(run())
        except KeyboardInterrupt:
            pass

    def start_in_thread(self) -> ScriptedServer:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:  # reported to the starting thread
                errors.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            assert self._server is not None  # set by start()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="scripted-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- requests ---------------------------------------------------------------------------

    def handle(self, proto: _Protocol, req: _Request):
        """Answer `req`; returns a Task when the answer streams on, else None (done)."""
        plain = proto._plain
        if req.method == "GET" and req.path in ("/health", "/ready"):
            proto._write(plain(200, b"{}", req.close))
            return None
        if req.method == "GET" and req.path == "/v1/models":
            listing = orjson.dumps({"object": "list", "data": [
                {"id": self.script.model, "object": "model", "owned_by": "forge"}]})
            proto._write(plain(200, listing, req.close))
            return None
        if req.method == "GET" and req.path == "/metrics" and self.script.metrics is not None:
            page = self.script.metrics(self.scrapes).encode()
            self.scrapes += 1
            proto._write(plain(200, page, req.close, b"text/plain; version=0.0.4"))
            return None
        if req.method == "GET" and req.path == "/forge/stats":
            proto._write(plain(200, orjson.dumps(self.stats.summary()), req.close))
            return None
        if req.method == "GET" and req.path == "/forge/timeline":
            timeline = orjson.dumps({str(k): v for k, v in self.stats.timeline.items()})
            proto._write(plain(200, timeline, req.close))
            return None
        if req.method == "GET" and req.path == "/forge/received":
            proto._write(plain(200, orjson.dumps(self.stats.received), req.close))
            return None
        if req.method == "POST" and req.path == "/forge/reset":
            self.stats = Stats()
            proto._write(plain(200, b"{}", req.close))
            return None
        chat = req.path == "/v1/chat/completions"
        native = req.path == "/generate"
        if req.method != "POST" or req.path not in ("/v1/completions", "/v1/chat/completions",
                                                    "/generate"):
            proto._write(plain(404, b'{"error":"not found"}', req.close))
            return None
        try:
            body = orjson.loads(req.body)
            if not isinstance(body, dict):
                raise ValueError("body is not an object")
        except ValueError as e:
            proto._write(plain(400, orjson.dumps({"error": f"bad JSON: {e}"}), req.close))
            return None
        bad = sorted(self.script.reject_fields & body.keys())
        if bad:
            detail = [{"type": "extra_forbidden", "loc": ["body", k], "msg": "Extra inputs are "
                       "not permitted"} for k in bad]
            proto._write(plain(422, orjson.dumps({"detail": detail}), req.close))
            return None
        self._count += 1
        self.stats.requests += 1
        if self.script.record_received:
            self.stats.received.append(summarize(req.path, body))
        if self.script.fail_every and self._count % self.script.fail_every == 0:
            proto._write(plain(500, b'{"error":"scripted failure"}', req.close))
            return None
        if native:
            body = _native_as_completion(body)
        n = self.script.tokens if self.script.tokens is not None else int(
            body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        n = max(0, n)
        seed = _prompt_seed(body)
        texts = [token_text(seed, k) for k in range(n)]
        usage = {"prompt_tokens": _prompt_tokens(body), "completion_tokens": n,
                 "total_tokens": _prompt_tokens(body) + n}
        rid = f"cmpl-{self._count}"
        if native:
            if not body.get("stream"):
                last = _native_events(rid, texts, usage)[-2]
                proto._write(plain(200, last, req.close))
                return None
            events = _native_events(rid, texts, usage)
        elif not body.get("stream"):
            text = "".join(texts)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": self.script.model,
                   "choices": [choice], "usage": usage}
            proto._write(plain(200, orjson.dumps(obj), req.close))
            return None
        else:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = _events(rid, self.script.model, chat, texts, usage, include_usage)
        if self.script.instant:
            proto._write(_SSE_HEAD + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
            return None
        t0 = time.perf_counter()
        writes: list[float] | None = None
        if self.script.record_timeline:
            writes = []
            self.stats.timeline[seed] = {"recv": t0, "writes": writes}
        task = asyncio.get_running_loop().create_task(
            self._stream(proto, req, events, n, t0, writes))
        return task

    async def _stream(self, proto: _Protocol, req: _Request, events: list[bytes], n: int,
                      t0: float, writes: list[float] | None) -> None:
        d, i = self.script.first_token_ms / 1000, self.script.itl_ms / 1000
        perf = time.perf_counter
        try:
            if not proto._write(_SSE_HEAD):
                return
            for k in range(n):
                deadline = t0 + d + k * i
                delay = deadline - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
                now = perf()
                self.stats.note(now - deadline)
                if not proto._write(_chunk(events[k])):
                    return
                if writes is not None:
                    writes.append(now)
            proto._write(b"".join(_chunk(e) for e in events[n:]) + b"0\r\n\r\n")
        finally:
            proto._done(req)


def _native_as_completion(body: dict) -> dict:
    """A native `/generate` body (`text`, `sampling_params.max_new_tokens`, `stream`) read as
    the completion request it amounts to."""
    params = body.get("sampling_params") or {}
    text = body.get("text", body.get("input_ids", ""))
    return {"prompt": text, "max_tokens": params.get("max_new_tokens") or 128,
            "stream": bool(body.get("stream"))}


def _native_events(rid: str, texts: list[str], usage: dict) -> list[bytes]:
    """SGLang's native `/generate` stream (http_server.py over tokenizer_manager): per token
    an object whose `text` is the whole text so far and whose `meta_info.completion_tokens`
    counts the tokens so far (the last one with `finish_reason`), then [DONE]. The one
    non-streamed answer is the last object."""
    out: list[bytes] = []
    n = len(texts)
    for k in range(1, n + 1):
        done = k == n
        out.append(orjson.dumps({"text": "".join(texts[:k]), "output_ids": list(range(k)),
                                 "meta_info": {
            "id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
            "prompt_tokens": usage["prompt_tokens"], "weight_version": "default",
            "reasoning_tokens": 0, "completion_tokens": k, "cached_tokens": 0}}))
    if not out:  # nothing generated: one finished, empty object
        out.append(orjson.dumps({"text": "", "output_ids": [], "meta_info": {
            "id": rid, "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": usage["prompt_tokens"], "weight_version": "default",
            "reasoning_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}}))
    out.append(b"[DONE]")
    return out


def _events(rid: str, model: str, chat: bool, texts: list[str], usage: dict,
            include_usage: bool) -> list[bytes]:
    """The SSE payloads: one per token, the finish chunk, the usage chunk, [DONE]."""
    created = int(time.time())
    out: list[bytes] = []
    if chat:
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        for k, t in enumerate(texts):
            delta = {"role": "assistant", "content": t} if k == 0 else {"content": t}
            out.append(orjson.dumps({**head, "choices": [
                {"index": 0, "delta": delta, "finish_reason": None}]}))
        out.append(orjson.dumps({**head, "choices": [
            {"index": 0, "delta": {}, "finish_reason": "length"}]}))
    else:
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        for t in texts:
            out.append(orjson.dumps({**head, "choices": [
                {"index": 0, "text": t, "logprobs": None, "finish_reason": None}]}))
        out.append(orjson.dumps({**head, "choices": [
            {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}))
    if include_usage:
        out.append(orjson.dumps({**head, "choices": [], "usage": usage}))
    out.append(b"[DONE]")
    return out


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m infer_forge.harness.testing.scripted_server",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--first-token-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens per response (default: the request's max_tokens)")
    ap.add_argument("--reject-fields", default="", help="comma-separated body fields → 422")
    ap.add_argument("--fail-every", type=int, default=0, help="answer 500 to every N-th request")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--idle-close-ms", type=float, default=0.0,
                    help="close keep-alive connections idle this long")
    ap.add_argument("--record-timeline", action="store_true",
                    help="keep per-prompt write times (GET /forge/timeline)")
    ap.add_argument("--record-received", action="store_true",
                    help="keep a summary of each request's body (GET /forge/received)")
    a = ap.parse_args(list(argv) if argv is not None else None)
    script = Script(a.first_token_ms, a.itl_ms, a.tokens,
                    frozenset(f for f in a.reject_fields.split(",") if f), a.fail_every, a.model,
                    a.record_timeline, a.idle_close_ms, record_received=a.record_received)
    ScriptedServer(script, a.host, a.port).serve_until_interrupted()


if __name__ == "__main__":
    main()
