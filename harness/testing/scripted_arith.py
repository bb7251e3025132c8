"""A local OpenAI-protocol server that answers arithmetic questions: the engine boundary for
accuracy tests (harness/bench/accuracy.py; lm_eval's `local-completions` and
`local-chat-completions` models talk to it as to a real engine).

`POST /v1/completions` (`prompt`: a string or a list of strings, one choice per prompt) and
`POST /v1/chat/completions` (the last user message) answer non-streaming with ` <value>`,
the value of the last `What is A op B?` in the prompt (op one of + - *), or ` I don't know`
when there is none. When lettered choices follow that question (`A. 7` lines, as lm_eval's
MMLU prompts list them) the answer is the letter of the value's choice (` I don't know`
when no choice holds it). `corrupt_every=N` (N >= 2) alters the answer (value + 1) of every N-th
distinct question the server sees (the N-th, 2N-th, ...): exactly one answer in N is wrong,
and a question asked again gets the same answer (retries do not shift the count); which
questions are altered follows the request order (lm_eval sends in a fixed order). `altered`
holds the altered questions; `requests` counts the completion requests. `GET /v1/models` lists the
model; `GET /health` answers 200.

    with ScriptedArith(corrupt_every=5) as srv:   # srv.url is http://127.0.0.1:PORT
        ...
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

QUESTION = re.compile(r"What is (-?\d+) ([+\-*]) (-?\d+)\?")
CHOICE = re.compile(r"^([A-Z])\. (.*)$", re.M)


def solve(prompt: str) -> tuple[str, int] | None:
    """The last question in `prompt` and its value; None when there is none."""
    found = QUESTION.findall(prompt)
    if not found:
        return None
    a, op, b = found[-1]
    x, y = int(a), int(b)
    return f"What is {a} {op} {b}?", x + y if op == "+" else x - y if op == "-" else x * y


class ScriptedArith:
    def __init__(self, corrupt_every: int = 0, model: str = "scripted-arith"):
        if corrupt_every == 1 or corrupt_every < 0:
            raise ValueError(f"corrupt_every {corrupt_every}: 0 (never) or >= 2")
        self.corrupt_every = corrupt_every
        self.model = model
        self.altered: list[str] = []
        self.requests = 0
        self._seen: dict[str, bool] = {}  # question -> altered
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _answer(self, prompt: str) -> str:
        solved = solve(prompt)
        if solved is None:
            return " I don't know"
        q, val = solved
        with self._lock:
            if q not in self._seen:
                n = len(self._seen) + 1
                self._seen[q] = bool(self.corrupt_every) and n % self.corrupt_every == 0
                if self._seen[q]:
                    self.altered.append(q)
            bad = self._seen[q]
        value = str(val + 1 if bad else val)
        letters = {text.strip(): letter
                   for letter, text in CHOICE.findall(prompt[prompt.rfind(q):])}
        if letters:
            return f" {letters[value]}" if value in letters else " I don't know"
        return f" {value}"

    def start(self) -> ScriptedArith:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: Any) -> None:
                return None

            def _send(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": outer.model, "object": "model", "owned_by": "forge"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("body is not an object")
                except ValueError as e:
                    self._send(400, {"error": f"bad JSON: {e}"})
                    return
                created = int(time.time())
                if self.path == "/v1/completions":
                    prompts = body.get("prompt", "")
                    prompts = prompts if isinstance(prompts, list) else [prompts]
                    with outer._lock:
                        outer.requests += 1
                    choices = [{"index": i, "text": outer._answer(str(p)), "logprobs": None,
                                "finish_reason": "stop"} for i, p in enumerate(prompts)]
                    self._send(200, {"id": f"cmpl-{outer.requests}", "object": "text_completion",
                                     "created": created, "model": outer.model,
                                     "choices": choices, "usage": {}})
                elif self.path == "/v1/chat/completions":
                    msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
                    user = [str(m.get("content", "")) for m in msgs if m.get("role") == "user"]
                    with outer._lock:
                        outer.requests += 1
                    text = outer._answer(user[-1] if user else "").strip()
                    self._send(200, {"id": f"chat-{outer.requests}", "object": "chat.completion",
                                     "created": created, "model": outer.model,
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant",
                                                              "content": text}}],
                                     "usage": {}})
                else:
                    self._send(404, {"error": "not found"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedArith:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
