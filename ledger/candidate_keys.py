"""A candidate's keys and values on a spec's stored shape (pure; below `specs`, which applies
candidates with it, and `candidates`, which says what a candidate changed).

Keys a task's scope may name beside `engine.<flag>` and `profile.<field>`:
- `topology.<path>`: a dotted path into the point's topology (`topology.architecture`,
  `topology.parallelism.tp`);
- `<role>.<field>` with role one of prefill, decode, encode, colocated and field one of
  `count`, `tp`, `pp`, `dp`, `ep` (`prefill.tp`, `decode.count`); `<role>.parallelism.<x>`
  is the same dimension spelled in full. `ARCHITECTURE_ROLES`: the roles of each topology
  architecture.

Contracts:
- `apply_point_keys(data, candidate, set_path)` applies a candidate's point keys to a point's
  stored shape (a new mapping; the caller validates it as a `DeploymentPoint`). When the
  candidate switches `topology.architecture`, the roles the new architecture needs and the
  point lacks are added (one server each, with the topology's parallelism) and roles it has
  no place for are dropped; role keys then set their role's count or parallelism.
- Impossible combinations raise `SpecError` naming the dimension: a role key for a role
  the architecture does not have (`prefill.tp` on a colocated point), a field a role does not
  take, a role listed twice (which one would `prefill.tp` set?). `dimension_of` names the
  role dimension a validation error's location points at.
- `canonical_value(allowed, value)`: `value` as the scope's own value: for a bool dimension
  `1`, `"true"`, `"yes"` and `True` are `True`; for a number `"2"` and `2.0` are `2` (or
  `2.0` for a float value); for text `8` is `"8"`. A value no allowed value equals stays as
  given. `same_value`: equal and of the same kind (True is not 1).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import SpecError

ROLES = ("prefill", "decode", "encode", "colocated")
ROLE_FIELDS = ("count", "tp", "pp", "dp", "ep")
PARALLEL = ("tp", "pp", "dp", "ep")

# The server roles of each architecture, in pipeline order. Disaggregated serving (pd:
# prefill and decode servers; epd: encode servers too, for multimodal inputs) needs every one
# of its roles and no other; a colocated topology may leave `roles` out (one kind of server)
# or list `colocated` roles only.
ARCHITECTURE_ROLES: dict[str, tuple[str, ...]] = {
    "colocated": ("colocated",),
    "pd": ("prefill", "decode"),
    "epd": ("encode", "prefill", "decode"),
}


def role_key(key: str) -> tuple[str, str] | None:
    """(role, field) of a role key (`prefill.tp`, `decode.parallelism.tp`), else None."""
    head, _, rest = key.partition(".")
    if head not in ROLES or not rest:
        return None
    return head, rest.removeprefix("parallelism.")


def is_point_key(key: str) -> bool:
    """Keys that change the deployment point (not the profile, not code)."""
    head = key.partition(".")[0]
    return head not in ("engine", "profile", "code")


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _as_type(like: Any, value: Any) -> Any:
    """`value` as the type of the allowed value `like` when it denotes the same value,
    else a sentinel (`_NO`)."""
    if value is None or like is None:
        return value if value is like else _NO
    if isinstance(like, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, int | float) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        return _NO
    if isinstance(like, int | float):
        if isinstance(value, bool):
            return _NO  # True is no number of threads
        num = _number(value)
        if num is None:
            return _NO
        if isinstance(like, int):
            return int(num) if float(num).is_integer() else _NO
        return float(num)
    if isinstance(like, str):
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return json.dumps(value)
        return _NO
    return value  # lists, mappings: compared as they are


_NO = object()


def _number(value: Any) -> int | float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
        return f if f - f == 0.0 else None  # NaN and infinities are no scope value
    return None


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same kind (True is not 1, 1 is 1.0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def canonical_value(allowed: Any, value: Any) -> Any:
    """`value` spelled as the scope's own value (`allowed`: a list of values, or a numeric
    `Range`): the first allowed value it denotes, or for a range the number (an int for an
    integer range); `value` unchanged when it denotes none of them."""
    if isinstance(allowed, list):
        for like in allowed:
            v = _as_type(like, value)
            if v is not _NO and same_value(v, like):
                return like
        return value
    if allowed is None or isinstance(value, bool):
        return value
    num = _number(value)
    if num is None:
        return value
    if getattr(allowed, "integer", False) and float(num).is_integer():
        return int(num)
    return num


def _shown(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(candidate.items()))


def _arch_roles(arch: str) -> tuple[str, ...]:
    roles = ARCHITECTURE_ROLES.get(arch)
    if roles is None:
        raise SpecError([f"candidate topology.architecture={json.dumps(arch)}: not an "
                         f"architecture (known: {', '.join(ARCHITECTURE_ROLES)})"])
    return roles


def _reshape_roles(topo: dict[str, Any], before: str) -> None:
    """The roles of a topology whose architecture was switched from `before`."""
    arch = topo.get("architecture", "colocated")
    if arch == before:
        return
    wanted = _arch_roles(arch)
    par = dict(topo.get("parallelism") or {})
    kept = [r for r in topo.get("roles") or [] if r.get("role") in wanted]
    have = {r["role"] for r in kept}
    if arch == "colocated":  # one kind of server: the topology's parallelism, no roles
        topo["roles"] = kept
        return
    added = [{"role": r, "count": 1, "parallelism": dict(par)} for r in wanted if r not in have]
    order = {r: i for i, r in enumerate(wanted)}
    topo["roles"] = sorted(kept + added, key=lambda r: order[r["role"]])


def _set_role(topo: dict[str, Any], key: str, role: str, field: str, value: Any) -> None:
    arch = topo.get("architecture", "colocated")
    wanted = _arch_roles(arch)
    if role not in wanted:
        raise SpecError([f"candidate {key}={json.dumps(value)}: architecture {arch} has no "
                         f"{role} role (its roles: {', '.join(wanted)})"])
    if field not in ROLE_FIELDS:
        raise SpecError([f"candidate {key}: a role's dimensions are "
                         f"{', '.join(ROLE_FIELDS)} (not {field!r})"])
    roles = topo.setdefault("roles", [])
    mine = [r for r in roles if r.get("role") == role]
    if len(mine) > 1:
        raise SpecError([f"candidate {key}: the point lists {len(mine)} {role} roles; "
                         f"which one {key} sets is ambiguous (give one {role} role)"])
    if not mine:  # a colocated point without roles: its one kind of server
        mine = [{"role": role, "count": 1,
                 "parallelism": dict(topo.get("parallelism") or {})}]
        roles.append(mine[0])
    target = mine[0]
    if field == "count":
        target["count"] = value
    else:
        target.setdefault("parallelism", {})[field] = value


def apply_point_keys(data: dict[str, Any], candidate: dict[str, Any],
                     set_path: Any) -> dict[str, Any]:
    """`data` (a point's stored shape) with the candidate's point keys applied, as a new
    mapping. `set_path(data, parts, value)` sets a dotted path (specs._set_path)."""
    out = copy.deepcopy(data)
    topo = out.setdefault("topology", {})
    before = topo.get("architecture", "colocated")
    role_keys = []
    for key, value in sorted(candidate.items()):
        if not is_point_key(key):
            continue
        rk = role_key(key)
        if rk is not None:
            role_keys.append((key, *rk, value))
        else:
            set_path(out, key.split("."), value)
    topo = out.setdefault("topology", {})
    if not isinstance(topo, dict):
        raise SpecError([f"candidate {_shown(candidate)}: topology must be a mapping"])
    if isinstance(topo.get("architecture", "colocated"), str):
        _reshape_roles(topo, before)
    for key, role, field, value in role_keys:
        _set_role(topo, key, role, field, value)
    return out


def dimension_of(loc: tuple[Any, ...], data: dict[str, Any] | None) -> str | None:
    """The role dimension (`prefill.tp`) a validation error's location in a point's stored
    shape points at (`topology.roles[0].parallelism.tp`), or None."""
    if data is None or len(loc) < 4 or loc[:2] != ("topology", "roles") \
            or not isinstance(loc[2], int):
        return None
    roles = (data.get("topology") or {}).get("roles") or []
    if loc[2] >= len(roles) or not isinstance(roles[loc[2]], dict):
        return None
    field = loc[-1] if loc[3] == "parallelism" else loc[3]
    return f"{roles[loc[2]].get('role')}.{field}"
