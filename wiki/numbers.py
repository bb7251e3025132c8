"""Numbers as the journal shows them (pure): by magnitude, never in e-notation, with the unit a
metric's name implies (`11,734 tok/s`, `88.4 ms`, `0.934`), and counted nouns with the right
plural ("1 task", "2 tasks").

Contracts:
- `number(v)`: an int as itself with thousands separators from 1,000; a float by magnitude:
  from 100 a whole number with separators, from 10 one decimal, from 1 two, below 1 three
  significant digits (down to 1e-9, then "0"); trailing zeros dropped; never an exponent.
  Not-a-number and infinities as "nan", "inf", "-inf"; anything else as its str.
- `exact(v)`: a threshold as written (`2,000.5`, `500`): every digit of the shortest repr,
  with thousands separators; never an exponent (a value repr writes with one: `number`).
- `unit(metric)`: the unit of a metric by its name (`*_ms` → ms, `*_s` → s, token
  throughputs → tok/s, `request_throughput` → req/s, `*_bytes` → B), else "" (ratios, counts).
- `metric_value(metric, v)`: `number(v)` and the metric's unit.
- `count(n, noun)`: "1 task", "2 tasks" ("y" → "ies" after a consonant, "s"/"x"/"ch"/"sh" →
  "es").
"""

from __future__ import annotations

import math
from typing import Any

SMALLEST = 1e-9  # below this a float shows as 0 (noise, not a measurement)


def _trim(s: str) -> str:
    return s.rstrip("0").rstrip(".") if "." in s else s


def number(v: Any) -> str:
    """A number as the journal shows it (module contract)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return _trim(f"{v:.1f}")
    if a >= 1:
        return _trim(f"{v:.2f}")
    if a < SMALLEST:
        return "0"
    decimals = 2 - math.floor(math.log10(a))  # three significant digits
    out = _trim(f"{v:.{decimals}f}")
    return "0" if out in ("0", "-0") else out


def exact(v: Any) -> str:
    """A threshold as written (module contract)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    f = float(v)
    if not math.isfinite(f) or (f != 0 and not 1e-4 <= abs(f) < 1e15):
        return number(v)
    if f.is_integer():
        return f"{int(f):,}"
    whole, _, frac = repr(abs(f)).partition(".")
    return f"{'-' if f < 0 else ''}{int(whole):,}.{frac}"


def unit(metric: str) -> str:
    """The unit a metric's name implies (module contract)."""
    m = metric.lower()
    if m.endswith("_ms"):
        return "ms"
    if m.endswith("per_s"):  # a rate: tokens or requests per second
        return "req/s" if "request" in m else "tok/s" if "token" in m else "/s"
    if m.endswith("_s") or m.endswith("_seconds"):
        return "s"
    if m.endswith("_bytes"):
        return "B"
    if m == "request_throughput" or m.endswith("requests_per_s"):
        return "req/s"
    if m.endswith("throughput") or m.endswith("tokens_per_s") or m.endswith("tok_s"):
        return "tok/s"
    return ""


def metric_value(metric: str, v: Any) -> str:
    """A metric's value with its unit ("—" for none)."""
    if v is None:
        return "—"
    u = unit(metric) if isinstance(v, int | float) and not isinstance(v, bool) else ""
    return f"{number(v)} {u}" if u else number(v)


def count(n: int, noun: str) -> str:
    """`n` and the noun, plural unless n is 1 (module contract)."""
    if n == 1:
        return f"1 {noun}"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        plural = noun[:-1] + "ies"
    elif noun.endswith(("s", "x", "ch", "sh")):
        plural = noun + "es"
    else:
        plural = noun + "s"
    return f"{number(n)} {plural}"
