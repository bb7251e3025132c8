"""The shared part of the scripted model APIs a real coding-agent client is pointed at
(scripted_messages.py: Anthropic Messages, for Claude Code; scripted_responses.py: OpenAI
Responses, for Codex): a loopback HTTP server that answers the agent's turns from a script and
keeps everything it was sent.

A script is a list of turns. A turn is one of:

- `{"text": "..."}` — a final answer (the client's run ends);
- `{"tool_calls": [{"name": "block_start", "arguments": {...}}], "text": "..."}` — tool calls
  (with an optional text before them). `name` is looked up among the tools the request offers:
  the exact name, else the one offered tool named `<prefix>__<name>` (clients prefix MCP
  tools, `mcp__forge__block_start`), so a script names forge's tools as forge does;
- `{"status": 529, "body": "..."}` — an HTTP error;
- a callable `(request_json, api) -> turn` — computed when its request comes (from the tool
  results the client sent back: `api.result_json(tool)`; from the tools offered:
  `api.offers(request_json, tool)`); it may queue turns to come next (`api.then`).

Only the agent's turns take from the script (`is_turn`: a request that offers tools); a
client's side requests (a title, a quota probe) get a short text and are kept in `side`.
A turn that cannot be answered (the script is exhausted, a tool is not offered) is answered
with an HTTP 400 whose message says why, and the reason is kept in `errors`, so a test fails
on it by name instead of on a client's retry loop.
"""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = dict[str, Any] | Callable[[dict[str, Any], "ScriptedApi"], dict[str, Any]]


@dataclass(frozen=True)
class ToolCall:
    """A call the script made: the id the client must answer with, the offered name."""

    call_id: str
    name: str
    arguments: dict[str, Any] | str
    namespace: str | None = None  # a tool offered inside a namespace (Responses)


@dataclass(frozen=True)
class Received:
    """One request as it came: method, path, lower-case headers, JSON body."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)


class ApiError(Exception):
    """A turn the server cannot answer (answered 400 with this message)."""


class ScriptedApi:
    """The server; a protocol subclass says which paths it serves and how it writes turns."""

    protocol = "?"
    id_prefix = "call_"  # how the protocol's call ids look

    def __init__(self, script: Iterable[Turn] = (), model: str = "scripted-model"):
        self.script: list[Turn] = list(script)
        self.model = model
        self.received: list[Received] = []  # every request, in order
        self.turns: list[dict[str, Any]] = []  # the requests that took a turn
        self.side: list[dict[str, Any]] = []  # the client's side requests
        self.calls: list[ToolCall] = []  # every tool call the script made
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._servers: list[socketserver.BaseServer] = []
        self._dir: str | None = None
        self._port = 0
        self._n = 0

    # --- what a protocol says ------------------------------------------------------------

    def route(self, method: str, path: str, body: dict[str, Any],
              headers: dict[str, str]) -> tuple[int, Any] | None:
        """Answer a request that is not a turn (a models list, a token count), or None."""
        raise NotImplementedError

    def turn_path(self, path: str) -> bool:
        raise NotImplementedError

    def is_turn(self, req: dict[str, Any]) -> bool:
        """Whether a request is the agent's turn (it offers tools), not a side request."""
        return bool(req.get("tools"))

    def offered(self, req: dict[str, Any]) -> list[tuple[str | None, str]]:
        """The tools a request offers: (namespace or None, name)."""
        raise NotImplementedError

    def tool_results(self, req: dict[str, Any]) -> dict[str, list[str]]:
        """The results the client sent back in this request: their text parts, by call id
        (a client may add parts of its own: Codex puts "Wall time: …" before forge's)."""
        raise NotImplementedError

    def stream(self, req: dict[str, Any], turn: dict[str, Any], calls: list[ToolCall],
               n: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """The turn as SSE events: (event name, data)."""
        raise NotImplementedError

    def whole(self, req: dict[str, Any], turn: dict[str, Any], calls: list[ToolCall],
              n: int) -> dict[str, Any]:
        """The turn as one JSON body (a request that did not ask to stream)."""
        raise NotImplementedError

    # --- the script ----------------------------------------------------------------------

    def add(self, *turns: Turn) -> None:
        with self._lock:
            self.script.extend(turns)

    def then(self, *turns: Turn) -> None:
        """Queue turns before the rest of the script (from a callable turn)."""
        with self._lock:
            self.script[:0] = turns

    def offers(self, req: dict[str, Any], name: str) -> bool:
        """Whether the request offers tool `name` (as `resolve` finds it)."""
        try:
            self.resolve(req, name)
        except ApiError:
            return False
        return True

    def result_of(self, name: str, req: dict[str, Any] | None = None) -> list[str]:
        """The text parts the client sent back for the script's last call of tool `name`
        (in `req`, by default the request being answered)."""
        req = req if req is not None else self.turns[-1]
        results = self.tool_results(req)
        for c in reversed(self.calls):
            if c.name.split("__")[-1] == name and c.call_id in results:
                return results[c.call_id]
        raise ApiError(f"no result for a call of {name!r} in the request")

    def result_json(self, name: str, req: dict[str, Any] | None = None) -> Any:
        """The JSON a tool answered (forge answers JSON text): the last part that parses."""
        parts = self.result_of(name, req)
        for part in reversed(parts):
            try:
                return json.loads(part)
            except json.JSONDecodeError:
                continue
        raise ApiError(f"the result of {name!r} has no JSON part: {parts!r:.300}")

    def resolve(self, req: dict[str, Any], name: str) -> tuple[str | None, str]:
        """The offered tool a script's `name` means: (namespace, name)."""
        tools = self.offered(req)
        full = {f"{ns}__{n}" if ns else n: (ns, n) for ns, n in tools}
        if name in full:
            return full[name]
        hits = [k for k in full if k.endswith(f"__{name}")]
        if len(hits) != 1:
            raise ApiError(f"tool {name!r} is not offered (or is ambiguous): "
                           f"{sorted(full)[:60]}")
        return full[hits[0]]

    def _next_turn(self, req: dict[str, Any]) -> tuple[dict[str, Any], list[ToolCall], int]:
        with self._lock:
            self.turns.append(req)
            if not self.script:
                raise ApiError(f"script exhausted after {self._n} turns")
            turn = self.script.pop(0)
            self._n += 1
            n = self._n
        if callable(turn):
            turn = turn(req, self)
        calls = []
        for i, c in enumerate(turn.get("tool_calls") or []):
            ns, name = self.resolve(req, c["name"])
            calls.append(ToolCall(f"{self.id_prefix}{n}_{i}", name, c.get("arguments", {}), ns))
        with self._lock:
            self.calls.extend(calls)
        return turn, calls, n

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> ScriptedApi:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: Any) -> None:
                return None

            def _send(self, code: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client left: nobody to answer

            def _sse(self, events: Iterator[tuple[str, dict[str, Any]]]) -> None:
                # HTTP/1.0 (the handler's default): the stream ends when the connection
                # closes, no length or chunking needed.
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                    for name, data in events:
                        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode(errors="replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                path = self.path.split("?")[0]
                with outer._lock:
                    outer.received.append(Received(method, self.path, headers, body))
                routed = outer.route(method, path, body, headers)
                if routed is not None:
                    self._send(*routed)
                    return
                if method != "POST" or not outer.turn_path(path):
                    self._send(404, {"error": {"type": "not_found", "message": path}})
                    return
                if not outer.is_turn(body):
                    with outer._lock:
                        outer.side.append(body)
                    turn: dict[str, Any] = {"text": "ok"}
                    calls: list[ToolCall] = []
                    k = 0
                else:
                    try:
                        turn, calls, k = outer._next_turn(body)
                    except ApiError as e:
                        with outer._lock:
                            outer.errors.append(str(e))
                        self._send(400, outer.error_body(str(e)))
                        return
                if "status" in turn:
                    self._send(int(turn["status"]), str(turn.get("body", "")).encode())
                elif body.get("stream"):
                    self._sse(outer.stream(body, turn, calls, k))
                else:
                    self._send(200, outer.whole(body, turn, calls, k))

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

        self._dir = tempfile.mkdtemp(prefix="scripted-api-")
        tcp = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        unix = _UnixHTTPServer(os.path.join(self._dir, "api.sock"), Handler)
        for s in (tcp, unix):
            s.daemon_threads = True
            # A short poll: stop() returns at once (shutdown waits for the loop to look)
            threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True).start()
        self._servers = [tcp, unix]
        self._port = int(tcp.server_address[1])
        return self

    def error_body(self, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "invalid_request_error",
                                           "message": message}}

    def stop(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()
        self._servers = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ScriptedApi:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        """`http://127.0.0.1:PORT` on this machine's loopback."""
        assert self._servers, "start() first"
        return f"http://127.0.0.1:{self._port}"

    @property
    def socket_path(self) -> str:
        """The same server on a Unix socket: reachable from inside a network namespace
        (loopback_bridge.py gives it a loopback port there)."""
        assert self._dir is not None, "start() first"
        return os.path.join(self._dir, "api.sock")


class _UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    """http.server's handler on a Unix socket (the handler reads `client_address` only to
    log, which ours does not)."""

    daemon_threads = True


def arguments_text(c: ToolCall) -> str:
    """A call's arguments as the JSON text a model streams (a string is sent as is)."""
    return c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)


def words(obj: Any) -> int:
    """A rough token count of a request or a reply (words of its JSON): usage is data only."""
    return len(json.dumps(obj).split())


def text_parts(content: Any) -> list[str]:
    """A tool result's content as text parts: a string, or a list of content items with
    `text` (Messages' text blocks, Responses' input_text items)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(x.get("text", "")) for x in content if isinstance(x, dict) and "text" in x]
    return [json.dumps(content)]
