"""A scripted OpenAI Responses API on loopback, to see what a real client sends (the tools it
offers the model) and to make it call one tool, without a model.

    python3 responses_probe.py LOG SCRIPT -- CMD [ARG…]

serves `POST …/responses` on 127.0.0.1 (a free port), runs CMD with every `{url}` in its
arguments replaced by the API's base URL (`http://127.0.0.1:PORT/v1`), and exits with CMD's
status. Each request body is appended to LOG (JSON lines). SCRIPT is a JSON file: a list of
replies, each a list of output items (`{"type": "message", …}`, `{"type": "function_call",
…}`); request n gets reply n (the last one again past the end), streamed as the Responses
API's server-sent events. Run it in the client's network namespace (agent_clients.run):
the client then reaches only this.

Standard library only: it runs with the system Python inside the namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _events(n: int, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rid = f"resp_{n}"
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 2}
    out: list[dict[str, Any]] = [{"type": "response.created", "response": {
        "id": rid, "object": "response", "status": "in_progress", "output": []}}]
    for i, item in enumerate(output):
        out.append({"type": "response.output_item.done", "output_index": i, "item": item})
    out.append({"type": "response.completed", "response": {
        "id": rid, "object": "response", "status": "completed", "output": output,
        "usage": usage}})
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: responses_probe.py LOG SCRIPT -- CMD [ARG…]", file=sys.stderr)
        return 2
    log, script_path, cmd = argv[0], argv[1], argv[3:]
    with open(script_path) as f:
        script: list[list[dict[str, Any]]] = json.load(f)
    lock = threading.Lock()
    seen = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the client's output matters
            pass

        def do_GET(self) -> None:  # model lists: none beyond the configured one
            body = b'{"object": "list", "data": []}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                n = seen[0]
                seen[0] += 1
                with open(log, "a") as f:
                    f.write(raw.decode("utf-8", "replace").replace("\n", " ") + "\n")
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for event in _events(n, script[min(n, len(script) - 1)]):
                self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                                 .encode())
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        return subprocess.run([a.replace("{url}", url) for a in cmd]).returncode
    finally:
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
