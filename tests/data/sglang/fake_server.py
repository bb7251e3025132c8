"""A stand-in for `python -m sglang.launch_server` (SGLang cannot run without a GPU here).

It parses the launch flags (and `--config YAML`) the way the real server does, then serves
the recorded 0.5.x responses beside this file over the real HTTP protocol: /health,
/health_generate, /server_info + /model_info (from 0.5.6), /get_server_info +
/get_model_info, /metrics, /v1/models, /start_profile, /stop_profile, /flush_cache, and
/v1/completions (`stream: true`: SSE), /v1/chat/completions and /generate that echo the
prompt and name the server's `--disaggregation-mode`. Their streams have the chunks SGLang
0.5.23's serving_completions.py, serving_chat.py and http_server.py's /generate write (see
openai_stream, Handler.native); the real bench clients of 0.4.0, 0.5.1, 0.5.6 and 0.5.23 run
against them in tests/harness/bench/test_real_bench_client*.py. Which routes it answers
follows the version it claims (FAKE_SGLANG_VERSION, default the recorded server_info's) and
its role, as the real releases' apps do (`routes()`; checked against each release's own
http_server source by tests/harness/engines/test_sglang_routes.py): an `--encoder-only`
server answers only its health, profile and (from 0.5.21, with --enable-metrics) metrics
routes, like the real encoder app — no info, no text routes. Each POST is logged with its
body's keys and bootstrap fields (`[fake sglang] request PATH {...}`), so a test can see what
a router sent. Every `--disaggregation-bootstrap-port` / `--encoder-bootstrap-port` it is
given is bound (as the real prefill and language-only servers bind them), so a port clash
fails its start. `--help` prints the recorded help text.
FAKE_SGLANG_MODE: "ok" (default), "crash" (dies while starting, like a CUDA OOM),
"slow:N" (503 for the first N health checks), FAKE_SGLANG_METRICS=FILE serves that
/metrics page; "malformed" (truncated server_info and
unparsable metrics), "die-after:N" (exits after N requests, i.e. mid-benchmark).
FAKE_SGLANG_ITL_MS=D: a decode that takes D ms per token. Each stream (OpenAI routes and
/generate) is then written event by event with chunked encoding, as uvicorn streams, every
token after the first D ms after the one before; unset or 0, a stream is one body as before.
"""

import json
import os
import shlex
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODE = os.environ.get("FAKE_SGLANG_MODE", "ok")
# Strict: /metrics only with --enable-metrics, as the real server. Off by default because
# older tests start the stand-in without the flag and scrape it.
ROUTES_STRICT = os.environ.get("FAKE_SGLANG_ROUTES") == "strict"
STATE = {"health": 0, "requests": 0, "profiling": False}
# The per-token decode time a stream shows (the SGLang-shaped repository's builds set it
# from their decode loop: tests/helpers/sglang_repo.py).
ITL_MS = float(os.environ.get("FAKE_SGLANG_ITL_MS") or 0)
OPTS: dict = {}  # the parsed launch flags


MINIMAL_TRACE = {"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=1]", "ts": 0, "dur": 10,
     "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 5, "pid": 1, "tid": 1}]}


def host_path(path):
    """Where a file this server writes at `path` lands as the host sees it: `path` itself on
    the host; in a (stand-in) container, through a read-write volume, else in the
    container's own filesystem (tests/helpers/fake_docker.py)."""
    mounts = os.environ.get("FAKE_DOCKER_MOUNTS")
    if mounts is None:
        return Path(path)
    p = Path(path)
    for src, dst, mode in json.loads(mounts):
        if mode == "rw" and (p == Path(dst) or Path(dst) in p.parents):
            return Path(src) / p.relative_to(dst)
    return (Path(os.environ["FAKE_DOCKER_STATE"]) / "container-fs"
            / os.environ.get("FAKE_DOCKER_CONTAINER", "anonymous") / str(p).lstrip("/"))


def write_traces(req):
    """/stop_profile: one gzipped chrome trace per TP rank into the start's output_dir
    (default $SGLANG_TORCH_PROFILER_DIR; the real server's last default, /tmp, is left out
    so that tests do not litter it), named as SGLang's scheduler names them
    (`<profile_id>-TP-<rank>.trace.json.gz`). The trace: FAKE_SGLANG_TRACE (a file), else a
    minimal one."""
    import gzip

    where = req.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR")
    if not where:
        return
    src = os.environ.get("FAKE_SGLANG_TRACE")
    data = Path(src).read_bytes() if src else json.dumps(MINIMAL_TRACE).encode()
    out = host_path(where)
    out.mkdir(parents=True, exist_ok=True)
    pid = req.get("profile_id") or str(time.time())
    for rank in range(int(OPTS.get("tp_size") or OPTS.get("tp") or 1)):
        (out / f"{pid}-TP-{rank}.trace.json.gz").write_bytes(gzip.compress(data))


def parse_args(argv):
    opts, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            i += 1
            continue
        key = a[2:].replace("-", "_")
        vals = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            vals.append(argv[i + 1])
            i += 1
        opts[key] = True if not vals else (vals[0] if len(vals) == 1 else vals)
        i += 1
    if "config" in opts:
        import yaml

        data = yaml.safe_load(Path(opts.pop("config")).read_text())
        for k, v in data.items():
            opts.setdefault(k.replace("-", "_"), v)
    return opts


def _version(v):
    return tuple(int(x) for x in (str(v).split(".") + ["0", "0"])[:3])


def routes(version, encoder_only, enable_metrics):
    """{(method, path)} this stand-in answers, as the real release's app of that role does."""
    v = _version(version)
    if encoder_only:
        out = {("GET", "/health"), ("GET", "/health_generate"), ("POST", "/start_profile"),
               ("POST", "/stop_profile")}
        if enable_metrics and v >= (0, 5, 21):
            out.add(("GET", "/metrics"))
        return out
    out = {("GET", "/health"), ("GET", "/health_generate"), ("GET", "/get_server_info"),
           ("GET", "/get_model_info"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
           ("POST", "/v1/chat/completions"), ("POST", "/generate"), ("POST", "/flush_cache"),
           ("POST", "/start_profile"), ("POST", "/stop_profile")}
    if v >= (0, 5, 6):
        out |= {("GET", "/server_info"), ("GET", "/model_info")}
    if enable_metrics:
        out.add(("GET", "/metrics"))
    return out


def bind_bootstrap_ports(opts, version):
    """Hold the ports a real server of this role binds besides its own: a prefill server its
    `--disaggregation-bootstrap-port` (default 8998), a `--language-only` one from 0.5.13 its
    `--encoder-bootstrap-port` (default 8997). A port in use fails the start, as it would."""
    import socket

    want = []
    if opts.get("disaggregation_mode") == "prefill":
        want.append(int(opts.get("disaggregation_bootstrap_port", 8998)))
    if opts.get("language_only") and _version(version) >= (0, 5, 13):
        want.append(int(opts.get("encoder_bootstrap_port", 8997)))
    held = []
    for port in want:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((opts.get("host", "127.0.0.1"), port))
        except OSError as e:
            print(f"[fake sglang] bootstrap port {port}: {e}", flush=True)
            sys.exit(1)
        s.listen(8)
        held.append(s)
    return held


def note_request(path, body):
    """Log what arrived (its keys, bootstrap fields): a test reads what a router forwarded."""
    try:
        req = json.loads(body or b"{}")
    except ValueError:
        req = None
    if isinstance(req, dict):
        seen = {"keys": sorted(req), **{k: req[k] for k in ("bootstrap_host", "bootstrap_port",
                                                            "bootstrap_room", "model",
                                                            "max_tokens",
                                                            "max_completion_tokens")
                                        if k in req}}
        print(f"[fake sglang] request {path} {json.dumps(seen, sort_keys=True)}", flush=True)


def typed(v):
    if isinstance(v, (bool, int, float, list)):
        return v
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def tokens_of(prompt, limit, ignore_eos):
    """The generated words: the prompt echoed, up to `limit`; with `ignore_eos` (as the bench
    client asks) the echo repeats until exactly `limit`, else it stops at the prompt's end
    (where a model would emit EOS)."""
    words = prompt.split() or ["ok"]
    if limit is None:
        return words
    limit = max(0, int(limit))
    if ignore_eos:
        return [words[k % len(words)] for k in range(limit)]
    return words[:limit]


def openai_stream(chat, rid, req, words, finish, usage):
    """The SSE events (each `(text, carries_a_token)`) serving_chat.py /
    serving_completions.py write: completions, one chunk per token (the last carries
    `finish_reason`); chat, a first chunk with the role and empty
    content, a chunk per token, then a `finish_reason` chunk with an empty delta. A usage
    chunk with `"choices": []` only when `stream_options.include_usage` is set (or the server
    runs with --stream-response-default-include-usage); `data: [DONE]` last."""
    created, model = int(time.time()), req.get("model")
    head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": model}
    chunks = []
    if chat:
        def choice(delta, fin=None):
            return {"index": 0, "delta": {"reasoning_content": None, **delta},
                    "logprobs": None, "finish_reason": fin, "matched_stop": None}
        chunks.append({**head, "choices": [choice({"role": "assistant", "content": ""})]})
        chunks += [{**head, "choices": [choice({"content": " " + w})]} for w in words]
        chunks.append({**head, "choices": [choice({}, finish)]})
    else:
        for k, w in enumerate(words):
            chunks.append({**head, "choices": [{
                "index": 0, "text": " " + w, "logprobs": None,
                "finish_reason": finish if k == len(words) - 1 else None,
                "matched_stop": None}], "usage": None})
    options = req.get("stream_options") or {}
    if options.get("include_usage") or opts_include_usage():
        # UsageInfo as each route dumps it: completions with exclude_none, chat whole.
        full = {"prompt_tokens": usage["prompt_tokens"], "total_tokens": usage["total_tokens"],
                "completion_tokens": usage["completion_tokens"], "prompt_tokens_details": None,
                "reasoning_tokens": 0, "completion_tokens_details": None}
        chunks.append({**head, "choices": [], "usage": full if chat else
                       {k: v for k, v in full.items() if v is not None}})
    first = 1 if chat else 0  # chat's role chunk carries no token
    return [(f"data: {json.dumps(c)}\n\n", first <= k < first + len(words))
            for k, c in enumerate(chunks)] + [("data: [DONE]\n\n", False)]


def opts_include_usage():
    return bool(OPTS.get("stream_response_default_include_usage"))


def main():
    argv = sys.argv[1:]
    if argv[:2] == ["-m", "sglang.launch_server"]:
        argv = argv[2:]
    if "--help" in argv or "-h" in argv:
        print((HERE / "help.txt").read_text())
        return 0
    opts = parse_args(argv)
    OPTS.update(opts)
    print(f"[fake sglang] server_args={json.dumps(opts, sort_keys=True)}", flush=True)
    if ITL_MS:
        print(f"[fake sglang] decode delay {ITL_MS:g} ms per token", flush=True)
    if MODE == "crash":
        print("Traceback (most recent call last):\n  File \"model_runner.py\", line 412\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
              flush=True)
        return 1
    info_name = "server_info_truncated.json" if MODE == "malformed" else "server_info.json"
    info_text = (HERE / info_name).read_text()
    version = os.environ.get("FAKE_SGLANG_VERSION") or "0.5.23"
    served = routes(version, bool(opts.get("encoder_only")),
                    bool(opts.get("enable_metrics")) or not ROUTES_STRICT)
    if int(opts.get("node_rank", 0)) >= 1:  # a follower rank: SGLang's dummy health server
        served = {("GET", "/health"), ("GET", "/health_generate"), ("GET", "/ping")}
    held = bind_bootstrap_ports(opts, version)
    if MODE != "malformed":
        info = json.loads(info_text)
        info["version"] = version
        # As ServerArgs resolves it: the served name is the model path unless given.
        info["served_model_name"] = opts.get("model_path", info["served_model_name"])
        for k, v in opts.items():
            info[k] = typed(v)
        info["launch_command"] = shlex.join(["python", "-m", "sglang.launch_server", *argv])
        info_text = json.dumps(info)
    model_info = json.loads((HERE / "model_info.json").read_text())
    model_info["model_path"] = opts.get("model_path", model_info["model_path"])
    # 0.5.23's route answers these from the server's own settings (the recorded keys are
    # the release's: tests/harness/engines/test_stand_in_server_info.py)
    model_info["served_model_name"] = opts.get("served_model_name", model_info["model_path"])
    model_info["disaggregation_mode"] = str(opts.get("disaggregation_mode", "null"))
    metrics = (Path(os.environ["FAKE_SGLANG_METRICS"]) if os.environ.get("FAKE_SGLANG_METRICS")
               else HERE / ("metrics_malformed.txt" if MODE == "malformed" else "metrics.txt")
               ).read_text()
    slow = int(MODE.split(":")[1]) if MODE.startswith("slow:") else 0
    die_after = int(MODE.split(":")[1]) if MODE.startswith("die-after:") else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):
            print("[fake sglang] " + fmt % args, flush=True)

        def send(self, code, body, ctype="application/json"):
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.sent()

        def sent(self):
            STATE["requests"] += 1
            if die_after is not None and STATE["requests"] >= die_after:
                os._exit(3)

        def stream(self, events):
            """An SSE stream of `(text, carries_a_token)` events: one body, or with ITL_MS
            each event as its own chunk, every token after the first ITL_MS later."""
            if not ITL_MS:
                return self.send(200, "".join(text for text, _ in events), "text/event-stream")
            self.protocol_version = "HTTP/1.1"  # chunked encoding is HTTP/1.1's
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            tokens = 0
            for text, token in events:
                if token:
                    if tokens:
                        time.sleep(ITL_MS / 1000)  # the decode step of this token
                    tokens += 1
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.sent()

        def do_GET(self):
            path = self.path.split("?")[0]
            if ("GET", path) not in served:
                return self.send(404, json.dumps({"detail": "Not Found"}))
            if path in ("/health", "/health_generate"):
                STATE["health"] += 1
                if STATE["health"] <= slow:
                    return self.send(503, "")
                return self.send(200, "")
            if path in ("/server_info", "/get_server_info"):
                return self.send(200, info_text)
            if path in ("/model_info", "/get_model_info"):
                return self.send(200, json.dumps(model_info))
            if path == "/metrics":
                return self.send(200, metrics, "text/plain; version=0.0.4")
            if path == "/v1/models":
                mid = opts.get("served_model_name") or opts.get("model_path")
                return self.send(200, json.dumps({"object": "list", "data": [
                    {"id": mid, "object": "model", "owned_by": "sglang", "root": mid}]}))
            return self.send(404, json.dumps({"detail": "Not Found"}))

        def generate(self, path, body):
            # A role answers as itself: an encoder serves no text; prefill and decode
            # servers say which they are (the stand-in router's tests read it back from
            # non-streamed bodies and /generate's meta_info; no real client reads it).
            if opts.get("encoder_only"):
                return self.send(400, json.dumps({"detail": "encoder-only server"}))
            req = json.loads(body or b"{}")
            role = str(opts.get("disaggregation_mode") or "null")
            chat = path.endswith("chat/completions")
            if path == "/generate":
                prompt = str(req.get("text", ""))
                limit = (req.get("sampling_params") or {}).get("max_new_tokens")
                ignore_eos = (req.get("sampling_params") or {}).get("ignore_eos")
            else:
                prompt = (" ".join(str(m.get("content", "")) for m in req.get("messages", []))
                          if chat else str(req.get("prompt", "")))
                # What the real server generates up to: chat reads max_completion_tokens
                # (max_tokens is its deprecated alias); completions default to 16 tokens.
                limit = (req.get("max_completion_tokens") or req.get("max_tokens")) if chat \
                    else req.get("max_tokens", 16)
                ignore_eos = req.get("ignore_eos")
            words = tokens_of(prompt, limit, ignore_eos)
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words),
                     "total_tokens": len(prompt.split()) + len(words)}
            finish = "length" if limit is not None and len(words) >= int(limit) else "stop"
            if path == "/generate":
                return self.native(req, prompt, words, finish, role)
            rid = f"{STATE['requests']:032x}"
            if req.get("stream"):
                return self.stream(openai_stream(chat, rid, req, words, finish, usage))
            text = " ".join(words)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": None, "finish_reason": finish, "matched_stop": None}
                      if chat else {"index": 0, "text": text, "logprobs": None,
                                    "finish_reason": finish, "matched_stop": None})
            out = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": req.get("model"),
                   "choices": [choice], "usage": usage, "disaggregation_mode": role}
            return self.send(200, json.dumps(out))

        def native(self, req, prompt, words, finish, role):
            """/generate as http_server + tokenizer_manager answer it: one object, or (stream)
            an SSE event per token whose `text` is the whole text so far (cumulative, unless
            --incremental-streaming-output) with `meta_info.completion_tokens` so far, the
            last with `finish_reason`, then `data: [DONE]`."""
            rid = f"{STATE['requests']:032x}"
            incremental = bool(opts.get("incremental_streaming_output"))

            def event(k, done):
                meta = {"id": rid, "finish_reason": ({"type": finish, "length": k}
                                                     if finish == "length" else
                                                     {"type": "stop", "matched": 2})
                        if done else None,
                        "prompt_tokens": len(prompt.split()), "weight_version": "default",
                        "reasoning_tokens": 0, "completion_tokens": k, "cached_tokens": 0,
                        "disaggregation_mode": role}
                if done:
                    meta["e2e_latency"] = 0.001
                text = (" " + words[k - 1]) if incremental and k else " ".join(words[:k])
                ids = [k - 1] if incremental and k else list(range(k))
                return {"text": text, "output_ids": ids, "meta_info": meta}

            if not req.get("stream"):
                return self.send(200, json.dumps(event(len(words), True)))
            events = [event(k, k == len(words)) for k in range(1, len(words) + 1)] or \
                [event(0, True)]
            return self.stream([(f"data: {json.dumps(e)}\n\n", bool(words)) for e in events]
                               + [("data: [DONE]\n\n", False)])

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            path = self.path.split("?")[0]
            if ("POST", path) not in served:
                return self.send(404, json.dumps({"detail": "Not Found"}))
            note_request(path, body)
            if path == "/start_profile":
                req = json.loads(body or b"{}")
                if not isinstance(req, dict):
                    return self.send(422, json.dumps({"detail": "expected an object"}))
                STATE["profiling"], STATE["profile"] = True, req
                print(f"[fake sglang] start_profile {json.dumps(req, sort_keys=True)}",
                      flush=True)
                return self.send(200, "Start profiling.\n", "text/plain")
            if path == "/stop_profile":
                if not STATE["profiling"]:
                    return self.send(400, "Profiling is not in progress.\n", "text/plain")
                STATE["profiling"] = False
                write_traces(STATE.get("profile") or {})
                return self.send(200, "Stop profiling. This will take some time.\n",
                                 "text/plain")
            if path in ("/v1/completions", "/v1/chat/completions", "/generate"):
                return self.generate(path, body)
            if path == "/flush_cache":
                return self.send(200, "Cache flushed.\nPlease check backend logs for more "
                                 "details. (When there are running or waiting requests, the "
                                 "operation will not be performed.)\n", "text/plain")
            return self.send(404, json.dumps({"detail": "Not Found"}))

    server = ThreadingHTTPServer((opts.get("host", "127.0.0.1"), int(opts.get("port", 30000))),
                                 Handler)
    print(f"[fake sglang] Uvicorn running on http://{server.server_address[0]}:"
          f"{server.server_address[1]}", flush=True)
    server.serve_forever()
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
