"""Serialization in one place: domain events <-> the library's `StoredEvent` (orjson).

Stored form: `topic` is the event's type name; `state` is the orjson of the event's fields
plus `"_v"` (its schema version). Reading upcasts old versions step by step through
`events.UPCASTERS`, then validates with pydantic, so a stored event is either returned
as a valid, current domain event or rejected with an error naming stream and version.
"""

from __future__ import annotations

from typing import Any

import orjson
from eventsourcing.persistence import StoredEvent
from pydantic import ValidationError

from .errors import CorruptEventError, UnknownEventError
from .events import EVENT_TYPES, UPCASTERS, Event
from .redact import Redactor

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
    if redactor is not None and redactor.has_secret(payload):
        payload = redactor.value(payload)
    payload[VERSION_KEY] = event.SCHEMA_VERSION
    return StoredEvent(
        originator_id=stream,
        originator_version=version,
        topic=event.TYPE,
        state=orjson.dumps(payload),
    )


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
