"""A small SGLang-like HTTP endpoint (aiohttp, in a thread) that logs every request it gets:
the stand-in for a production server in the guard's tests.

Serves what forge talks to: `GET /health`, `/ready`, `/metrics` (a few `sglang:` series),
`/server_info`, `/get_server_info`, `/v1/models`; the mutating `/flush_cache` (GET and POST, as
SGLang), `/start_profile`, `/stop_profile`, `/update_weights_from_disk`; and streamed
`POST /v1/completions` / `/v1/chat/completions` whose text ECHOES the prompt (so a stored
response shows whether the prompt leaked). `log` holds (method, path, perf_counter time at
arrival) for every request, in order: the server's own timeline. `delay_s` delays each
completion's first byte.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="prod"} 0.0
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="prod"} 12.5
"""


class SGLangLike:
    def __init__(self, delay_s: float = 0.0, model: str = "prod"):
        self.delay_s = delay_s
        self.model = model
        self.log: list[tuple[str, str, float]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._release: asyncio.Event | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [f"{m} {p}" for m, p, _ in self.log]

    def completions(self) -> list[float]:
        """Arrival times of the completion requests."""
        return [t for _, p, t in self.log if p.startswith("/v1/") and "completions" in p]

    # --- the app ------------------------------------------------------------------------------

    def _app(self) -> Any:
        from aiohttp import web

        async def log(request: web.Request, handler: Any) -> Any:
            self.log.append((request.method, request.path, time.perf_counter()))
            return await handler(request)

        def ok(body: Any) -> Any:
            async def handler(_request: web.Request) -> web.Response:
                return web.json_response(body)
            return handler

        def text(body: str) -> Any:
            async def handler(_request: web.Request) -> web.Response:
                return web.Response(text=body)
            return handler

        async def completions(request: web.Request) -> web.StreamResponse:
            import json

            body = await request.json()
            chat = request.path.endswith("chat/completions")
            prompt = (" ".join(str(m.get("content", "")) for m in body.get("messages", []))
                      if chat else str(body.get("prompt", "")))
            if self.delay_s:  # cut short when the server stops (no wait at exit)
                self._release = self._release or asyncio.Event()
                try:
                    await asyncio.wait_for(self._release.wait(), self.delay_s)
                except TimeoutError:
                    pass
            words = prompt.split()[: int(body.get("max_tokens") or 16)] or ["ok"]
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for w in words:
                choice = ({"index": 0, "delta": {"content": " " + w}} if chat
                          else {"index": 0, "text": " " + w})
                await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode()
                                 + b"\n\n")
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words)}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                             + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp

        app = web.Application(middlewares=[web.middleware(log)])
        info = {"model_path": self.model, "version": "0.5.4", "tp_size": 1}
        app.router.add_get("/health", ok({}))
        app.router.add_get("/ready", ok({}))
        app.router.add_get("/metrics", text(METRICS))
        app.router.add_get("/server_info", ok(info))
        app.router.add_get("/get_server_info", ok(info))
        app.router.add_get("/v1/models", ok(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}))
        for path in ("/flush_cache", "/start_profile", "/stop_profile",
                     "/update_weights_from_disk"):
            app.router.add_post(path, text("done"))
        app.router.add_get("/flush_cache", text("done"))
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/chat/completions", completions)
        return app

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> SGLangLike:
        from aiohttp import web

        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def start() -> None:
                self._runner = web.AppRunner(self._app(), access_log=None)
                await self._runner.setup()
                site = web.TCPSite(self._runner, "127.0.0.1", 0)
                await site.start()
                self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
                ready.set()

            loop.run_until_complete(start())
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="sglang-like", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the SGLang-like server did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._loop is not None:
            if self._release is not None:
                self._loop.call_soon_threadsafe(self._release.set)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
