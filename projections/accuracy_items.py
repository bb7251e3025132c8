"""Accuracy items: which items of an accuracy suite changed between two runs.

Contracts:
- `items_of(meta, gate=None)` reads a measurement's per-item results, `{item id: correct}`,
  from either shape the ledger holds: a `forge eval accuracy` measurement (`meta.items`,
  [[id, 0|1], ...]) or an engine run of a loop block (`meta.accuracy[<gate>].items`; `gate`
  None takes the only accuracy gate, several without `gate` is a ValueError naming them).
  A run with no items (none recorded, or an `error`) is a ValueError saying why.
- `changed_items(a, b)` is pure: the items both runs answered, split into `lost` (right in
  `a`, wrong in `b`), `gained` (wrong in `a`, right in `b`) and `unchanged` (a count), the
  ids only one side has (`only_a`, `only_b`), and each side's accuracy over the shared
  items. Ids keep their order (sorted; ints before strings).
- `accuracy_changes(ledger, run_a, run_b, gate=None)` finds both runs' MeasurementRecorded
  by run id in the ledger (the latest of that id) and returns `changed_items` of them plus
  the run ids and each run's items digest when recorded (equal digests: the same documents).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..ledger import events as E

if TYPE_CHECKING:
    from ..ledger.store import Ledger

ItemId = int | str


def _key(i: ItemId) -> tuple[bool, Any]:
    return (isinstance(i, str), i)


def items_of(meta: Mapping[str, Any], gate: str | None = None) -> dict[ItemId, bool]:
    """`{item id: correct}` of one measurement's meta (module contract)."""
    rows: Any = None
    if "items" in meta and gate is None:
        rows = meta["items"]
    else:
        acc = meta.get("accuracy") or {}
        if gate is None:
            if len(acc) != 1:
                raise ValueError("give the gate: the run has accuracy gates "
                                 f"{', '.join(sorted(acc)) or '(none)'}")
            gate = next(iter(acc))
        one = acc.get(gate)
        if not isinstance(one, Mapping):
            raise ValueError(f"the run has no accuracy results for gate {gate!r}")
        if one.get("error"):
            raise ValueError(f"gate {gate}: {one['error']}")
        rows = one.get("items")
    if not rows:
        raise ValueError("the run recorded no per-item results")
    return {(i if isinstance(i, str) else int(i)): bool(c) for i, c in rows}


def changed_items(a: Mapping[ItemId, bool], b: Mapping[ItemId, bool]) -> dict[str, Any]:
    """Which shared items `b` lost or gained against `a` (module contract)."""
    shared = sorted(set(a) & set(b), key=_key)
    lost = [i for i in shared if a[i] and not b[i]]
    gained = [i for i in shared if b[i] and not a[i]]
    n = len(shared)
    return {"items": n, "lost": lost, "gained": gained,
            "unchanged": n - len(lost) - len(gained),
            "only_a": sorted(set(a) - set(b), key=_key),
            "only_b": sorted(set(b) - set(a), key=_key),
            "accuracy_a": sum(a[i] for i in shared) / n if n else None,
            "accuracy_b": sum(b[i] for i in shared) / n if n else None}


def _measurement(ledger: Ledger, run_id: str) -> Any:
    found = None
    for rec in ledger.log(types=["MeasurementRecorded"]):
        ev = rec.event
        if isinstance(ev, E.MeasurementRecorded) and ev.run_id == run_id:
            found = ev
    if found is None:
        raise ValueError(f"no measurement with run id {run_id!r}")
    return found


def _digest(meta: Mapping[str, Any], gate: str | None) -> str | None:
    if "items" in meta and gate is None:
        return (meta.get("dataset") or {}).get("items_digest")
    acc = meta.get("accuracy") or {}
    one = acc.get(gate) if gate else (next(iter(acc.values())) if len(acc) == 1 else None)
    return one.get("items_digest") if isinstance(one, Mapping) else None


def accuracy_changes(ledger: Ledger, run_a: str, run_b: str,
                     gate: str | None = None) -> dict[str, Any]:
    """`changed_items` of two recorded runs, found by run id (module contract)."""
    ma, mb = (_measurement(ledger, r).meta for r in (run_a, run_b))
    return {"run_a": run_a, "run_b": run_b, "items_digest_a": _digest(ma, gate),
            "items_digest_b": _digest(mb, gate),
            **changed_items(items_of(ma, gate), items_of(mb, gate))}
