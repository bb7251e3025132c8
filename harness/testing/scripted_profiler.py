"""The scripted server with SGLang's profiler endpoints, for `forge perf capture` tests and
benchmarks.

Speaks SGLang's protocol (python/sglang/srt/entrypoints/http_server.py): `POST /start_profile`
with a JSON `ProfileReqInput` (output_dir, start_step, num_steps, activities, with_stack,
record_shapes, profile_by_stage, profile_id, merge_profiles; unknown fields 400) answers
`Start profiling.`; a second start while profiling answers 500 (the scheduler's "Profiling
is already in progress. Call /stop_profile first."). `POST /stop_profile` answers `Stop
profiling. This will take some time.` after writing one gzipped chrome trace per rank,
`<time>-TP-<rank>.trace.json.gz`, into the start's output_dir (default
$SGLANG_TORCH_PROFILER_DIR, else /tmp), as SGLang's scheduler does; without a start it
answers 500. The trace written is `--trace FILE` (a chrome trace recorded by the caller, e.g.
torch.profiler's `export_chrome_trace`), verbatim per rank. Everything else is the scripted
server's.

Run: `python -m infer_forge.harness.testing.scripted_profiler --port 0 --trace T.json
--ranks 2` (prints `listening on URL`).
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from .scripted_server import MODEL, Script, ScriptedServer

PROFILE_FIELDS = {"output_dir", "start_step", "num_steps", "activities", "with_stack",
                  "record_shapes", "profile_by_stage", "profile_id", "merge_profiles"}
TEXT = b"text/plain; charset=utf-8"


class ProfilingServer(ScriptedServer):
    def __init__(self, trace: bytes, ranks: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.trace, self.ranks = trace, ranks
        self.profiling: dict | None = None
        self.written: list[str] = []

    def handle(self, proto, req):
        plain = proto._plain
        if req.path not in ("/start_profile", "/stop_profile") or req.method not in (
                "GET", "POST"):
            return super().handle(proto, req)
        if req.path == "/start_profile":
            try:
                body = orjson.loads(req.body) if req.body.strip() else {}
                if not isinstance(body, dict):
                    raise ValueError("body is not an object")
            except ValueError as e:
                proto._write(plain(400, orjson.dumps({"error": f"bad JSON: {e}"}), req.close))
                return None
            bad = sorted(set(body) - PROFILE_FIELDS)
            if bad:
                proto._write(plain(400, orjson.dumps({"detail": f"unknown fields {bad}"}),
                                   req.close))
                return None
            if self.profiling is not None:
                proto._write(plain(500, b"Profiling is already in progress. Call "
                                   b"/stop_profile first.", req.close, TEXT))
                return None
            self.profiling = body
            proto._write(plain(200, b"Start profiling.\n", req.close, TEXT))
            return None
        if self.profiling is None:
            proto._write(plain(500, b"Profiling is not in progress. Call /start_profile first.",
                               req.close, TEXT))
            return None
        out = Path(self.profiling.get("output_dir") or
                   os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp"))
        out.mkdir(parents=True, exist_ok=True)
        stamp = str(time.time())
        for rank in range(self.ranks):
            path = out / f"{stamp}-TP-{rank}.trace.json.gz"
            path.write_bytes(gzip.compress(self.trace))
            self.written.append(str(path))
        self.profiling = None
        proto._write(plain(200, b"Stop profiling. This will take some time.\n", req.close,
                           TEXT))
        return None


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m infer_forge.harness.testing.scripted_profiler")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--trace", required=True, help="chrome trace JSON written per rank")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--model", default=MODEL)
    a = ap.parse_args(list(argv) if argv is not None else None)
    ProfilingServer(Path(a.trace).read_bytes(), a.ranks,
                    script=Script(itl_ms=a.itl_ms, model=a.model), host=a.host,
                    port=a.port).serve_until_interrupted()


if __name__ == "__main__":
    main()
