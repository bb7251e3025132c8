"""What a candidate is on whole specs, and what it changed (pure): the layer over `specs`.
The keys themselves (topology and role keys, canonical values, applying point keys) are
`candidate_keys`'s.

Contracts:
- `canonical_candidate(scope, candidate)`: each value as the scope's own value of its key
  (`candidate_keys.canonical_value`). Every scope check and every "already tried" check sees
  the canonical candidate, and it is what a block records: one configuration has one
  spelling.
- `applicable(candidate, point)`: the candidate without role keys its architecture has no
  role for (a grid over `topology.architecture × prefill.tp` tries colocated once, not once
  per `prefill.tp`).
- `differences(point, profile, candidate)`: every dimension in which the candidate's point
  and profile differ from the baseline's, as `{path, baseline, candidate}` (paths:
  `topology.architecture`, `topology.roles.prefill.parallelism.tp`, `engine.<flag>`,
  `profile.<field>`, `code.<member>`), sorted by path; `shown_differences` as one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .candidate_keys import ARCHITECTURE_ROLES, canonical_value, role_key
from .specs import (
    CODE_PREFIX,
    DeploymentPoint,
    RuntimeProfile,
    apply_candidate,
    canonical,
    flatten,
)


def canonical_candidate(scope: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """The candidate with each value spelled as its scope key's own value (module doc);
    keys outside the scope unchanged."""
    return {k: canonical_value(scope[k], v) if k in scope else v for k, v in candidate.items()}


def applicable(candidate: dict[str, Any], point: DeploymentPoint | None) -> dict[str, Any]:
    """The candidate without role keys for roles its architecture does not have."""
    if point is None:
        return dict(candidate)
    arch = candidate.get("topology.architecture", point.topology.architecture)
    wanted = ARCHITECTURE_ROLES.get(arch) if isinstance(arch, str) else None
    if wanted is None:
        return dict(candidate)
    return {k: v for k, v in candidate.items()
            if (rk := role_key(k)) is None or rk[0] in wanted}


# --- what a candidate changed -------------------------------------------------------------


def _point_view(point: DeploymentPoint) -> dict[str, Any]:
    """A point's dimensions with roles keyed by name (`topology.roles.prefill.count`), so a
    role's change reads as that role's, whatever its position in the list."""
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
    data = canonical(profile)
    out = {f"profile.{k}": v for k, v in data.items() if k != "config"}
    out.update({f"engine.{k}": v for k, v in (data.get("config") or {}).items()})
    return out


def differences(point: DeploymentPoint | None, profile: RuntimeProfile | None,
                candidate: dict[str, Any], code_base: Mapping[str, str] | None = None
                ) -> list[dict[str, Any]]:
    """Every dimension the candidate's point and profile differ in from the baseline's
    (`{path, baseline, candidate}`; a side that lacks the dimension is None); a
    `code.<member>`'s baseline is `code_base[member]` (the pinned commit) when given."""
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
    base = code_base or {}
    out += [{"path": k, "baseline": base.get(k[len(CODE_PREFIX):]), "candidate": v}
            for k, v in sorted(candidate.items()) if k.startswith(CODE_PREFIX)]
    return sorted(out, key=lambda d: d["path"])


def shown_differences(diffs: list[dict[str, Any]], limit: int = 12) -> str:
    """One line: `topology.architecture colocated→pd, engine.x 1→2` (… and N more)."""
    parts = [f"{d['path']} {json.dumps(d['baseline'])}→{json.dumps(d['candidate'])}"
             for d in diffs[:limit]]
    more = len(diffs) - limit
    return ", ".join(parts) + (f" (and {more} more)" if more > 0 else "") if parts \
        else "nothing (the baseline's point and profile)"
