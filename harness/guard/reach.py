"""What a command line reaches over the network, read from its words (pure): the servers a
recorded tool call names, so that the sandbox can say which allowance a failed call lacked
(harness/guard/endpoint_relay.py) and `forge skills lint` can hold a skill's recipes to the
allowance it declares (harness/agents/skills.py).

Contract:
- `named_endpoints(argv)`: `scheme://host:port` of every http(s) URL in any argument (a shell
  script's text included), and of the server SGLang's bench client sends to when `argv` runs
  it (`--base-url`, else `http://{--host}:{--port}` with the client's own defaults: host
  `0.0.0.0`, the port of its `--backend`, 30000 for SGLang's), in order, each once. Hosts as
  written (lower case), the port filled in.
- `runs_bench_client(argv)`: `argv` runs a serving benchmark client (SGLang's
  `sglang.bench_serving` / `sglang.benchmark.serving`, `sglang.bench_one_batch_server`, NVIDIA
  AIPerf / genai-perf), which always talks to a server.
- `is_loopback(host)`: `localhost`, 127.0.0.0/8, `::1`, and `0.0.0.0` (a connect to it reaches
  this host's loopback; SGLang's bench client's default host).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

BENCH_MODULES = ("sglang.bench_serving", "sglang.benchmark.serving",
                 "sglang.bench_one_batch_server")
BENCH_PROGRAMS = ("aiperf", "genai-perf")
# SGLang's bench client: the port of each --backend when --port is not given (its own table,
# read from sglang/benchmark/serving.py of 0.5.23; 0.4.0's is the same for these backends).
_BENCH_PORTS = {"lmdeploy": 23333, "vllm": 8000, "vllm-embedding": 8000, "trt": 8000,
                "gserver": 9988, "truss": 8080}
_SGLANG_PORT = 30000
_URL = re.compile(r"\bhttps?://[^\s'\"<>`)]+", re.I)
_DEFAULT_PORT = {"http": 80, "https": 443}


def origin(url: str) -> str | None:
    """`scheme://host:port` of an http(s) URL (None when it is not one)."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        return None
    scheme = u.scheme.lower()
    host = (u.hostname or "").lower()
    if scheme not in _DEFAULT_PORT or not host:
        return None
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port or _DEFAULT_PORT[scheme]}"


def host_port(endpoint: str) -> tuple[str, int]:
    """(host, port) of a `scheme://host:port` endpoint (brackets of an IPv6 host dropped)."""
    u = urlsplit(endpoint)
    return (u.hostname or "").lower(), u.port or _DEFAULT_PORT[u.scheme.lower()]


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or str(ip) == "0.0.0.0"


def _bench_module(argv: Sequence[str]) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a == "-m" and argv[i + 1] in BENCH_MODULES:
            return argv[i + 1]
    return None


def runs_bench_client(argv: Sequence[str]) -> bool:
    """Whether `argv` runs a serving benchmark client (module contract)."""
    if _bench_module(argv) is not None:
        return True
    return any(a.rsplit("/", 1)[-1] in BENCH_PROGRAMS for a in argv[:1])


def _flag(argv: Sequence[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` (the last one given), else None."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _bench_target(argv: Sequence[str]) -> str | None:
    """The server SGLang's bench client sends to, as it computes it."""
    base = _flag(argv, "--base-url")
    if base:
        return origin(base)
    host = _flag(argv, "--host") or "0.0.0.0"
    port = _flag(argv, "--port")
    if port is None:
        port = str(_BENCH_PORTS.get(_flag(argv, "--backend") or "sglang", _SGLANG_PORT))
    return origin(f"http://{f'[{host}]' if ':' in host else host}:{port}")


def named_endpoints(argv: Sequence[str]) -> list[str]:
    """The servers `argv` names (module contract)."""
    found: list[str] = []
    for a in argv:
        for m in _URL.finditer(a):
            o = origin(m.group(0).rstrip(".,;"))
            if o is not None:
                found.append(o)
    if _bench_module(argv) in ("sglang.bench_serving", "sglang.benchmark.serving"):
        target = _bench_target(argv)
        if target is not None:
            found.append(target)
    return list(dict.fromkeys(found))
