"""Topology and parallelism as candidate dimensions, and what a candidate changed (pure).

A task's scope may name, beside `engine.<flag>` and `profile.<field>` keys:
- `topology.<path>`: a dotted path into the point's topology (`topology.architecture`,
  `topology.parallelism.tp`);
- `<role>.<field>` with role one of prefill, decode, encode, colocated and field one of
  `count`, `tp`, `pp`, `dp`, `ep` (`prefill.tp`, `decode.count`); `<role>.parallelism.<x>`
  is the same dimension spelled in full.

Contracts:
- `apply_point_keys(data, candidate)` applies a candidate's point keys to a point's stored
  shape (a new mapping; the caller validates it as a `DeploymentPoint`). When the candidate
  switches `topology.architecture`, the roles the new architecture needs and the point lacks
  are added (one server each, with the topology's parallelism) and roles it has no place for
  are dropped; role keys then set their role's count or parallelism.
- Impossible combinations raise `SpecError` naming the dimension: a role key for a role
  the architecture does not have (`prefill.tp` on a colocated point), a field a role does not
  take, a role listed twice (which one would `prefill.tp` set?).
- `applicable(candidate, point)`: the candidate without role keys its architecture has no
  role for (a grid over `topology.architecture × prefill.tp` tries colocated once, not once
  per `prefill.tp`).
- `differences(point, profile, candidate)`: every dimension in which the candidate's point
  and profile differ from the baseline's, as `{path, baseline, candidate}` (paths:
  `topology.architecture`, `topology.roles.prefill.parallelism.tp`, `engine.<flag>`,
  `profile.<field>`, `code.<member>`), sorted by path.
- `canonical_candidate(scope, candidate)`: each value as the scope's own value of its key
  (`canonical_value`): for a bool dimension `1`, `"true"`, `"yes"` and `True` are `True`;
  for a number `"2"` and `2.0` are `2` (or `2.0` for a float value); for text `8` is
  `"8"`. A value no allowed value equals stays as given (the scope check then refuses it).
  Every scope check and every "already tried" check sees the canonical candidate, and it is
  what a block records: one configuration has one spelling.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

from .errors import SpecError

if TYPE_CHECKING:
    from .specs import DeploymentPoint, RuntimeProfile

ROLES = ("prefill", "decode", "encode", "colocated")
ROLE_FIELDS = ("count", "tp", "pp", "dp", "ep")
PARALLEL = ("tp", "pp", "dp", "ep")


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


def canonical_candidate(scope: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """The candidate with each value spelled as its scope key's own value (module doc);
    keys outside the scope unchanged."""
    return {k: canonical_value(scope[k], v) if k in scope else v for k, v in candidate.items()}


def _shown(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(candidate.items()))


def _arch_roles(arch: str) -> tuple[str, ...]:
    from .specs import ARCHITECTURE_ROLES

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


def applicable(candidate: dict[str, Any], point: DeploymentPoint | None) -> dict[str, Any]:
    """The candidate without role keys for roles its architecture does not have."""
    if point is None:
        return dict(candidate)
    arch = candidate.get("topology.architecture", point.topology.architecture)
    from .specs import ARCHITECTURE_ROLES

    wanted = ARCHITECTURE_ROLES.get(arch) if isinstance(arch, str) else None
    if wanted is None:
        return dict(candidate)
    return {k: v for k, v in candidate.items()
            if (rk := role_key(k)) is None or rk[0] in wanted}


# --- what a candidate changed -------------------------------------------------------------


def _point_view(point: DeploymentPoint) -> dict[str, Any]:
    """A point's dimensions with roles keyed by name (`topology.roles.prefill.count`), so a
    role's change reads as that role's, whatever its position in the list."""
    from .specs import canonical

    data = canonical(point)
    topo = dict(data.get("topology") or {})
    roles = topo.pop("roles", []) or []
    named: dict[str, Any] = {}
    for i, r in enumerate(roles):
        name = r["role"] if sum(x["role"] == r["role"] for x in roles) == 1 \
            else f"{r['role']}#{i}"
        named[name] = {k: v for k, v in r.items() if k != "role"}
    if named:
        topo["roles"] = named
    data["topology"] = topo
    return data


def _profile_view(profile: RuntimeProfile) -> dict[str, Any]:
    from .specs import canonical

    data = canonical(profile)
    out = {f"profile.{k}": v for k, v in data.items() if k != "config"}
    out.update({f"engine.{k}": v for k, v in (data.get("config") or {}).items()})
    return out


def differences(point: DeploymentPoint | None, profile: RuntimeProfile | None,
                candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """Every dimension the candidate's point and profile differ in from the baseline's
    (`{path, baseline, candidate}`; a side that lacks the dimension is None)."""
    from .specs import CODE_PREFIX, apply_candidate, flatten

    new_point, new_profile = apply_candidate(point, profile, candidate)
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    if point is not None and new_point is not None:
        va, vb = _point_view(point), _point_view(new_point)
        a.update(flatten(va))
        b.update(flatten(vb))
        # A role only one side has is one dimension (`topology.roles.decode`: the role, or
        # None), not a None per leaf.
        ra, rb = (v["topology"].get("roles") or {} for v in (va, vb))
        for name in set(ra) ^ set(rb):
            key = f"topology.roles.{name}"
            for side, roles in ((a, ra), (b, rb)):
                for k in [k for k in side if k.startswith(key + ".")]:
                    del side[k]
                if name in roles:
                    side[key] = roles[name]
    if profile is not None and new_profile is not None:
        a.update(flatten(_profile_view(profile)))
        b.update(flatten(_profile_view(new_profile)))
    out = [{"path": k, "baseline": a.get(k), "candidate": b.get(k)}
           for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    out += [{"path": k, "baseline": None, "candidate": v}
            for k, v in sorted(candidate.items()) if k.startswith(CODE_PREFIX)]
    return sorted(out, key=lambda d: d["path"])


def shown_differences(diffs: list[dict[str, Any]], limit: int = 12) -> str:
    """One line: `topology.architecture colocated→pd, engine.x 1→2` (… and N more)."""
    parts = [f"{d['path']} {json.dumps(d['baseline'])}→{json.dumps(d['candidate'])}"
             for d in diffs[:limit]]
    more = len(diffs) - limit
    return ", ".join(parts) + (f" (and {more} more)" if more > 0 else "") if parts \
        else "nothing (the baseline's point and profile)"
