"""Dimensions and column values read from event payloads: plain mappings, read defensively
(a missing or odd-shaped value is NULL). The underscored readers are shared by the modules
of this package only."""

from __future__ import annotations

from typing import Any

import orjson

from .schema import DIM_NAMES


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    return None


def _str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def point_dims(point: Any) -> dict[str, Any]:
    """Deployment-point dimensions from a point mapping (DESIGN §9 shape); missing → None."""
    dims: dict[str, Any] = dict.fromkeys(DIM_NAMES)
    if not isinstance(point, dict):
        return dims
    model = point.get("model")
    if isinstance(model, str):
        dims["model"] = model
    else:
        dims["model"] = _str(_get(model, "name"))
        dims["model_revision"] = _str(_get(model, "revision"))
    scen = point.get("scenario")
    traffic = _get(scen, "traffic")
    dims["modality"] = _str(_get(scen, "modality"))
    dims["input_len"] = _int(_get(traffic, "input_len"))
    dims["output_len"] = _int(_get(traffic, "output_len"))
    dims["concurrency"] = _int(_get(traffic, "concurrency"))
    dims["request_rate"] = _float(_get(traffic, "request_rate"))
    if any(dims[k] is not None for k in ("modality", "input_len", "output_len", "concurrency")):
        dims["scenario"] = (
            f"{dims['modality'] or '?'} in{dims['input_len'] or '?'}"
            f"/out{dims['output_len'] or '?'} c{dims['concurrency'] or '?'}"
        )
    topo = point.get("topology")
    dims["architecture"] = _str(_get(topo, "architecture"))
    par = _get(topo, "parallelism")
    for k in ("tp", "pp", "dp", "ep"):
        dims[k] = _int(_get(par, k))
    if any(dims[k] is not None for k in ("tp", "pp", "dp", "ep")):
        dims["parallelism"] = "-".join(f"{k}{dims[k] or 1}" for k in ("tp", "pp", "dp", "ep"))
    rp = point.get("runtime_profile")
    dims["service"] = _str(_get(rp, "service"))
    dims["rev"] = _int(_get(rp, "rev"))
    if dims["service"] is not None:
        dims["runtime_profile"] = f"{dims['service']}@{dims['rev'] or '?'}"
    eng = _get(rp, "engine")
    if isinstance(eng, str):
        dims["engine"] = eng
    acc = point.get("accelerator")
    if isinstance(acc, str):
        dims["accelerator"] = acc
    else:
        dims["accelerator_vendor"] = _str(_get(acc, "vendor"))
        dims["accelerator"] = _str(_get(acc, "model"))
        dims["accelerator_count"] = _int(_get(acc, "count"))
    return dims


def profile_engine(profile: Any) -> str | None:
    eng = _get(profile, "engine")
    if isinstance(eng, dict):
        eng = eng.get("kind") or eng.get("name")
    return _str(eng)


def candidate_key(candidate: Any) -> str:
    """A stable text key for a candidate (sorted-keys JSON; '{}' is the baseline)."""
    return orjson.dumps(candidate or {}, option=orjson.OPT_SORT_KEYS).decode()


def _json(v: Any) -> str:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def _repo_snapshot(digests: Any) -> str | None:
    if not isinstance(digests, dict):
        return None
    for k in ("repo_snapshot", "repo", "snapshot", "repos"):
        if k in digests:
            return _str(digests[k])
    for k, v in digests.items():
        if "repo" in k:
            return _str(v)
    return None


def _point_ref(digests: Any) -> str | None:
    if not isinstance(digests, dict):
        return None
    for k in ("point", "point_hash", "deployment_point"):
        if k in digests:
            return _str(digests[k])
    return None

def _first(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None
