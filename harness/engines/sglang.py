"""The `sglang` engine: `python -m sglang.launch_server` from a runtime profile.

Configuration: keys are SGLang ServerArgs field names (`tp_size`, `chunked_prefill_size`,
`attention_backend`, `enable_torch_compile`, …), plus harness keys (`HARNESS_KEYS`):
`version` (else read from the installed sglang), `python`, `launcher` (argv replacing
`python -m sglang.launch_server`), `use_config_file` (pass options as `--config YAML`),
`check_flags` (validate every flag against the server's own `--help`), `extra_args`,
`env`, `startup_timeout_s`; `image` (`name@sha256:…`) and `image_fallback` (from the runtime
profile, `base.engine_config_of`): the server runs in that image by digest (image.py);
`check_args: false` skips the resolved-arguments check below (the version is still checked);
`nsys: true` (or `{cuda_graph_trace: node|graph}`) launches the server under Nsight Systems
(`nsys_launch.profile_argv`: recording only between SGLang's CUDA_PROFILER start and stop), its
report `<FORGE_HOME>/perf-traces/nsys/<stem>.nsys-rep` (`describe()["nsys_report"]`; `forge
perf nsys --report` records it); `nsys` must be on PATH (in the image, the image's own);
`role_config`, `router_launcher`, `router_args` are the deployment plan's (plan.py), never flags.

Flag mapping (`server_options`): booleans are bare flags (false: omitted), lists are nargs,
mappings are JSON, `chunked_prefill_size: disabled|false` is -1. Settings SGLang renamed are
spelled per the pinned release (`translate`), by whether that release's real parser has the
flag (the flag table, sglang_flags.py, generated from the released wheels), preferring the
spelling it does not mark deprecated; either spelling may be given:
  cuda_graph_max_bs          <-> cuda_graph_max_bs_decode (and _prefill, no old spelling)
  disable_cuda_graph: true   <-> cuda_graph_backend_{decode,prefill}: disabled
  enable_dp_attention + dp_size N  <-> attn_dp_size N
Then every option is checked against the table (`check_options`): a flag the release lacks,
or a value outside its choices, is a one-line HarnessError naming where the flag exists
(`sglang 0.5.6 has no --encoder-only (0.5.7 and later)`); `use_config_file` needs `--config`.
`--enable-metrics` is always added unless `enable_metrics: false` (needed for /metrics).

Running server: ready when `/health_generate` answers 200 (503 while starting);
At start the server's `/server_info` version must equal `version` (the profile's framework pin:
checked, not trusted) and every requested argument must resolve as asked (image.check_server);
a mismatch stops the server and fails the launch naming both values.
`describe()` reads `/server_info` (resolved args, `launch_command`, version, per-rank
`internal_states`) and `/model_info` — `/get_server_info`, `/get_model_info` before 0.5.6,
both tried when the version is unknown (sglang_routes.py); `metrics()` parses
`/metrics`; `start_profile/stop_profile/flush_cache` POST. Malformed answers are one-line
HarnessErrors.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import outbound
from ..guard.engine_sandbox import EngineSandbox, for_launch
from ..models.weights import model_path
from . import sglang_flags, sglang_profile_req
from .base import (
    Engine,
    EventSink,
    ManagedEngine,
    apply_overrides,
    log_dir,
    request_text,
    start_server,
)
from .image import (
    ImageUse,
    check_server,
    clear_stale_container,
    container_argv,
    container_name,
    ensure_image,
    image_launcher,
    image_use_of,
    model_mounts,
    owned,
    remove_container,
    uses_rdma,
)
from .image_resolve import resolve_use
from .metrics import parse_prometheus, summarize
from .nsys_launch import profile_argv
from .process import free_port
from .sglang_release import version_key
from .sglang_routes import get_info
from .trace_dir import trace_root

HARNESS_KEYS = {"version", "python", "launcher", "use_config_file", "check_flags", "extra_args",
                "env", "startup_timeout_s", "image", "image_fallback", "check_args", "nsys",
                # the deployment plan's (plan.py), never server flags
                "role_config", "router_launcher", "router_args"}
KEY_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# ServerArgs fields that are not flags of their own here: set by the harness.
RESERVED = {"host", "port", "model_path"}
SERVER_INFO_REQUIRED = ("model_path", "version")
PREFIX = "sglang:"


# --- versions and flags -----------------------------------------------------------------


parse_version = version_key  # the SGLang modules' one version parser (sglang_release)


def _spelling(version: str, mine: str, other: str) -> str:
    """Which of two spellings of one setting to pass to `version` (per the flag table):
    a non-deprecated one (the user's first), else a deprecated one that still works, else the
    user's (which check_options then refuses, naming where it exists)."""
    t = sglang_flags.table()
    for good in (lambda k: t.available(_flag(k), version) and not t.deprecated(_flag(k), version),
                 lambda k: t.available(_flag(k), version)):
        for key in (mine, other):
            if good(key):
                return key
    return mine


def translate(config: Mapping[str, Any], version: str | tuple) -> dict[str, Any]:
    """Spell the renamed settings the way this SGLang release's parser takes them (see the
    module docstring); which release has which flag is the flag table's (sglang_flags.py)."""
    v = ".".join(map(str, parse_version(version))) if isinstance(version, tuple) else version
    out = dict(config)
    # cuda_graph_max_bs <-> cuda_graph_max_bs_decode (the _prefill one has no old spelling)
    if "cuda_graph_max_bs" in out:
        if _spelling(v, "cuda_graph_max_bs", "cuda_graph_max_bs_decode") != "cuda_graph_max_bs":
            out.setdefault("cuda_graph_max_bs_decode", out.pop("cuda_graph_max_bs"))
    elif "cuda_graph_max_bs_decode" in out:
        if _spelling(v, "cuda_graph_max_bs_decode", "cuda_graph_max_bs") == "cuda_graph_max_bs":
            out["cuda_graph_max_bs"] = out.pop("cuda_graph_max_bs_decode")
    # disable_cuda_graph: true <-> cuda_graph_backend_{decode,prefill}: disabled
    if "disable_cuda_graph" in out:
        if not out["disable_cuda_graph"]:
            out.pop("disable_cuda_graph")
        elif _spelling(v, "disable_cuda_graph", "cuda_graph_backend_decode") != \
                "disable_cuda_graph":
            out.pop("disable_cuda_graph")
            out.setdefault("cuda_graph_backend_decode", "disabled")
            out.setdefault("cuda_graph_backend_prefill", "disabled")
    backends = {side: out[f"cuda_graph_backend_{side}"] for side in ("decode", "prefill")
                if f"cuda_graph_backend_{side}" in out}
    if backends and _spelling(v, "cuda_graph_backend_decode", "disable_cuda_graph") == \
            "disable_cuda_graph":
        if set(backends.values()) != {"disabled"} or len(backends) != 2:
            raise HarnessError(f"sglang {v} has no --cuda-graph-backend-* "
                               f"({sglang_flags.table().span('--cuda-graph-backend-decode')}); "
                               f"{backends} cannot be expressed there (only both 'disabled')")
        for side in backends:
            out.pop(f"cuda_graph_backend_{side}")
        out["disable_cuda_graph"] = True
    # enable_dp_attention + dp_size N <-> attn_dp_size N
    if "enable_dp_attention" in out:
        if not out["enable_dp_attention"]:
            out.pop("enable_dp_attention")
        elif _spelling(v, "enable_dp_attention", "attn_dp_size") != "enable_dp_attention":
            out.pop("enable_dp_attention")
            n = out.pop("dp_size", None) or out.get("attn_dp_size")
            if not n:
                raise HarnessError(f"sglang config: enable_dp_attention needs dp_size "
                                   f"(sglang {v}: attn_dp_size)")
            out["attn_dp_size"] = n
    elif "attn_dp_size" in out:
        if _spelling(v, "attn_dp_size", "enable_dp_attention") == "enable_dp_attention":
            n = out.pop("attn_dp_size")
            out["enable_dp_attention"] = True
            out.setdefault("dp_size", n)
    return out


def check_options(opts: Mapping[str, Any], version: str | tuple) -> None:
    """Every option that becomes a flag exists in that release, with a value among its
    choices (the flag table); else a one-line HarnessError naming where the flag exists."""
    v = ".".join(map(str, parse_version(version))) if isinstance(version, tuple) else version
    sglang_flags.check_options({_flag(k): val for k, val in opts.items()
                                if val is not None and val is not False}, v)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def server_options(config: Mapping[str, Any], version: str | tuple) -> dict[str, Any]:
    """The ServerArgs options (no harness keys), renamed for `version`, normalized."""
    opts = {k: v for k, v in config.items() if k not in HARNESS_KEYS}
    for k in opts:
        if not KEY_RE.match(k):
            raise HarnessError(f"sglang config: {k!r} is not a ServerArgs name (snake_case)")
        if k in RESERVED:
            raise HarnessError(f"sglang config: {k} is set by the harness (model, host, port)")
    opts = translate(opts, version)
    cps = opts.get("chunked_prefill_size")
    if cps is False or (isinstance(cps, str) and cps.lower() in ("disabled", "off", "none")):
        opts["chunked_prefill_size"] = -1
    opts.setdefault("enable_metrics", True)
    check_options(opts, version)
    return opts


def options_to_args(opts: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for key in sorted(opts):
        value = opts[key]
        if value is None or value is False:
            continue
        if value is True:
            args.append(_flag(key))
        elif isinstance(value, (list, tuple)):
            if value:
                args += [_flag(key), *(str(v) for v in value)]
        elif isinstance(value, Mapping):
            args += [_flag(key), json.dumps(value, sort_keys=True)]
        else:
            args += [_flag(key), str(value)]
    return args


def options_to_yaml(opts: Mapping[str, Any]) -> str:
    """The `--config` file: keys are flag names without `--` (SGLang turns each into a flag)."""
    data = {}
    for key in sorted(opts):
        value = opts[key]
        if value is None or value is False:
            continue
        data[key.replace("_", "-")] = (json.dumps(value, sort_keys=True)
                                       if isinstance(value, Mapping) else value)
    return yaml.safe_dump(data, sort_keys=True, default_flow_style=False)


def sglang_command(config: Mapping[str, Any], *, model: str | Path, port: int,
                   version: str | tuple, host: str = "127.0.0.1",
                   config_path: Path | None = None) -> tuple[list[str], str | None]:
    """(argv, YAML text or None). With `use_config_file`, options go to `config_path`."""
    opts = server_options(config, version)
    launcher = config.get("launcher") or [config.get("python") or sys.executable, "-m",
                                          "sglang.launch_server"]
    if isinstance(launcher, str) or not all(isinstance(x, str) for x in launcher):
        raise HarnessError("sglang config: launcher must be a list of strings")
    cmd = [*launcher, "--model-path", str(model), "--host", host, "--port", str(port)]
    yaml_text = None
    if config.get("use_config_file"):
        check_options({"config": str(config_path)}, version)
        if config_path is None:
            raise HarnessError("sglang: use_config_file needs a path for the YAML file")
        yaml_text = options_to_yaml(opts)
        cmd += ["--config", str(config_path)]
    else:
        cmd += options_to_args(opts)
    extra = config.get("extra_args") or []
    if isinstance(extra, str) or not all(isinstance(x, str) for x in extra):
        raise HarnessError("sglang config: extra_args must be a list of strings")
    return cmd + list(extra), yaml_text


def help_flags(help_text: str) -> set[str]:
    """Every `--flag` the server's `--help` mentions (not a word argparse broke across lines
    at a hyphen, `--api-` / `key`: its option line names it whole)."""
    return set(re.findall(r"(?<![\w-])(--[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)(?![\w-])",
                          help_text))


def check_flags(cmd: list[str], help_text: str, version: str) -> None:
    known = help_flags(help_text)
    if not known:
        raise HarnessError("sglang --help: no flags found in its output")
    unknown = [a.split("=", 1)[0] for a in cmd if a.startswith("--")
               and a.split("=", 1)[0] not in known]
    if unknown:
        raise HarnessError(f"sglang {version} does not accept {', '.join(unknown)} "
                           "(per its --help)")


def installed_version(python: str) -> str:
    try:
        r = subprocess.run([python, "-c", "import sglang; print(sglang.__version__)"],
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"sglang: cannot run {python}: {e}") from None
    if r.returncode != 0:
        raise HarnessError(f"sglang is not installed for {python} "
                           "(pip install 'infer-forge[sglang]', or set engine config 'version' "
                           "and 'launcher')")
    return r.stdout.strip()


# --- reading a server -------------------------------------------------------------------


def validate_server_info(info: Any, source: str = "/server_info") -> dict[str, Any]:
    if not isinstance(info, dict):
        raise HarnessError(f"{source}: expected a JSON object, got {type(info).__name__}")
    missing = [k for k in SERVER_INFO_REQUIRED if k not in info]
    if missing:
        raise HarnessError(f"{source}: missing {', '.join(missing)} (not an SGLang server info)")
    states = info.get("internal_states", [])
    if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
        raise HarnessError(f"{source}: internal_states must be a list of objects")
    return info


def resolved_args(info: Mapping[str, Any]) -> dict[str, Any]:
    """ServerArgs (and scheduler info) out of /server_info, without the bookkeeping keys."""
    return {k: v for k, v in info.items()
            if k not in ("internal_states", "version", "launch_command")}


class SGLangClient:
    """Reads and controls an SGLang server at `base_url` (used by sglang and external).
    `guard`: who calls, so each redirect hop passes the production guard (external)."""

    base_url: str
    guard: outbound.Guard | None = None

    def _sglang_version(self) -> str | None:
        """The version this client talks to when known (a managed server's pin), so the
        info routes are asked by their name in that version; None: try both."""
        versions = getattr(self, "versions", None)
        return versions.get("sglang") if isinstance(versions, Mapping) else None

    def server_info(self) -> dict[str, Any]:
        info, source = get_info(self.base_url, "server", self._sglang_version(),
                                guard=self.guard)
        return validate_server_info(info, source)

    def model_info(self) -> dict[str, Any]:
        info, source = get_info(self.base_url, "model", self._sglang_version(),
                                guard=self.guard)
        if not isinstance(info, dict) or "model_path" not in info:
            raise HarnessError(f"{source}: expected an object with model_path")
        return info

    def metrics_text(self) -> str:
        return request_text("GET", self.base_url + "/metrics", timeout=30, guard=self.guard)

    def scrape(self) -> dict[str, float]:
        source = self.base_url + "/metrics"
        summary = summarize(parse_prometheus(self.metrics_text(), source), PREFIX)
        if not summary:
            raise HarnessError(f"{source}: no {PREFIX} metrics (is --enable-metrics set?)")
        return summary

    def _post(self, path: str, payload: Any = None) -> dict[str, Any]:
        text = request_text("POST", self.base_url + path, payload, timeout=300,
                            guard=self.guard)
        return {"endpoint": path, "message": text.strip()}

    def _start_profile(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """POST /start_profile, after checking each option is one the server's release reads
        (it would drop any other silently: sglang_profile_req)."""
        version = self._sglang_version() or str(self.server_info()["version"])
        sglang_profile_req.check(options, version)
        payload = dict(options)
        if "output_dir" in payload:
            payload["output_dir"] = str(payload["output_dir"])
        return self._post("/start_profile", payload)


class SGLangRunning(ManagedEngine, SGLangClient):
    def __init__(self, *args: Any, yaml_text: str | None = None, help_digest: str | None = None,
                 image: ImageUse | None = None, container: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.yaml_text = yaml_text
        self.help_digest = help_digest
        self.image, self.container = image, container
        self.unreported_args: list[str] = []
        self.nsys_report: str | None = None  # the Nsight Systems report it writes (config nsys)

    def stop(self, reason: str = "teardown") -> None:
        try:
            super().stop(reason)
        finally:
            if self.image is not None and self.container is not None:
                remove_container(self.image, self.container)

    def describe(self) -> dict[str, Any]:
        info = self.base_description()
        si = self.server_info()
        info.update({
            "server_info": si, "model_info": self.model_info(), "version": si["version"],
            "resolved_args": resolved_args(si), "requested_args": dict(self.config),
            "server_launch_command": si.get("launch_command"),
        })
        self.versions.setdefault("sglang", si["version"])
        info["versions"] = dict(self.versions)
        if self.yaml_text is not None:
            info["config_yaml"] = self.yaml_text
        if self.help_digest:
            info["help_digest"] = self.help_digest
        if self.image is not None:
            info["image"] = {"ref": self.image.ref, "digest": self.image.digest,
                             "runtime": self.image.runtime.kind, "container": self.container}
        if self.unreported_args:
            info["unreported_args"] = list(self.unreported_args)
        if self.nsys_report is not None:
            info["nsys_report"] = self.nsys_report
        return info

    def metrics(self) -> dict[str, float]:
        self.check()
        return self.scrape()

    def start_profile(self, **options: Any) -> dict[str, Any]:
        self.check()
        return self._start_profile(options)

    def stop_profile(self) -> dict[str, Any]:
        self.check()
        return self._post("/stop_profile")

    def flush_cache(self) -> dict[str, Any]:
        self.check()
        return self._post("/flush_cache")


class SGLangEngine(Engine):
    name = "sglang"

    def launch(self, config: Mapping[str, Any], *, model: str | Path | None = None,
               ws: Workspace | None = None,
               overrides: Mapping[str, Any] | None = None, stream: str | None = None,
               event_fields: Mapping[str, Any] | None = None, logs: Path | None = None,
               host: str = "127.0.0.1", port: int | None = None) -> SGLangRunning:
        cfg = apply_overrides(config, overrides)
        if model is None:
            raise HarnessError("sglang engine: no model given (a hub id or a directory)")
        model_s = str(model)
        if ws is not None and not Path(model_s).exists() and "/" not in model_s:
            model_s = str(model_path(ws.home, model_s))
        python = cfg.get("python") or sys.executable
        def say(m: str) -> None:  # what the image steps tell the user, as they happen
            print(m, file=sys.stderr)

        use = resolve_use(ws, image_use_of(cfg, say=say), say=say)  # `resolve`: pinned now
        if use is not None and not cfg.get("version"):
            raise HarnessError(f"sglang: image {use.ref} needs the profile's framework.version "
                               "(the flags are built for it and the server is checked against it)")
        version = str(cfg.get("version") or installed_version(python))
        port = port or free_port(host)
        logs_dir = log_dir(ws, logs)
        logs_dir.mkdir(parents=True, exist_ok=True)
        stem = f"sglang-{port}-{os.getpid()}"
        cmd, yaml_text = sglang_command(cfg, model=model_s, port=port, version=version,
                                        host=host, config_path=logs_dir / f"{stem}.yaml")
        if yaml_text is not None:
            (logs_dir / f"{stem}.yaml").write_text(yaml_text, encoding="utf-8")
        help_digest = None
        if cfg.get("check_flags"):
            help_text = server_help(cmd, for_launch(ws, event_fields or {}))
            help_digest = ws.artifacts.put(help_text) if ws is not None else None
            if yaml_text is None:
                check_flags(cmd[cmd.index("--model-path"):], help_text, version)
        nsys_report = None
        if cfg.get("nsys"):  # after the flag check: the launcher's --help is SGLang's
            cmd, nsys_report = nsys_wrap(cmd, cfg["nsys"], ws.home if ws is not None
                                         else logs_dir, stem, in_image=use is not None,
                                         host_python=python)
        env = {str(k): str(v) for k, v in (cfg.get("env") or {}).items()}
        base_url = f"http://{host}:{port}"
        container = None
        if use is not None:  # pulled and its digest checked before anything starts
            ensure_image(use)
            container = container_name("sglang", port)
            clear_stale_container(use, container, say=say)
            # The profiler's trace root, read-write at its own path: /start_profile's
            # output_dir then names the same directory in the container and here.
            rw = [trace_root(ws.home)] if ws is not None else []
            cmd = owned(container_argv(use, cmd, name=container, env_names=env,
                                       mounts=model_mounts(model_s), host_python=python,
                                       rw_mounts=rw, rdma=uses_rdma(cmd)))
        sink = EventSink(ws, stream, event_fields)
        try:
            server = start_server("sglang", cmd, base_url=base_url,
                                  health_path="/health_generate", ws=ws, sink=sink,
                                  log_path=logs_dir / f"{stem}.log", env=env,
                                  startup_timeout_s=float(cfg.get("startup_timeout_s", 900)))
        except BaseException:
            if use is not None and container is not None:
                remove_container(use, container)
            raise
        running = SGLangRunning("sglang", server, base_url=base_url, model=model_s, config=cfg,
                                sink=sink, versions={"sglang": version},
                                yaml_text=yaml_text, help_digest=help_digest, image=use,
                                container=container)
        running.nsys_report = nsys_report
        try:
            si = running.server_info()
            sink.launched("sglang", cmd, base_url, server.pid, si)
            running.unreported_args = check_server(
                si, version=version, requested=server_options(cfg, version),
                where=f"sglang server at {base_url}",
                pinned_by="the runtime profile (framework.version)",
                args=cfg.get("check_args", True) is not False)
        except BaseException:
            running.stop(reason="error")
            raise
        return running


def nsys_wrap(cmd: list[str], option: Any, home: Path, stem: str, *, in_image: bool,
              host_python: str = sys.executable) -> tuple[list[str], str]:
    """The server command under `nsys profile` and the report it will write (`nsys:` config:
    true, or {cuda_graph_trace: node|graph}). On the host, nsys must be on PATH (a one-line
    refusal otherwise); in an image, the image's `nsys` runs (the report lands in the trace
    root, mounted read-write at its own path)."""
    opts = option if isinstance(option, Mapping) else {}
    if not (option is True or isinstance(option, Mapping)) or set(opts) - {"cuda_graph_trace"}:
        raise HarnessError(f"engine config nsys {option!r}: expected true or "
                           "{cuda_graph_trace: node|graph}")
    exe = "nsys"
    if in_image:  # the server is nsys's argument now: name the image's python here
        cmd = image_launcher(cmd, host_python)
    else:
        found = shutil.which("nsys")
        if found is None:
            raise HarnessError("engine config nsys: nsys is not on PATH (install Nsight "
                               "Systems on this host, or drop nsys)")
        exe = found
    out_dir = trace_root(home) / "nsys"
    out_dir.mkdir(parents=True, exist_ok=True)
    output = str(out_dir / stem)
    try:
        wrapped = profile_argv(cmd, output, nsys=exe,
                               cuda_graph_trace=str(opts.get("cuda_graph_trace", "node")))
    except ValueError as e:
        raise HarnessError(f"engine config nsys: {e}") from None
    return wrapped, output + ".nsys-rep"


def server_help(cmd: list[str], sandbox: EngineSandbox | None = None) -> str:
    """The launcher's `--help` (run in the launch's sandbox when it is an agent's)."""
    launcher = [*cmd[:cmd.index("--model-path")], "--help"]
    env = None
    if sandbox is not None:
        launcher, env = sandbox.wrap(launcher, {})
    try:
        r = subprocess.run(launcher, capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"sglang --help: {e}") from None
    if r.returncode != 0:
        raise HarnessError(f"sglang --help exited {r.returncode}: "
                           f"{' '.join((r.stderr or r.stdout).split())[-200:]}")
    return r.stdout
