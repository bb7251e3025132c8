"""The scripted server with SGLang's profiler endpoints, for `forge perf capture` tests and
benchmarks.

Speaks the protocol of the SGLang release given by `--version` (default the latest the
harness knows), as its own source has it (sglang/srt/entrypoints/http_server.py): `/server_info`
(from 0.5.6; `/get_server_info` before) answers `{model_path, version}`; `POST /start_profile`
with a JSON body reads the fields that release's request type has
(harness/data/sglang_profile_req.json, generated from the wheels) and drops any other key
silently, as the real server's pydantic schema does (`extra_behavior="ignore"`); it answers
`Start profiling.`; a second start while profiling answers 500 (the scheduler's "Profiling
is already in progress. Call /stop_profile first."). `POST /stop_profile` answers `Stop
profiling. This will take some time.` after writing one gzipped chrome trace per rank,
`[<profile_prefix>-]<profile_id>-TP-<rank>.trace.json.gz` (profile_id: the body's, else the
time), into the start's output_dir (default $SGLANG_TORCH_PROFILER_DIR, else /tmp), as
SGLang's scheduler does (profiler_manager.py); without a start it answers 500. With
`num_steps` it stops by itself after that many generation requests (a request standing for a
forward step) and a later /stop_profile answers 500; with `profile_by_stage` too, it writes
the first stage's files (`-EXTEND`) after `num_steps` requests and the second's (`-DECODE`)
after as many more. `merge_profiles` adds `merged-<profile_id>.trace.json.gz` (every rank's
events in one trace, as SGLang's ProfileMerger writes on rank 0). The trace written is
`--trace FILE` (a chrome trace recorded by the caller, e.g.
torch.profiler's `export_chrome_trace`), verbatim per rank. Everything else is the scripted
server's.

Run: `python -m infer_forge.harness.testing.scripted_profiler --port 0 --trace T.json
--ranks 2` (prints `listening on URL`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from .scripted_server import MODEL, Script, ScriptedServer

LATEST = "0.5.23"
SERVER_INFO_SINCE = (0, 5, 6)  # /server_info and /model_info; /get_server_info before
# The table harness/engines/sglang_profile_req.py reads and checks against the wheels (read
# here as data: the stand-ins sit below the engines).
TABLE = Path(__file__).resolve().parents[1] / "data" / "sglang_profile_req.json"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def fields_for(version: str) -> set[str]:
    """The body fields `/start_profile` of `version` reads."""
    fields = json.loads(TABLE.read_text(encoding="utf-8"))["fields"]
    return {f for f, since in fields.items() if _release(since) <= _release(version)}
TEXT = b"text/plain; charset=utf-8"


class ProfilingServer(ScriptedServer):
    def __init__(self, trace: bytes, ranks: int = 1, version: str = LATEST, **kwargs):
        super().__init__(**kwargs)
        self.trace, self.ranks, self.version = trace, ranks, version
        self.fields = fields_for(version)
        self.info_path = ("/server_info" if _release(version) >= SERVER_INFO_SINCE
                          else "/get_server_info")
        self.profiling: dict | None = None
        self.steps = 0
        self.written: list[str] = []

    def handle(self, proto, req):
        plain = proto._plain
        if req.method == "GET" and req.path == self.info_path:
            info = {"model_path": self.script.model, "version": self.version}
            proto._write(plain(200, orjson.dumps(info), req.close))
            return None
        if req.path not in ("/start_profile", "/stop_profile") or req.method not in (
                "GET", "POST"):
            out = super().handle(proto, req)
            if (self.profiling is not None and self.profiling.get("num_steps")
                    and req.method == "POST" and req.path in ("/v1/completions",
                                                             "/v1/chat/completions",
                                                             "/generate")):
                self._step()
            return out
        if req.path == "/start_profile":
            try:
                body = orjson.loads(req.body) if req.body.strip() else {}
                if not isinstance(body, dict):
                    raise ValueError("body is not an object")
            except ValueError as e:
                proto._write(plain(400, orjson.dumps({"error": f"bad JSON: {e}"}), req.close))
                return None
            body = {k: v for k, v in body.items() if k in self.fields}  # the rest: dropped
            if self.profiling is not None:
                proto._write(plain(500, b"Profiling is already in progress. Call "
                                   b"/stop_profile first.", req.close, TEXT))
                return None
            body.setdefault("profile_id", str(time.time()))
            self.profiling, self.steps = body, 0
            proto._write(plain(200, b"Start profiling.\n", req.close, TEXT))
            return None
        if self.profiling is None:
            proto._write(plain(500, b"Profiling is not in progress. Call /start_profile first.",
                               req.close, TEXT))
            return None
        self._write("")
        self.profiling = None
        proto._write(plain(200, b"Stop profiling. This will take some time.\n", req.close,
                           TEXT))
        return None


    def _step(self) -> None:
        """One forward step under a self-stopping capture (num_steps)."""
        p = self.profiling
        assert p is not None
        self.steps += 1
        n = int(p["num_steps"])
        if not p.get("profile_by_stage"):
            if self.steps >= n:
                self._write("")
                self.profiling = None
            return
        if self.steps == n:
            self._write("-EXTEND")
        elif self.steps == 2 * n:
            self._write("-DECODE")
            self.profiling = None

    def _write(self, stage: str) -> None:
        p = self.profiling or {}
        out = Path(p.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp"))
        out.mkdir(parents=True, exist_ok=True)
        prefix = f"{p['profile_prefix']}-" if p.get("profile_prefix") else ""
        pid = p.get("profile_id") or str(time.time())
        for rank in range(self.ranks):
            path = out / f"{prefix}{pid}-TP-{rank}{stage}.trace.json.gz"
            path.write_bytes(gzip.compress(self.trace))
            self.written.append(str(path))
        if p.get("merge_profiles"):
            events = orjson.loads(self.trace).get("traceEvents", []) * self.ranks
            path = out / f"merged-{pid}.trace.json.gz"
            path.write_bytes(gzip.compress(orjson.dumps({"traceEvents": events})))
            self.written.append(str(path))


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m infer_forge.harness.testing.scripted_profiler")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--trace", required=True, help="chrome trace JSON written per rank")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--version", default=LATEST, help="the SGLang release to speak as")
    a = ap.parse_args(list(argv) if argv is not None else None)
    ProfilingServer(Path(a.trace).read_bytes(), a.ranks, a.version,
                    script=Script(itl_ms=a.itl_ms, model=a.model), host=a.host,
                    port=a.port).serve_until_interrupted()


if __name__ == "__main__":
    main()
