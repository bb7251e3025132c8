"""Numbers the ledger can hold: finite floats and integers within 64 bits.

Events are stored as JSON (orjson): NaN and infinities have no JSON form (orjson writes
`null`, which no float field reads back) and integers outside 64 bits make orjson fail. Such
a value is refused wherever a number enters (CLI, JSON, YAML, bench import, engine output)
and wherever an event is built or encoded, naming the field path. `check_finite` is the one
check; the rest are its forms for callers that drop a bad number with its reason instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .errors import NonFiniteError

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # what orjson serializes
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+").fullmatch


def number_problem(v: Any) -> str | None:
    """Why the scalar `v` cannot be stored, or None when it can (or is not a number)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        if v - v == 0.0:  # false for NaN and both infinities
            return None
        return f"{'NaN' if v != v else ('-' if v < 0 else '') + 'Infinity'} is not a " \
            "finite number"
    if isinstance(v, int) and not _INT_MIN <= v <= _INT_MAX:
        digits = str(v) if abs(v) < 10**30 else f"{str(v)[:12]}… ({len(str(abs(v)))} digits)"
        return f"integer {digits} does not fit in 64 bits"
    return None


def bad_number(v: Any) -> tuple[tuple[Any, ...], str] | None:
    """The path (keys and indexes) to the first number inside `v` that the ledger cannot hold,
    with the reason; None when there is none. Walks dicts, lists and tuples."""
    t = type(v)
    if t is float:
        return None if v - v == 0.0 else ((), number_problem(v))  # type: ignore[return-value]
    if t is dict or t is list or t is tuple:
        for k, x in (v.items() if t is dict else enumerate(v)):
            tx = type(x)
            if tx is str or x is None or tx is bool:
                continue
            if tx is float:
                if x - x == 0.0:
                    continue
            elif tx is int and _INT_MIN <= x <= _INT_MAX:
                continue
            r = bad_number(x)
            if r is not None:
                return (k, *r[0]), r[1]
        return None
    if t is str or t is int and _INT_MIN <= v <= _INT_MAX or v is None:
        return None
    if isinstance(v, Mapping):  # subclasses: OrderedDict, …
        return bad_number(dict(v))
    if isinstance(v, list | tuple):
        return bad_number(list(v))
    problem = number_problem(v)  # numpy scalars, IntEnum, an int past 64 bits
    return None if problem is None else ((), problem)


def field_path(where: str, path: tuple[Any, ...]) -> str:
    """`where` followed by the path: `.key` for plain keys, `["a b"]` for others, `[3]`."""
    out = [where]
    for p in path:
        if isinstance(p, int) and not isinstance(p, bool):
            out.append(f"[{p}]")
        elif isinstance(p, str) and _PLAIN_KEY(p):
            out.append(f".{p}" if out[-1] else p)
        else:
            out.append(f"[{p!r}]")
    return "".join(out)


def check_finite(value: Any, where: str) -> None:
    """Refuse a value holding a number the ledger cannot store: raise NonFiniteError
    `"<where><path>: NaN is not a finite number"` (or Infinity, or an integer over 64 bits)
    for the first one found in `value` (a number, or dicts and lists of them at any depth).

    The one check every entry point calls (CLI, JSON, YAML, bench import, engine output);
    `Event` construction and `codec.encode` call it too, so nothing non-finite is ever stored.
    """
    try:
        bad = bad_number(value)
    except RecursionError:
        raise NonFiniteError(f"{where}: nested too deeply to be stored") from None
    if bad is not None:
        raise NonFiniteError(f"{field_path(where, bad[0])}: {bad[1]}")


def finite_float(value: Any, where: str) -> float:
    """`value` (an int or float, not a bool) as a finite float, or NonFiniteError naming
    `where`: NaN, infinities and integers too large for a float are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NonFiniteError(f"{where}: {value!r} is not a number")
    try:
        f = float(value)
    except OverflowError:
        raise NonFiniteError(f"{where}: integer of {len(str(abs(value)))} digits is too "
                             "large for a float") from None
    if f - f != 0.0:
        raise NonFiniteError(f"{where}: {number_problem(f)}")
    return f


def metric_value(v: Any) -> tuple[float | None, str | None]:
    """A measured number as a float the ledger can store, or (None, why not): NaN,
    infinities and integers too large for a float have no place in a measurement. For
    engine and client output, where a bad number is left out (with the reason), not fatal."""
    if isinstance(v, bool):
        return float(v), None
    try:
        f = float(v)
    except OverflowError:
        return None, f"integer of {len(str(abs(v)))} digits is too large for a float"
    except (TypeError, ValueError):
        return None, f"{v!r} is not a number"
    if f - f == 0.0:
        return f, None
    return None, number_problem(f)


def without_non_finite(value: Any, where: str = "") -> tuple[Any, dict[str, str]]:
    """`value` with every number the ledger cannot hold replaced by None (dicts and lists
    copied as needed), and {path: reason} for each: for output of engines and evaluators,
    where a bad number is dropped with its reason rather than failing the run."""
    dropped: dict[str, str] = {}
    if bad_number(value) is None:
        return value, dropped

    def clean(v: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(v, Mapping):
            return {k: clean(x, (*path, k)) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x, (*path, i)) for i, x in enumerate(v)]
        problem = number_problem(v)
        if problem is None:
            return v
        dropped[field_path(where, path)] = problem
        return None

    return clean(value, ()), dropped


def json_safe(value: Any) -> Any:
    """`value` for JSON output: every float that is not finite (a NaN or an infinity from
    SQL, a computation or stored data) becomes None, so `json.dumps(..., allow_nan=False)`
    always writes valid JSON (`null` there); dicts, lists and tuples copied as needed,
    everything else as it is. The one rule of every `--json` printer (cli.py `to_json`)."""
    t = type(value)
    if t is float or isinstance(value, float):
        return value if value - value == 0.0 else None
    if t is dict or isinstance(value, Mapping):
        return {k: json_safe(x) for k, x in value.items()}
    if t is list or t is tuple or isinstance(value, list | tuple):
        return [json_safe(x) for x in value]
    return value


def json_text(value: Any, indent: int | None = None) -> str:
    """JSON text of `value`, always valid: a NaN or an infinity is written `null`
    (`json_safe`), other types by their str(). Every `--json` printer's text (cli.py
    `to_json`) and what is kept to be printed later (projections/fast_reads.py)."""
    return json.dumps(json_safe(value), indent=indent, default=str, ensure_ascii=False,
                      allow_nan=False)
