"""A loopback relay that puts a library's own HTTP client under the one outbound client:
`forge eval accuracy`'s lm_eval (requests or aiohttp, whichever its concurrency picks) is
given the relay's URL, and every request it sends goes on through `outbound.fetch`.

Contract:
- `Relay(upstream, timeout_s=, max_bytes=)`, a context manager, listens on 127.0.0.1 (an
  ephemeral port) while it is open; `url` is where the library sends, under a random path
  (another local process cannot guess its way to the upstream through it). A request to `url`
  goes to `upstream` through `outbound.fetch`: the address the caller's production check
  resolved, `timeout_s` as the deadline of the whole response, `max_bytes` as its cap, no
  redirect followed; the upstream's status, content type and body come back. Any other path
  is a 404 and nothing is sent.
- A request the client cut or refused (deadline, cap, a redirect, unreachable) is answered
  502 with its one-line error, and `errors` keeps it (the first ones, in order): the caller
  reports that rather than the library's own account of a 502, and fails a run that had one
  even if the library carried on.
"""

from __future__ import annotations

import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..errors import HarnessError
from . import outbound

_FORWARDED = ("content-type", "accept", "authorization")
_KEEP_ERRORS = 5


class Relay:
    def __init__(self, upstream: str, *, timeout_s: float,
                 max_bytes: int = outbound.DEFAULT_MAX_BYTES):
        self.upstream, self.timeout_s, self.max_bytes = upstream, timeout_s, max_bytes
        self.errors: list[str] = []
        self._path = f"/{secrets.token_hex(16)}"
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                relay._forward(self, "POST")

            def do_GET(self) -> None:  # noqa: N802
                relay._forward(self, "GET")

            def log_message(self, *args: Any) -> None:  # not on forge's stderr
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{self._path}"

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _forward(self, h: BaseHTTPRequestHandler, method: str) -> None:
        if h.path != self._path:
            return self._reply(h, 404, b"not the relay's path", "text/plain")
        n = int(h.headers.get("Content-Length") or 0)  # the library's own request
        body = h.rfile.read(n) if n > 0 else None
        headers = {k: v for k, v in h.headers.items() if k.lower() in _FORWARDED}
        try:
            r = outbound.fetch(method, self.upstream, body=body, headers=headers,
                               timeout_s=self.timeout_s, max_bytes=self.max_bytes,
                               max_redirects=0)
            if 300 <= r.status < 400:  # never handed on: the library would follow it
                r.ok(method)
        except HarnessError as e:
            with self._lock:
                if len(self.errors) < _KEEP_ERRORS:
                    self.errors.append(str(e))
            return self._reply(h, 502, str(e).encode(), "text/plain")
        self._reply(h, r.status, r.body, r.headers.get("content-type", "application/json"))

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:  # the library gave up on it
            pass
