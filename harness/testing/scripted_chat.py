"""A local OpenAI-protocol chat server that answers from a script: the network boundary for
tests and benchmarks of agents (a capable LLM cannot run here).

`POST /v1/chat/completions` (non-streaming) pops the next scripted reply and answers it in the
wire format of a real server (`chat.completion` objects with `choices[0].message.content` /
`tool_calls`, `finish_reason`, `usage`). A scripted reply is one of:

- `{"content": "..."}` — a plain assistant message;
- `{"tool_calls": [{"name": "...", "arguments": {...} | "raw text"}]}` — tool calls (a string
  `arguments` is sent as is: malformed JSON stays malformed);
- `{"status": 503, "body": "..."}` — an HTTP error;
- `{"raw": "..."}` — a body that is not a chat completion;
- `{"delay_s": 2.0, ...}` — answer after a delay (a client timeout);
- a callable `(request_json) -> reply` — computed from the request.

`usage` is computed from the text (words) unless a reply gives `usage`. Every request body is
kept (`server.requests`) with its HTTP headers (`server.headers`, same order; names in lower
case) so a test can read what the agent was sent and how it authenticated. When the script is empty
the server answers 500 with `script exhausted`. `GET /v1/models` lists the model.

    with ScriptedChat([{"content": "hi"}]) as chat:   # chat.url is http://127.0.0.1:PORT/v1
        ...
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


class ScriptedChat:
    def __init__(self, script: Iterable[Reply] = (), model: str = "scripted-chat"):
        self.script: list[Reply] = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._n = 0

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> ScriptedChat:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: Any) -> None:
                return None

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client left (it timed out, or was killed): nobody to answer

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": outer.model, "object": "model", "owned_by": "forge"}]}).encode())
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    req = json.loads(self.rfile.read(n) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, b'{"error": "bad json"}')
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": "not found"}')
                    return
                code, body = outer._answer(req, {k.lower(): v for k, v in self.headers.items()})
                self._send(code, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedChat:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    # --- answers -------------------------------------------------------------------------

    def _answer(self, req: dict[str, Any], headers: dict[str, str] | None = None
                ) -> tuple[int, bytes]:
        with self._lock:
            self.requests.append(req)
            self.headers.append(headers or {})
            if not self.script:
                return 500, b'{"error": {"message": "script exhausted"}}'
            reply = self.script.pop(0)
            self._n += 1
            n = self._n
        if callable(reply):
            reply = reply(req)
        if reply.get("delay_s"):
            time.sleep(float(reply["delay_s"]))  # the scripted latency of a slow endpoint
        if "status" in reply:
            return int(reply["status"]), str(reply.get("body", "")).encode()
        if "raw" in reply:
            return 200, str(reply["raw"]).encode()
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        finish = "stop"
        if reply.get("tool_calls"):
            calls = []
            for i, c in enumerate(reply["tool_calls"]):
                args = c.get("arguments", {})
                calls.append({"id": f"call_{n}_{i}", "type": "function", "function": {
                    "name": c["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args)}})
            message["tool_calls"] = calls
            finish = "tool_calls"
        prompt_words = sum(len(str(m.get("content") or "").split())
                           for m in req.get("messages", []))
        out_words = len(str(reply.get("content") or "").split()) + 8 * len(
            reply.get("tool_calls") or [])
        usage = reply.get("usage") or {"prompt_tokens": prompt_words,
                                       "completion_tokens": out_words,
                                       "total_tokens": prompt_words + out_words}
        body = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model") or self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage}
        return 200, json.dumps(body).encode()
