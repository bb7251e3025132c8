"""Serialization in one place: domain events <-> the library's `StoredEvent` (orjson).

Stored form: `topic` is the event's type name; `state` is the orjson of the event's fields
plus `"_v"` (its schema version). Reading upcasts old versions step by step through
`events.UPCASTERS`, then validates with pydantic, so a stored event is either returned
as a valid, current domain event or rejected with an error naming stream and version.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from itertools import product
from math import prod
from operator import itemgetter
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from uuid import UUID

import orjson
from eventsourcing.persistence import StoredEvent
from pydantic import BaseModel, ValidationError

from .errors import CorruptEventError, LedgerError, NonFiniteError, UnknownEventError
from .events import EVENT_TYPES, UPCASTERS, Event, check_event_values
from .numbers import field_path
from .seals import seal as seal  # a save's seal (ledger/seals.py: no pydantic)
from .secrets.redactor import Redactor

VERSION_KEY = "_v"


def encode(
    stream: str,
    version: int,
    event: Event,
    redactor: Redactor | None,
    command_id: str | None = None,
) -> StoredEvent:
    """Map a domain event to a stored event, redacting every string on the way.

    `command_id` fills the envelope's command id when the event has none."""
    payload: dict[str, Any] = event.model_dump()
    if command_id is not None and payload["command_id"] is None:
        payload["command_id"] = command_id
    # A check that allocates nothing first; only an event holding a secret is rebuilt.
    redacted = redactor is not None and redactor.has_secret(payload)
    if redacted:
        payload = redactor.value(payload)  # type: ignore[union-attr]
    # A number JSON cannot hold (NaN, infinities: orjson would write `null`, which no float
    # field reads back) is refused naming the field, whatever path built the event.
    check_event_values(type(event), payload)
    if redacted:
        _check_redacted(event, payload)
    payload[VERSION_KEY] = event.SCHEMA_VERSION
    try:
        state = orjson.dumps(payload)
    except orjson.JSONEncodeError as e:
        raise NonFiniteError(_unencodable(event.TYPE, payload, e)) from None
    return StoredEvent(
        originator_id=stream,
        originator_version=version,
        topic=event.TYPE,
        state=state,
    )


def _unencodable(topic: str, payload: Any, error: Exception) -> str:
    """One line naming the field JSON cannot encode (a non-str key, a set, bytes, …)."""

    def find(v: Any, path: tuple[Any, ...]) -> tuple[tuple[Any, ...], str] | None:
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    return path, f"key {k!r} is not a string"
                r = find(x, (*path, k))
                if r is not None:
                    return r
            return None
        if isinstance(v, list | tuple):
            for i, x in enumerate(v):
                r = find(x, (*path, i))
                if r is not None:
                    return r
            return None
        try:
            orjson.dumps(v)
        except orjson.JSONEncodeError as e:
            return path, f"{type(v).__name__} value cannot be stored ({e})"
        return None

    found = find(payload, ())
    if found is None:
        return f"{topic}: cannot be encoded: {error}"
    return f"{field_path(topic, found[0])}: {found[1]}"


def _check_redacted(event: Event, payload: dict[str, Any]) -> None:
    """A redacted event must still read back: a secret where the event's schema allows no
    `[REDACTED:…]` (a number under a secret-looking name in a float map, an id) is refused,
    naming the field and never the value, so no stored event can fail to decode."""
    try:
        type(event).model_validate_json(orjson.dumps(payload, default=str))
    except ValidationError as e:
        where = ", ".join(".".join(str(p) for p in err["loc"]) for err in e.errors()[:3])
        raise LedgerError(f"{event.TYPE}: {where} looks like a secret and cannot be redacted "
                          "there; refusing to record it") from None
    except orjson.JSONEncodeError:
        pass  # not ours to judge: the encoding below names it


def _suffix(schema_version: int) -> bytes:
    return b',"%s":%d}' % (VERSION_KEY.encode(), schema_version)


_SUFFIXES: dict[int, bytes] = {}
_VALIDATORS: dict[type[Event], Any] = {}


def decode(stream: str, version: int, topic: str, state: bytes) -> Event:
    """Map a stored event back to a current domain event (upcasting old versions).

    Fast path: `encode` writes the version key last, so a current-version payload ends with
    `,"_v":N}`; stripping it leaves the event's own JSON, which pydantic parses and validates
    in one native call. Anything else (old versions, foreign key order) takes the general
    path. Both validate fully: a corrupt payload or unknown type is always an error naming
    stream and version.
    """
    cls = EVENT_TYPES.get(topic)
    if cls is None:
        raise UnknownEventError(
            f"unknown event type {topic!r} at stream {stream!r} version {version}"
        )
    if not isinstance(state, bytes):
        state = bytes(state)  # memoryview / bytearray from some drivers
    sv = cls.SCHEMA_VERSION
    suffix = _SUFFIXES.get(sv)
    if suffix is None:
        suffix = _SUFFIXES[sv] = _suffix(sv)
    if state.endswith(suffix):
        data = state[: -len(suffix)] + b"}"
        validator = _VALIDATORS.get(cls)
        try:
            if validator is not None:
                return validator.validate_json(data)
            event = cls.model_validate_json(data)  # builds the (deferred) validator
        except ValidationError as e:
            raise _invalid(topic, stream, version, e) from None
        _VALIDATORS[cls] = cls.__pydantic_validator__  # skip the classmethod wrapper next time
        return event
    return _decode_general(cls, stream, version, topic, state)


def _decode_general(cls: type[Event], stream: str, version: int, topic: str,
                    state: bytes) -> Event:
    try:
        payload = orjson.loads(state)
    except orjson.JSONDecodeError as e:
        raise CorruptEventError(
            f"corrupt payload of {topic} at stream {stream!r} version {version}: {e}"
        ) from None
    if not isinstance(payload, dict):
        raise CorruptEventError(
            f"corrupt payload of {topic} at stream {stream!r} version {version}: not an object"
        )
    stored_v = payload.pop(VERSION_KEY, 1)
    if not isinstance(stored_v, int) or isinstance(stored_v, bool) or stored_v < 1:
        raise CorruptEventError(
            f"corrupt payload of {topic} at stream {stream!r} version {version}: "
            f"bad schema version {stored_v!r}"
        )
    while stored_v < cls.SCHEMA_VERSION:
        up = UPCASTERS.get((topic, stored_v))
        if up is None:
            raise CorruptEventError(
                f"no upcaster for {topic} v{stored_v} at stream {stream!r} version {version}"
            )
        try:
            payload = up(payload)
        except Exception as e:  # an upcaster meeting a payload it cannot lift
            raise CorruptEventError(
                f"upcasting {topic} v{stored_v} at stream {stream!r} version {version} failed: "
                f"{type(e).__name__}: {' '.join(str(e).split())}"
            ) from None
        stored_v += 1
    if stored_v > cls.SCHEMA_VERSION:
        raise UnknownEventError(
            f"{topic} v{stored_v} at stream {stream!r} version {version} is newer than this "
            f"infer-forge (knows v{cls.SCHEMA_VERSION}); upgrade infer-forge"
        )
    try:
        return cls.model_validate(payload)
    except ValidationError as e:
        raise _invalid(topic, stream, version, e) from None


def _invalid(topic: str, stream: str, version: int, e: ValidationError) -> CorruptEventError:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"]) or "payload"
    msg = " ".join(str(first["msg"]).split())
    return CorruptEventError(
        f"invalid {topic} at stream {stream!r} version {version}: {loc}: {msg}"
    )


# --- strict fast read (replay) ----------------------------------------------------------------
# Folding a long stream does not need event objects, only the payloads' fields. A stored
# payload whose every field already has exactly the JSON type its class declares (str is a
# str, a float a float, a UUID the canonical string, no unknown keys, no missing required
# key, current schema version) is what validation would accept unchanged, so a fold may read
# the parsed dict directly. Anything else, however harmless, goes back to `decode`, which
# upcasts, coerces or raises the one-line error: the fast read only ever says "yes, valid and
# current" or "ask decode".

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_SCALARS = (str, int, float, bool, type(None))
# The envelope's own id, time and cause: never read by a fold, and parsing their string
# forms is a third of the check, so replay checks only that they are strings (or None, for
# the cause). `decode` (every other read, and `forge check`) validates their forms.
_ENVELOPE_IDS = frozenset({"event_id", "occurred_at", "causation_id"})


def _is_datetime(v: Any) -> bool:
    """The form `encode` writes: RFC 3339 in UTC, with microseconds or none. Another form,
    valid or not, is for `decode` to judge."""
    if type(v) is not str:
        return False
    n = len(v)
    if (n != 25 and (n != 32 or v[19] != ".")) or v[4:17:3] != "--T::" or v[-6:] != "+00:00":
        return False
    try:  # the digits and the calendar (no 31 February)
        datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


class _Unsupported(Exception):
    """A field type the strict check does not know: its class always takes `decode`."""


class _Gen:
    """Builds the source of one check function; `consts` are the names it refers to."""

    def __init__(self) -> None:
        self.consts: dict[str, Any] = {"_uuid": _UUID, "_is_datetime": _is_datetime,
                                       "_missing": object(), "_str_none": (str, type(None))}

    def const(self, value: Any) -> str:
        name = f"_c{len(self.consts)}"
        self.consts[name] = value
        return name

    def expr(self, tp: Any, var: str, depth: int) -> str:
        """A Python expression true iff `var` has exactly the JSON form of type `tp`."""
        origin, args = get_origin(tp), get_args(tp)
        if tp is Any:
            return "True"
        if tp in _SCALARS:
            return f"{var} is None" if tp is type(None) else f"type({var}) is {tp.__name__}"
        if tp is UUID:
            return f"(type({var}) is str and _uuid({var}) is not None)"
        if tp is datetime:
            return f"_is_datetime({var})"
        if origin is Annotated:
            return self.expr(args[0], var, depth)
        if origin in (Union, UnionType):
            if all(a in _SCALARS for a in args):
                return f"type({var}) in {self.const(frozenset(args))}"
            return "(" + " or ".join(self.expr(a, var, depth) for a in args) + ")"
        if origin is Literal and all(type(a) is str for a in args):
            return f"(type({var}) is str and {var} in {self.const(frozenset(args))})"
        if origin in (dict, list) and args and (origin is list or args[0] is str):
            elem = args[-1]
            items = f"{var}.values()" if origin is dict else var
            head = f"type({var}) is {origin.__name__}"
            if elem is Any:
                return head
            if elem in _SCALARS or (get_origin(elem) in (Union, UnionType)
                                    and all(a in _SCALARS for a in get_args(elem))):
                types = frozenset(get_args(elem) or (elem,))
                # one C-level pass over the items instead of a generator
                return f"({head} and {self.const(types)}.issuperset(map(type, {items})))"
            x = f"x{depth}"
            inner = self.expr(elem, x, depth + 1)
            return f"({head} and all({inner} for {x} in {items}))"
        if isinstance(tp, type) and issubclass(tp, BaseModel) and tp is not Event:
            # A nested model (the actor): inline when every field is present, as `encode`
            # writes it; otherwise a generated function that allows defaulted fields.
            full = self.check(tp)  # also refuses models with validators
            parts = [self.expr(f.annotation, f"{var}[{n!r}]", depth + 1)
                     for n, f in tp.model_fields.items()]
            inline = " and ".join(e for e in parts if e != "True") or "True"
            keys = self.const(tp.model_fields.keys() | set())
            return (f"(type({var}) is dict and (({var}.keys() == {keys} and {inline}) "
                    f"or {self.const(full)}({var})))")
        raise _Unsupported(repr(tp))

    def check(self, model: type[BaseModel], version: int | None = None) -> Callable[..., bool]:
        """Generate a function checking a payload dict of `model` field by field: one body
        with every field present (as `encode` writes them, subscripts only), one for payloads
        that leave defaulted fields out. No call per field: this runs once per replayed event.
        Raises _Unsupported for a field type it does not know, or a model with validators."""
        dec = model.__pydantic_decorators__
        if dec.field_validators or dec.model_validators or model.model_config.get("extra") != \
                "forbid":
            raise _Unsupported(model.__name__)
        fields = model.model_fields
        allowed = set(fields) | ({VERSION_KEY} if version is not None else set())
        required = {n for n, f in fields.items() if f.is_required()}
        if version is not None:
            required.add(VERSION_KEY)
        envelope = issubclass(model, Event)
        forms = {n: _envelope_form(f.annotation) if envelope and n in _ENVELOPE_IDS
                 else f.annotation for n, f in fields.items()}
        memo = {n: _str_only(tp) and (get_origin(tp) in (dict, list) or (
            isinstance(tp, type) and issubclass(tp, BaseModel))) for n, tp in forms.items()}
        checks = [(n, self.expr(tp, "v", 0), memo[n]) for n, tp in forms.items()]
        checks = [c for c in checks if c[1] != "True"]
        plain = {n: t for n, tp in forms.items()
                 if not memo[n] and (t := _plain_types(tp)) is not None}
        every = self.const(frozenset(allowed))
        lines = ["def check(p):", "    keys = p.keys()",
                 f"    if not (keys == {every} or (keys <= {every} and "
                 f"{self.const(frozenset(required))} <= keys)):",
                 "        return False"]
        if version is not None:
            lines += [f"    v = p[{VERSION_KEY!r}]",
                      f"    if type(v) is not int or v != {version}:", "        return False"]
        lines.append(f"    if len(keys) == {len(allowed)}:")
        # Fields checked by their top-level type alone: one tuple of types, one set lookup.
        if len(plain) > 1 and prod(len(t) for t in plain.values()) <= 4096:
            sigs = self.const(frozenset(product(*plain.values())))
            getter = self.const(itemgetter(*plain))
            lines += [f"        if tuple(map(type, {getter}(p))) not in {sigs}:",
                      "            return False"]
            checks_full = [c for c in checks if c[0] not in plain]
        else:
            checks_full = checks
        for n, e, memoize in checks_full:
            lines.append(f"        v = p[{n!r}]")
            if memoize:
                # Equal to the last value that passed: the same value (a str or None only
                # ever equals a str or None), so the same verdict, for one C-level compare.
                last = self.const([self.consts["_missing"]])
                lines += [f"        if v != {last}[0]:", f"            if not {e}:",
                          "                return False", f"            {last}[0] = v"]
            else:
                lines += [f"        if not {e}:", "            return False"]
        lines.append("        return True")
        for n, e, _ in checks:
            lines += [f"    v = p.get({n!r}, _missing)",
                      f"    if v is not _missing and not {e}:", "        return False"]
        lines.append("    return True")
        ns = dict(self.consts)
        exec("\n".join(lines), ns)  # noqa: S102 - source generated above from the fields
        return ns["check"]


def _envelope_form(tp: Any) -> Any:
    """The envelope id or time as replay checks it: a string (or None where allowed)."""
    return str | None if type(None) in get_args(tp) else str


def _plain_types(tp: Any) -> tuple[type, ...] | None:
    """The exact types whose values are all valid for `tp`, when its check is by the
    top-level type alone (scalars, their unions, JSON objects); None otherwise."""
    if tp is Any:
        return None
    if tp in _SCALARS:
        return (tp,)
    if get_origin(tp) in (Union, UnionType) and all(a in _SCALARS for a in get_args(tp)):
        return get_args(tp)
    if get_origin(tp) is dict and get_args(tp) and get_args(tp)[0] is str \
            and get_args(tp)[1] is Any:
        return (dict,)
    if get_origin(tp) is list and get_args(tp) and get_args(tp)[0] is Any:
        return (list,)
    return None


def _str_only(tp: Any) -> bool:
    """Whether every value of type `tp` is built of dicts, lists, str and None only, so that
    equality with a value that passed the check implies the same types (unlike 1 == 1.0)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp in (str, type(None)):
        return True
    if origin is Literal:
        return all(type(a) is str for a in args)
    if origin in (Union, UnionType, list, Annotated):
        return all(_str_only(a) for a in (args[:1] if origin is Annotated else args))
    if origin is dict:
        return bool(args) and _str_only(args[1])
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return all(_str_only(f.annotation) for f in tp.model_fields.values())
    return False


def never(payload: dict[str, Any]) -> bool:
    """The check of a type the strict check cannot express: always decode in full."""
    return False


def _build_check(cls: type[Event]) -> Callable[[dict[str, Any]], bool]:
    try:
        return _Gen().check(cls, cls.SCHEMA_VERSION)
    except _Unsupported:
        return never


_CHECKS: dict[str, Callable[[dict[str, Any]], bool]] = {}


def current_check(topic: str) -> Callable[[dict[str, Any]], bool] | None:
    """The check `load_current` applies to a parsed payload of `topic` (None: unknown type)."""
    check = _CHECKS.get(topic)
    if check is None:
        cls = EVENT_TYPES.get(topic)
        if cls is None:
            return None
        check = _CHECKS[topic] = _build_check(cls)
    return check


def load_current(topic: str, state: bytes) -> dict[str, Any] | None:
    """The stored payload as a dict (with `"_v"`) when validation would accept it unchanged
    as a current-version `topic` event; None otherwise, and then `decode` decides (it
    upcasts, coerces lax forms, or raises the error naming stream and version)."""
    check = current_check(topic)
    if check is None:
        return None
    try:
        payload = orjson.loads(state)
    except orjson.JSONDecodeError:
        return None
    if type(payload) is not dict or not check(payload):
        return None
    return payload


# --- stored forms: the table the readers without models use (ledger/stored_forms.py) ---------
# What a stored payload of each current type looks like, so that a reader that loads no model
# (`projections/fast_reads.py`) can tell a payload of exactly the current form and print its
# `model_dump(mode="json")` from the stored JSON. Generated here from the models;
# tests/ledger/test_stored_forms.py holds ledger/stored_forms.py's copy equal to it.


def _form(tp: Any) -> Any:
    """The stored form of a field of type `tp`: "p" (JSON as dumped: scalars, `Any`, and
    containers of them), "dt" (a datetime: orjson writes `+00:00` where the JSON dump writes
    `Z`), ("l", form) a list, ("d", form) a str-keyed dict, ("m", fields, {name: form})
    a nested model, ("s", fields, required, {name: form}) a nested model whose serializer
    leaves fields out (GateResult's: a new field while None), so a stored one holds the
    required fields and some of the others, each dumped as stored; raises _Unsupported for
    anything else."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any or tp in _SCALARS or tp is UUID:
        return "p"
    if tp is datetime:
        return "dt"
    if origin is Annotated:
        if any(type(m).__name__.endswith("Serializer") for m in args[1:]):
            raise _Unsupported(repr(tp))
        return _form(args[0])
    if origin is Literal:
        if all(type(a) in (str, int, bool) or a is None for a in args):
            return "p"
        raise _Unsupported(repr(tp))
    if origin in (Union, UnionType):
        forms = {repr(_form(a)) for a in args if a is not type(None)}
        if len(forms) == 1:
            return _form(next(a for a in args if a is not type(None)))
        if forms <= {"'p'"}:
            return "p"
        raise _Unsupported(repr(tp))
    if origin in (list, tuple) and args and (origin is list or (len(args) == 2
                                                                and args[1] is Ellipsis)):
        inner = _form(args[0])
        return "p" if inner == "p" else ("l", inner)
    if origin is tuple and args and all(_form(a) == "p" for a in args):
        return "p"  # a fixed tuple of scalars: a list in both dumps
    if origin is dict and args and args[0] is str:
        inner = _form(args[1])
        return "p" if inner == "p" else ("d", inner)
    if origin in (list, dict) and not args:
        return "p"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _model_form(tp)
    raise _Unsupported(repr(tp))


def _model_form(model: type[BaseModel]) -> tuple[Any, ...]:
    dec = model.__pydantic_decorators__
    if dec.field_serializers or dec.computed_fields \
            or model.model_config.get("extra") != "forbid":
        raise _Unsupported(model.__name__)
    names = tuple(n for n, f in model.model_fields.items() if not f.exclude)
    nested = {}
    for n in names:
        f = _form(model.model_fields[n].annotation)
        if f != "p":
            nested[n] = f
    if dec.model_serializers:
        if issubclass(model, Event) or not all(
                s.info.mode == "wrap" for s in dec.model_serializers.values()):
            raise _Unsupported(model.__name__)
        required = tuple(n for n in names if model.model_fields[n].is_required())
        return ("s", names, required, nested)
    return ("m", names, nested)


def stored_forms() -> dict[str, tuple[int, Any]]:
    """Per event type: its schema version and stored form (`_form` of the class; None where
    a field has a type the table cannot express: that type is always decoded)."""
    out: dict[str, tuple[int, Any]] = {}
    for name in sorted(EVENT_TYPES):
        cls = EVENT_TYPES[name]
        if not cls.__module__.startswith("infer_forge."):
            continue  # a test's own event type
        try:
            form: Any = _model_form(cls)
        except _Unsupported:
            form = None
        out[name] = (cls.SCHEMA_VERSION, form)
    return out
