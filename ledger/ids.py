"""The one id rule: task ids, graph ids, node ids and block ids.

An id is 1 to 160 characters of lowercase letters, digits, `.`, `_` and `-`, starting and
ending with a letter or digit: `^[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?\\Z` (`\\Z`, not `$`: a
trailing newline is not part of any id). Graph ids and node ids are ids without `.` of at
most 63 characters, so the task id of a graph node, `<graph>.<node>` (and its loop attempts,
`<graph>.<node>.a<n>`), is itself an id and no two (graph, node) pairs share one.

What the rule buys: an id is safe as a file name, in a URL path, in HTML and in wiki markup
as it is; two different ids never name the same file, even on a case-insensitive file system
(there are no capitals) or after a file system drops trailing dots (an id cannot end in one).

`check_id(value, what)` is the one check, applied wherever an id enters: task files (the
`id:` field or the file name), graph and node definitions, `--task` / `--block` options that
create records. It raises `InvalidIdError` naming the field and the value (repr, truncated).

Namespaces: `graph_namespace(task_id)` names the (graph, node) whose naming produces a task
id (`<graph>.<node>` or `<graph>.<node>.a<n>`). Such an id belongs to that graph's node once
the graph is defined; `harness/loop/define.py` keeps one owner per task stream with it.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import LedgerError

MAX_ID = 160
MAX_PART_ID = 63  # graph ids and node ids: `<graph>.<node>.a<n>` stays within MAX_ID
ID_PATTERN = r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?"
PART_ID_PATTERN = r"[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?"
_ID = re.compile(ID_PATTERN)
_PART_ID = re.compile(PART_ID_PATTERN)
RULE = (f"an id is 1-{MAX_ID} characters a-z 0-9 . _ - starting and ending with a letter "
        "or digit")
PART_RULE = (f"graph and node ids are 1-{MAX_PART_ID} characters a-z 0-9 _ - starting and "
             "ending with a letter or digit")


class InvalidIdError(LedgerError, ValueError):
    """A value given as an id breaks the id rule (one line: which field, which value)."""


def shown(value: Any, limit: int = 60) -> str:
    """The value as an error shows it: repr (newlines and markup stay visible), truncated."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "…"


def is_id(value: Any, *, part: bool = False) -> bool:
    if not isinstance(value, str):
        return False
    if part:
        return len(value) <= MAX_PART_ID and _PART_ID.fullmatch(value) is not None
    return len(value) <= MAX_ID and _ID.fullmatch(value) is not None


def check_id(value: Any, what: str, *, part: bool = False) -> str:
    """`value` if it is an id (a graph or node id with `part=True`); else InvalidIdError."""
    if is_id(value, part=part):
        return value
    rule = PART_RULE if part else RULE
    if not isinstance(value, str):
        problem = f"not a string ({type(value).__name__})"
    elif not value:
        problem = "empty"
    elif len(value) > (MAX_PART_ID if part else MAX_ID):
        problem = f"{len(value)} characters"
    else:
        problem = "not a valid id"
    raise InvalidIdError(f"{what} {shown(value)} is {problem}: {rule}")


_NODE_TASK = re.compile(rf"({PART_ID_PATTERN})\.({PART_ID_PATTERN})(?:\.a[1-9][0-9]*)?")


def graph_namespace(task_id: str) -> tuple[str, str] | None:
    """(graph, node) when `task_id` is what graph `graph`'s node `node` names its task stream
    (`<graph>.<node>`) or one of its loop attempts (`<graph>.<node>.a<n>`); else None."""
    m = _NODE_TASK.fullmatch(task_id) if is_id(task_id) else None
    if m is None or len(m[1]) > MAX_PART_ID or len(m[2]) > MAX_PART_ID:
        return None
    return m[1], m[2]


def check_optional_id(value: str | None, what: str) -> str | None:
    return None if value is None else check_id(value, what)


def unknown_id_hint(value: Any) -> str:
    """For a lookup that found nothing: why, when the value cannot be an id at all. Lookups
    do not refuse such values outright: a ledger written before the rule stays readable."""
    return "" if is_id(value) else f" ({RULE})"


# Specs read back from the ledger are validated again with this context: the id rule (and
# other entry checks) ran when they entered, and an older ledger must stay readable.
LEDGER_CONTEXT = {"from_ledger": True}


def from_ledger(info: Any) -> bool:
    """In a pydantic validator: is this data read back from the ledger?"""
    ctx = getattr(info, "context", None)
    return bool(ctx and ctx.get("from_ledger"))
