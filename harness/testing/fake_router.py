"""A stand-in for `python -m sglang_router.launch_router` (the SGLang model gateway), for
tests and benchmarks of whole deployments where SGLang cannot run. Standard library only;
run it as a script or with `-m`.

Flags, as the real router takes them: `--pd-disaggregation`, `--prefill URL [BOOTSTRAP_PORT]`
(repeatable), `--decode URL` (repeatable), `--worker-urls URL ...` (regular mode), `--host`,
`--port`, `--policy` (accepted; round robin here). Others are accepted and ignored.

HTTP interface (the gateway's): `GET /health` and `/liveness` (always 200), `/readiness`
(200 when every worker answers its /health, else 503), `GET /workers`
(`{"workers": [{id, url, model_id, worker_type: regular|prefill|decode, is_healthy, load,
connection_mode, bootstrap_port}], "total", "stats": {prefill_count, decode_count,
regular_count}}`), `GET /v1/models` (from a worker), and `POST /v1/completions`,
`/v1/chat/completions`, `/generate` (a streamed answer is passed on whole, with its content
type): regular mode forwards to one worker; PD mode adds `bootstrap_host`, `bootstrap_port`,
`bootstrap_room` and sends the request to a prefill and a decode server at once, answering
with the decode server's response. As the real `sglang-router` 0.3.2 (the plan's default;
checked against it by tests/harness/engines/test_real_router.py): a `/v1/completions` request
without `model` is a 422 (a chat request without one is routed), a chat request's
`max_tokens` goes on as `max_completion_tokens` (smg 1.13 answers 400 and keeps max_tokens),
there is no `/list_workers` and no `/metrics` on the entry port (the real router's metrics
are on its `--prometheus-port`, which this stand-in does not serve). FAKE_ROUTER_MODE=crash
exits while starting.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JSON = "application/json"


def parse(argv: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"pd": False, "prefill": [], "decode": [], "workers": [],
                           "host": "127.0.0.1", "port": 30000}
    i = 0
    while i < len(argv):
        a = argv[i]
        vals: list[str] = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            vals.append(argv[i + 1])
            i += 1
        if a == "--pd-disaggregation":
            out["pd"] = True
        elif a == "--prefill":
            boot = vals[1] if len(vals) > 1 and vals[1].lower() != "none" else None
            out["prefill"].append((vals[0], int(boot) if boot else None))
        elif a == "--decode":
            out["decode"].append(vals[0])
        elif a == "--worker-urls":
            out["workers"] += vals
        elif a == "--host":
            out["host"] = vals[0]
        elif a == "--port":
            out["port"] = int(vals[0])
        i += 1
    return out


def _call(method: str, url: str, body: bytes | None = None, timeout: float = 60.0
          ) -> tuple[int, bytes, str]:
    """(status, body, content type); a connection failure is status 0."""
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type", JSON)
    except urllib.error.HTTPError as e:
        return e.code, e.read() or b"", JSON
    except (urllib.error.URLError, OSError):
        return 0, b"", JSON


def main(argv: list[str]) -> int:
    if "--help" in argv:
        print(__doc__)
        return 0
    cfg = parse(argv)
    print(f"[fake router] args={json.dumps(cfg, sort_keys=True)}", flush=True)
    if os.environ.get("FAKE_ROUTER_MODE") == "crash":
        print("Error: failed to bind the router (stand-in crash)", flush=True)
        return 1
    if cfg["pd"] and not (cfg["prefill"] and cfg["decode"]):
        print("Error: PD mode needs --prefill and --decode workers", flush=True)
        return 2
    workers: list[dict[str, Any]] = []
    if cfg["pd"]:
        workers += [{"url": u, "worker_type": "prefill", "bootstrap_port": b}
                    for u, b in cfg["prefill"]]
        workers += [{"url": u, "worker_type": "decode", "bootstrap_port": None}
                    for u in cfg["decode"]]
    else:
        workers += [{"url": u, "worker_type": "regular", "bootstrap_port": None}
                    for u in cfg["workers"]]
    for i, w in enumerate(workers):
        w["id"] = f"worker-{i}"
    rr = {t: itertools.cycle([w for w in workers if w["worker_type"] == t])
          for t in ("prefill", "decode", "regular") if any(w["worker_type"] == t
                                                           for w in workers)}
    lock = threading.Lock()

    def pick(kind: str) -> dict[str, Any]:
        with lock:
            return next(rr[kind])

    def healthy(w: dict[str, Any]) -> bool:
        return _call("GET", w["url"] + "/health", timeout=5.0)[0] == 200

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            print("[fake router] " + fmt % args, flush=True)

        def send(self, code: int, body: bytes | str, ctype: str = JSON) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/health", "/liveness"):
                return self.send(200, "")
            if path == "/readiness":
                ok = all(healthy(w) for w in workers)
                return self.send(200 if ok else 503, json.dumps({"ready": ok}))
            if path == "/workers":
                listed = [{"id": w["id"], "url": w["url"], "model_id": "default",
                           "worker_type": w["worker_type"], "is_healthy": healthy(w),
                           "load": 0, "connection_mode": "Http",
                           "bootstrap_port": w["bootstrap_port"]} for w in workers]
                stats = {f"{t}_count": sum(w["worker_type"] == t for w in workers)
                         for t in ("prefill", "decode", "regular")}
                return self.send(200, json.dumps({"workers": listed, "total": len(listed),
                                                  "stats": stats}))
            if path == "/v1/models":
                target = pick("decode" if cfg["pd"] else "regular")
                code, body, ctype = _call("GET", target["url"] + path)
                return self.send(code or 502, body, ctype)
            return self.send(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b"{}"
            if path not in ("/v1/completions", "/v1/chat/completions", "/generate"):
                return self.send(404, json.dumps({"detail": "Not Found"}))
            try:
                req = json.loads(raw or b"{}")
            except ValueError:
                return self.send(400, "Failed to parse the request body as JSON", "text/plain")
            if path == "/v1/completions" and "model" not in req:  # chat's model is optional
                return self.send(422, "Failed to deserialize the JSON body into the target "
                                 "type: missing field `model`", "text/plain; charset=utf-8")
            if path == "/v1/chat/completions" and "max_tokens" in req:
                req.setdefault("max_completion_tokens", req.pop("max_tokens"))
            raw = json.dumps(req).encode()
            if not cfg["pd"]:
                code, body, ctype = _call("POST", pick("regular")["url"] + path, raw)
                return self.send(code or 502, body, ctype)
            prefill, decode = pick("prefill"), pick("decode")
            host = urllib.parse.urlsplit(prefill["url"]).hostname
            req.update(bootstrap_host=host, bootstrap_port=prefill["bootstrap_port"],
                       bootstrap_room=random.getrandbits(63))
            data = json.dumps(req).encode()
            got: dict[str, tuple[int, bytes, str]] = {}
            t = threading.Thread(target=lambda: got.update(p=_call("POST", prefill["url"]
                                                                    + path, data)))
            t.start()
            code, body, ctype = _call("POST", decode["url"] + path, data)
            t.join()
            if got["p"][0] != 200:
                return self.send(502, json.dumps({"detail": f"prefill {prefill['url']}: "
                                                            f"HTTP {got['p'][0]}"}))
            return self.send(code or 502, body, ctype)

    server = ThreadingHTTPServer((cfg["host"], cfg["port"]), Handler)
    print(f"[fake router] listening on http://{cfg['host']}:{cfg['port']} "
          f"({len(workers)} workers)", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
