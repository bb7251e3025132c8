"""Human titles for what a person reads first (pure): a candidate's, from its key/value dict
(`dtype=bfloat16, continuous batching off`), and a task's, from its goal when no title was
given (a whole clause, never a cut word).

Used by the journal (wiki/) and by the terminal (`forge compare`): one spelling of a candidate
everywhere a person reads it. Events keep their exact keys (`engine.dtype`); a title is for
reading only, never parsed back.

Contracts:
- `candidate_title(c)`: "baseline" for the empty candidate; else `name=value` per key (the
  settings in key order, then the switches), where the name drops the `engine.`, `profile.`
  or `topology.` prefix and a `code.<member>` key reads `<member>@<short commit>`; booleans
  read `<name words> on|off` (underscores as spaces); text values are unquoted; other values
  are their JSON.
- `candidate_title_of_key(key)`: the same for the index's candidate key (sorted-keys JSON);
  a key that is not a JSON object is shown as it is.
- `dimension_value(dimension, value)`: a compared dimension's value as a person reads it: the
  `candidate_key` dimension (one key, or several joined by ", ") by `candidate_title_of_key`,
  several joined by "; "; any other as it is ("" for None).
- `task_title(title, goal)`: the title a task was given; else its goal when short, else the
  goal's first clause (cut at a clause word or punctuation) when that leaves a readable
  title, else the goal cut at a word boundary with "…". The full goal stays on the page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

BASELINE = "baseline"
PREFIXES = ("engine.", "profile.", "topology.")
CODE = "code."
TITLE_CHARS = 72  # a task title longer than this is made from its goal's first clause
MIN_CLAUSE = 24  # a shorter first clause reads as a fragment: cut at a word instead
# Where a goal's first clause ends: punctuation, or a word that starts a second clause.
_CLAUSE = re.compile(r"[.;:,—–]\s|\s(?:and|but|while|without|so that|so|or|then|whereas)\s")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False, sort_keys=True)


def _name(key: str) -> str:
    for p in PREFIXES:
        if key.startswith(p) and len(key) > len(p):
            return key[len(p):]
    return key


def _part(key: str, v: Any) -> str:
    if key.startswith(CODE) and len(key) > len(CODE):
        member = key[len(CODE):]
        return f"{member}@{v[:7]}" if isinstance(v, str) and _COMMIT.fullmatch(v) else \
            f"{member}@{_value(v)}"
    name = _name(key)
    if isinstance(v, bool):
        return f"{name.replace('_', ' ')} {'on' if v else 'off'}"
    return f"{name}={_value(v)}"


def candidate_title(candidate: Mapping[str, Any] | None) -> str:
    """A candidate as a person reads it (module contract)."""
    if not candidate:
        return BASELINE
    keys = sorted(candidate, key=lambda k: (isinstance(candidate[k], bool), str(k)))
    return ", ".join(_part(str(k), candidate[k]) for k in keys)


def candidate_title_of_key(key: str | None) -> str:
    """`candidate_title` of the index's candidate key (sorted-keys JSON; None or "{}": the
    baseline)."""
    if key in (None, "", "{}"):
        return BASELINE
    try:
        cand = json.loads(key)
    except ValueError:
        return str(key)
    return candidate_title(cand) if isinstance(cand, dict) else str(key)


def dimension_value(dimension: str, value: str | None) -> str:
    """A compared dimension's value as a person reads it (module contract)."""
    if dimension == "candidate_key" and value:
        return "; ".join(candidate_title_of_key(k) for k in _keys(value))
    return "" if value is None else str(value)


def _keys(value: str) -> list[str]:
    # A subject over several candidates joins their keys with ", " (projections.queries._dims);
    # a key's own text may hold ", ", so split by decoding one JSON value after another.
    dec, at = json.JSONDecoder(), 0
    keys: list[str] = []
    while at < len(value):
        try:
            _, end = dec.raw_decode(value, at)
        except ValueError:
            return keys + [value[at:]]
        keys.append(value[at:end])
        at = end + 2 if value.startswith(", ", end) else end
        if at == end and at < len(value):
            return keys + [value[at:]]
    return keys


def _cut_at_word(s: str, limit: int) -> str:
    head = s[:limit + 1]
    cut = head.rfind(" ")
    return (head[:cut] if cut >= MIN_CLAUSE else s[:limit]).rstrip(" ,;:.—–") + "…"


def task_title(title: str | None, goal: str | None) -> str:
    """A task's human title (module contract). A stored title that is the goal cut at
    `len(title)` characters (what forge recorded for an untitled task) counts as none."""
    goal = " ".join((goal or "").split())
    if title and not (goal and len(title) < len(goal) and goal.startswith(title)):
        return " ".join(title.split())
    if len(goal) <= TITLE_CHARS:
        return goal
    ends = [m.start() for m in _CLAUSE.finditer(goal) if MIN_CLAUSE <= m.start() <= TITLE_CHARS]
    if ends:  # the last clause end within the limit makes the fullest title
        return goal[:ends[-1]].rstrip(" ,;:.—–")
    return _cut_at_word(goal, TITLE_CHARS)
