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
    if redactor is not None:
        payload = redactor.value(payload)
    payload[VERSION_KEY] = event.SCHEMA_VERSION
    return StoredEvent(
        originator_id=stream,
        originator_version=version,
        topic=event.TYPE,
        state=orjson.dumps(payload),
    )


def decode(stream: str, version: int, topic: str, state: bytes) -> Event:
    """Map a stored event back to a current domain event (upcasting old versions)."""
    cls = EVENT_TYPES.get(topic)
    if cls is None:
        raise UnknownEventError(
            f"unknown event type {topic!r} at stream {stream!r} version {version}"
        )
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
    while stored_v < cls.SCHEMA_VERSION:
        up = UPCASTERS.get((topic, stored_v))
        if up is None:
            raise CorruptEventError(
                f"no upcaster for {topic} v{stored_v} at stream {stream!r} version {version}"
            )
        payload = up(payload)
        stored_v += 1
    if stored_v > cls.SCHEMA_VERSION:
        raise UnknownEventError(
            f"{topic} v{stored_v} at stream {stream!r} version {version} is newer than this "
            f"infer-forge (knows v{cls.SCHEMA_VERSION}); upgrade infer-forge"
        )
    try:
        return cls.model_validate(payload)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise CorruptEventError(
            f"invalid {topic} at stream {stream!r} version {version}: {loc}: {first['msg']}"
        ) from None
