"""Which HTTP routes an SGLang server answers, by version and role (read from each release's
own `sglang/srt/entrypoints/http_server.py`, 0.4.x `sglang/srt/server.py`, and the encoder's
app, `sglang/srt/disaggregation/encode_server.py` / `encoder/http_server.py`; the test
tests/harness/engines/test_sglang_routes.py parses them with `ast` from the released wheels).

- `/server_info` and `/model_info` exist from 0.5.6; before, only `/get_server_info` and
  `/get_model_info` (still served, deprecated, through 0.5.23). `info_paths(kind, version)`
  is the route to ask first and the fallbacks on a 404: the new name alone from 0.5.6 (the
  old one logs a deprecation warning), the old name alone before, both (new first) when the
  version is unknown.
- An encoder-only server (EPD, `--encoder-only`, from 0.5.7) has neither in any version: its
  app serves `/encode`, `/send`, `/scheduler_receive_url`, `/health`, `/health_generate`,
  `/start_profile`, `/stop_profile` (and `/metrics` with `--enable-metrics` by 0.5.21,
  not in 0.5.13). It
  is checked by its health route only (`ENCODER_READY_PATH`).
- From 0.5.13 every `--language-only` server binds `--encoder-bootstrap-port` (default 8997):
  two on one host collide unless each is given its own (`binds_encoder_bootstrap`: the
  releases whose parser has the flag, per the flag table).
"""

from __future__ import annotations

from typing import Any, Literal

from ..errors import HarnessError
from ..guard import outbound
from . import sglang_flags
from .base import request_json
from .sglang_release import version_key

INFO_ROUTES_SINCE = (0, 5, 6)
ENCODER_READY_PATH = "/health"


def _version(v: str | None) -> tuple[int, int, int] | None:
    try:
        return version_key(v) if v else None
    except HarnessError:
        return None


def info_paths(kind: Literal["server", "model"], version: str | None) -> tuple[str, ...]:
    """The routes to try in order for `/server_info` or `/model_info` (module docstring)."""
    new, old = f"/{kind}_info", f"/get_{kind}_info"
    v = _version(version)
    if v is None:
        return (new, old)
    return (new,) if v >= INFO_ROUTES_SINCE else (old,)


def binds_encoder_bootstrap(version: str | None) -> bool:
    """Whether a `--language-only` server of `version` binds `--encoder-bootstrap-port`: the
    releases whose parser has the flag (the flag table). Unknown version: True (giving the
    port is harmless only where the flag exists, so the planner, which always knows the
    version, is the caller)."""
    return version is None or sglang_flags.available("--encoder-bootstrap-port", version)


def get_info(base_url: str, kind: Literal["server", "model"], version: str | None, *,
             guard: outbound.Guard | None = None, timeout: float = 30.0
             ) -> tuple[Any, str]:
    """(the answer, the URL that gave it) of the first of `info_paths` that is not a 404."""
    paths = info_paths(kind, version)
    for i, path in enumerate(paths):
        try:
            return request_json("GET", base_url + path, timeout=timeout, guard=guard), \
                base_url + path
        except HarnessError as e:
            if "HTTP 404" not in str(e) or i == len(paths) - 1:
                raise
    raise AssertionError("unreachable")  # info_paths is never empty
