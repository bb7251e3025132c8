"""The `hf` engine: `transformers serve` on a pulled model (the embedded CPU default).

What `transformers serve` is in the installed transformers 5.x (read from its source,
`transformers/cli/serve.py` and `transformers/cli/serving/`):
- `transformers serve [FORCE_MODEL]` — a FastAPI/uvicorn app. With FORCE_MODEL (a local
  directory works: it is kept as given, no `@revision`) the model is loaded *before* uvicorn
  starts, so `/health` answering 200 means the model is loaded. Requests may omit `model` or
  must repeat the FORCE_MODEL string exactly (else 400 "Server is pinned to ..."); `/v1/models`
  lists that one id.
- Routes: POST `/v1/completions` (legacy, `prompt` string; streaming SSE ends with a chunk
  carrying `usage`), `/v1/chat/completions`, `/v1/responses`, `/v1/systemone`,
  `/v1/audio/transcriptions`, `/load_model`, `/reset`; GET `/v1/models`, `/health`
  (503 when the continuous-batching worker died). No `/metrics`, no profiler.
- Unknown request fields -> 422 (`ignore_eos`, `min_tokens`); `stream_options`, `n`, `user`
  are accepted and ignored; `seed`, `top_p`, `temperature`, `max_tokens` work.
- Flags: `--continuous-batching/--no-continuous-batching`, `--cb-block-size`,
  `--cb-num-blocks`, `--cb-max-batch-tokens`, `--cb-max-memory-percent`,
  `--cb-use-cuda-graph/--no-...`, `--attn-implementation`, `--dtype` (auto or a torch dtype
  name), `--compile/--no-compile`, `--device`, `--default-seed`, `--quantization`,
  `--host`, `--port`, `--log-level`, `--trust-remote-code`, `--model-timeout`.
- The CLI entry checks PyPI for updates unless HF_HUB_DISABLE_UPDATE_CHECK=1; we set it and
  HF_HUB_OFFLINE=1 (the model is local).
- tiny-llama (random weights) never emits eos in practice: completions run to `max_tokens`.
- Continuous batching sizes its KV cache, unless told (`--cb-num-blocks` or
  `--cb-max-memory-percent`), at 60% of the host's free memory on the CPU, and touches it on
  the first request: the tiny model's server grew to 14 GB and its first request took ~50 s of
  page faults on the 24 GiB build machine (then 0.2 s). See `CPU_CB_NUM_BLOCKS`.
- Start time on the 2-core build machine: ~9 s idle, up to ~25 s when the cores are busy
  (python + torch + transformers imports dominate; loading tiny-llama takes <1 s).

Engine configuration keys (a runtime profile's `engine` config): see `HF_KEYS`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..models.weights import model_path
from ..proc import stat_fields
from .base import (
    Engine,
    EventSink,
    ManagedEngine,
    apply_overrides,
    check_keys,
    log_dir,
    request_json,
    start_server,
)
from .process import free_port

# flag-carrying keys -> their value type
HF_FLAGS: dict[str, type] = {
    "continuous_batching": bool,
    "cb_block_size": int,
    "cb_num_blocks": int,
    "cb_max_batch_tokens": int,
    "cb_max_memory_percent": float,
    "cb_use_cuda_graph": bool,
    "attn_implementation": str,
    "dtype": str,
    "compile": bool,
    "device": str,
    "default_seed": int,
    "quantization": str,
    "log_level": str,
    "trust_remote_code": bool,
}
# harness-side keys: not flags
HF_HARNESS_KEYS = {"startup_timeout_s", "env", "threads"}
HF_KEYS = set(HF_FLAGS) | HF_HARNESS_KEYS
DEFAULTS: dict[str, Any] = {"device": "cpu", "dtype": "auto", "continuous_batching": False,
                            "compile": False, "log_level": "info"}
DTYPES = {"auto", "float32", "float16", "bfloat16"}
# A CPU server with continuous batching whose profile does not size the KV cache gets this many
# blocks of 256 tokens (16,384 tokens: ~1 GB for a 1B-class model in float32), recorded in the
# launch's resolved arguments. Without it transformers takes 60% of the free memory (see the
# module doc), so a run's memory and first-request time depend on what else the host holds.
CPU_CB_NUM_BLOCKS = 64


def resolve_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults + config, validated: unknown keys and wrongly typed values are errors."""
    check_keys("hf", config, HF_KEYS)
    out = {**DEFAULTS, **config}
    for key, kind in HF_FLAGS.items():
        if key not in out or out[key] is None:
            continue
        value = out[key]
        ok = isinstance(value, bool) if kind is bool else (
            isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
            else isinstance(value, kind) and not isinstance(value, bool))
        if not ok:
            raise HarnessError(f"hf engine config: {key}={value!r}: expected {kind.__name__}")
    if out["dtype"] not in DTYPES:
        raise HarnessError(f"hf engine config: dtype={out['dtype']!r}: expected one of "
                           f"{', '.join(sorted(DTYPES))}")
    if (out["continuous_batching"] and out["device"] == "cpu"
            and out.get("cb_num_blocks") is None and out.get("cb_max_memory_percent") is None):
        out["cb_num_blocks"] = CPU_CB_NUM_BLOCKS
    return out


def hf_command(config: Mapping[str, Any], *, model: str | Path, port: int,
               host: str = "127.0.0.1", python: str = sys.executable) -> list[str]:
    """The `transformers serve` command line for a resolved configuration."""
    cmd = [python, "-m", "transformers.cli.transformers", "serve", str(model),
           "--host", host, "--port", str(port)]
    for key, kind in HF_FLAGS.items():
        value = config.get(key)
        if value is None or (key.startswith("cb_") and not config.get("continuous_batching")):
            continue  # --cb-* only mean something with continuous batching
        flag = "--" + key.replace("_", "-")
        if kind is bool:
            cmd.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            cmd += [flag, str(value)]
    return cmd


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in ("transformers", "torch", "tokenizers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


class HFRunning(ManagedEngine):
    def describe(self) -> dict[str, Any]:
        info = self.base_description()
        info["server_info"] = {"models": request_json("GET", self.base_url + "/v1/models",
                                                      timeout=10)}
        return info

    def metrics(self) -> dict[str, Any]:
        """transformers serve has no /metrics: the server process's own CPU time and RSS."""
        self.check()
        return process_metrics(self.server.pid)


def process_metrics(pid: int | None) -> dict[str, float]:
    if pid is None:
        return {}
    fields = stat_fields(pid)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    if fields is None:
        return {}
    ticks = os.sysconf("SC_CLK_TCK")
    out = {"process_cpu_seconds": (int(fields[11]) + int(fields[12])) / ticks,
           "process_threads": float(fields[17])}
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            out["process_rss_bytes"] = float(line.split()[1]) * 1024
    return out


class HFEngine(Engine):
    name = "hf"

    def launch(self, config: Mapping[str, Any], *, model: str | Path | None = None,
               ws: Workspace | None = None,
               overrides: Mapping[str, Any] | None = None, stream: str | None = None,
               event_fields: Mapping[str, Any] | None = None, logs: Path | None = None,
               host: str = "127.0.0.1", port: int | None = None) -> HFRunning:
        resolved = resolve_config(apply_overrides(config, overrides))
        model_dir = _model_dir(model, ws)
        port = port or free_port(host)
        cmd = hf_command(resolved, model=model_dir, port=port, host=host)
        env = {"HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
               **{str(k): str(v) for k, v in (resolved.get("env") or {}).items()}}
        if resolved.get("threads"):
            env["OMP_NUM_THREADS"] = str(resolved["threads"])
        base_url = f"http://{host}:{port}"
        sink = EventSink(ws, stream, event_fields)
        log_path = log_dir(ws, logs) / f"hf-{port}-{os.getpid()}.log"
        server = start_server("hf", cmd, base_url=base_url, health_path="/health", ws=ws,
                              sink=sink, log_path=log_path, env=env,
                              startup_timeout_s=float(resolved.get("startup_timeout_s", 180)))
        running = HFRunning("hf", server, base_url=base_url, model=str(model_dir),
                            config=resolved, sink=sink, versions=_versions())
        try:
            info = running.describe()
            sink.launched("hf", cmd, base_url, server.pid,
                          {**info["server_info"], "resolved_args": info["resolved_args"],
                           "versions": info["versions"]})
        except BaseException:
            running.stop(reason="error")
            raise
        return running


def _model_dir(model: str | Path | None, ws: Workspace | None) -> Path:
    if model is None:
        raise HarnessError("hf engine: no model given (pull one with `forge weights pull`)")
    p = Path(model)
    if p.is_dir():
        return p.resolve()
    if ws is None:
        raise HarnessError(f"hf engine: model {str(model)!r} is not a directory")
    return model_path(ws.home, str(model)).resolve()
