"""`forge wiki serve`: the static site on 127.0.0.1 plus `/api/search?q=…&k=…` (semantic
search from a warm `Retriever`; the search page merges it with its own text search)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..ledger.workspace import Workspace
from .chat import Post
from .errors import WikiError


class Handler(SimpleHTTPRequestHandler):
    retriever: Any = None

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        return

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        url = urlparse(self.path)
        if url.path == "/api/search":
            self._search(parse_qs(url.query))
            return
        if url.path == "/":
            self.path = "/index.html"
        super().do_GET()

    def _search(self, qs: dict[str, list[str]]) -> None:
        q = (qs.get("q") or [""])[0].strip()
        try:
            k = max(1, min(50, int((qs.get("k") or ["10"])[0])))
        except ValueError:
            k = 10
        if self.retriever is None:
            self._json(503, {"error": "semantic search unavailable (no embeddings)"})
            return
        results = self.retriever.search(q, k) if q else []
        self._json(200, {"query": q, "results": results})

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def make_server(site_dir: Path, port: int, retriever: Any) -> ThreadingHTTPServer:
    if not (site_dir / "index.html").exists():
        raise WikiError(f"no site at {site_dir}: run `forge wiki build`")
    handler = type("ForgeHandler", (Handler,), {"retriever": retriever})
    try:
        return ThreadingHTTPServer(("127.0.0.1", port),
                                   partial(handler, directory=str(site_dir)))
    except OSError as e:
        raise WikiError(f"cannot listen on 127.0.0.1:{port}: {e.strerror or e}") from None


def serve(ws: Workspace, *, port: int = 8765, build_first: bool = True, embeddings: bool = True,
          echo: Callable[[str], None] = print, post: Post | None = None) -> None:
    """Build (unless fresh; `post` sends its narrative requests, wiki/chat.py), load the
    retriever, then serve until interrupted."""
    if build_first:
        # In the function for start-up time: the build (~300 ms) loads only when it runs first.
        from .build import build

        rep = build(ws, embeddings=embeddings, post=post)
        echo(f"wiki: {rep.pages} pages at position {rep.position}"
             + (" (fresh)" if rep.fresh else f", {rep.written} written"))
    retriever = None
    if embeddings:
        # In the function for start-up time: the retriever (~180 ms), with embeddings only.
        from .retrieve import Retriever

        retriever = Retriever.from_index(ws)
    server = make_server(Path(ws.home) / "site", port, retriever)
    host, real_port = server.server_address[:2]
    assert isinstance(host, str)  # an AF_INET address: (host, port)
    echo(f"serving http://{host}:{real_port}/index.html (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
