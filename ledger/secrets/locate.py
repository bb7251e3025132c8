"""Where a structured value holds a secret, without repeating it: for the spec check
(`spec_check`) and `forge secrets scan`, which name the field, never the value.

`locate(red, value, names_ok=)`: `(location, kind)` per finding, the location as keys and
indexes (a pydantic error location), the kind as `red`'s tag would name it (a provider's
kind when the value has one, else `named-secret`). The same rules as `Redactor.value`: a
secret in any string or key, a value under a secret name or beside one (`{name: …, value:
…}`), after a secret-named flag or in a `[NAME, value]` pair, a token split over a key and
its value. `names_ok`: a value under a secret name that is an environment variable's name
(`api_key: OPENAI_API_KEY`, `secrets: [HF_TOKEN]`) is a reference to the secret, not the
secret.

`shown(red, loc)`: the location fit to print: a key that holds a secret, or may hold the head
of one (it trips a trigger and is no secret's name: `hf_token` is a name), as `[REDACTED]`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .names import NOT_SECRET, name_strength
from .patterns import plugin_rules
from .redactor import (
    POINTED_VALUES,
    flag_values,
    named_secret,
    pointed_strength,
)
from .splits import split_kind

if TYPE_CHECKING:
    from .redactor import Redactor

# An environment variable's name (`OPENAI_API_KEY`): what a spec names instead of a secret.
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")

Found = list[tuple[tuple[Any, ...], str]]


def locate(red: Redactor, value: Any, *, names_ok: bool = False,
           loc: tuple[Any, ...] = ()) -> Found:
    if isinstance(value, str):
        kinds = red.secret_kinds(value)
        return [(loc, ", ".join(kinds))] if kinds else []

    def named(strength: int, v: Any) -> bool:
        if names_ok and isinstance(v, list | tuple):  # `secrets: [HF_TOKEN]`: names
            return any(named(strength, x) for x in v)
        if names_ok and isinstance(v, str) and _ENV_NAME.fullmatch(v.strip()):
            return False
        return named_secret(strength, v)

    def kind_of(v: Any) -> str:  # the value's own kind, if it has one
        return ", ".join(red.secret_kinds(v) if isinstance(v, str) else []) or "named-secret"

    out: Found = []
    if isinstance(value, dict):
        pointed = pointed_strength(value)
        for k, v in value.items():
            where = (*loc, k)
            if isinstance(k, str):
                kinds = red.secret_kinds(k)
                if kinds:
                    out.append((where, ", ".join(kinds)))
                    continue
                if isinstance(v, str) and red.is_head(k):
                    split = split_kind(k, v, plugin_rules())
                    if split:
                        out.append((where, split))
                        continue
            strength = name_strength(k) if isinstance(k, str) else NOT_SECRET
            if not strength and pointed and k in POINTED_VALUES:
                strength = pointed
            if strength and named(strength, v):
                out.append((where, kind_of(v)))
            else:
                out += locate(red, v, names_ok=names_ok, loc=where)
    elif isinstance(value, list | tuple):
        flagged = flag_values(value)
        for i, v in enumerate(value):
            if i in flagged and not (names_ok and _ENV_NAME.fullmatch(str(v).strip())):
                out.append(((*loc, i), kind_of(v)))
            else:
                out += locate(red, v, names_ok=names_ok, loc=(*loc, i))
    return out


def shown(red: Redactor, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple("[REDACTED]" if isinstance(p, str) and (red.text(p) is not p or (
        red.might_contain_secret(p) and not name_strength(p))) else p for p in loc)
