"""Reading a stream through its one fold, with the version a writer must expect."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from ..ledger.store import Ledger, Recorded


class Versioned(Protocol):
    version: int


B = TypeVar("B", bound=Versioned)


def read_stream(ledger: Ledger, stream: str, fold: Callable[[Iterable[Recorded]], B]) -> B:
    """`fold` over the stream's decodable events. The version counts an undecodable last
    event too: a writer expecting it must neither conflict forever nor pass over an event it
    could not read (left out here; `forge check` reports it)."""
    skipped: list[int] = []
    book = fold(ledger.stream(stream, on_error=lambda u: skipped.append(u.version)))
    book.version = max([book.version, *skipped])
    return book
