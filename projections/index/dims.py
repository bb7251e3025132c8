"""Dimensions and column values of the index's rows. A point's dimensions and a profile's
columns are read from their one stored shape (`specs.stored_point` / `stored_profile`); gate
rows from `GateResult` payloads (the projector). The converters of a free-form JSON value
(such as a block's routing) to a column's type (`as_int`, `as_float`, `as_str`: None when it
has none; `sorted_json`) serve this package's modules."""

from __future__ import annotations

from typing import Any

import orjson

from ...ledger.specs import DeploymentPoint, RuntimeProfile
from .schema import DIM_NAMES


def as_int(v: Any) -> int | None:
    """An integer column's value: an int (not a bool), a whole float or a string of digits;
    else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def as_float(v: Any) -> float | None:
    """A float column's value: any int or float (not a bool); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    return None


def as_str(v: Any) -> str | None:
    """A text column's value: the string itself, any other value's str(); None stays None."""
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def point_dims(point: DeploymentPoint) -> dict[str, Any]:
    """The deployment-point dimensions of a point (its stored shape, `specs.stored_point`).
    A length drawn from a distribution has no single value: NULL."""
    dims: dict[str, Any] = dict.fromkeys(DIM_NAMES)
    scen, topo, rp, acc = point.scenario, point.topology, point.runtime_profile, point.accelerator
    t = scen.traffic
    dims.update(
        model=point.model.name, model_revision=point.model.revision, modality=scen.modality,
        input_len=t.input_len if isinstance(t.input_len, int) else None,
        output_len=t.output_len if isinstance(t.output_len, int) else None,
        concurrency=t.concurrency, request_rate=t.request_rate,
        architecture=topo.architecture, service=rp.service, rev=rp.rev,
        runtime_profile=f"{rp.service}@{rp.rev}", accelerator_vendor=acc.vendor,
        accelerator=acc.model, accelerator_count=acc.count)
    dims["scenario"] = (f"{dims['modality']} in{dims['input_len'] or '?'}"
                        f"/out{dims['output_len'] or '?'} c{dims['concurrency'] or '?'}")
    par = topo.parallelism
    dims.update(tp=par.tp, pp=par.pp, dp=par.dp, ep=par.ep,
                parallelism=f"tp{par.tp}-pp{par.pp}-dp{par.dp}-ep{par.ep}")
    return dims


def profile_row(profile: RuntimeProfile) -> dict[str, Any]:
    """The columns of `runtime_profiles` a profile (`specs.stored_profile`) gives."""
    image, fw = profile.image, profile.framework
    return {"engine": profile.engine,
            "image": (image.digest or image.name) if image is not None else None,
            "framework": f"{fw.kind} {fw.version or ''}".strip() if fw is not None else None,
            "config": sorted_json(profile.config)}


def candidate_key(candidate: Any) -> str:
    """A stable text key for a candidate (sorted-keys JSON; '{}' is the baseline)."""
    return orjson.dumps(candidate or {}, option=orjson.OPT_SORT_KEYS).decode()


def sorted_json(v: Any) -> str:
    """A JSON column's text: sorted keys, so equal values compare equal."""
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
