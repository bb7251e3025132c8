"""Errors the ledger raises. Every message is one line that names the stream, file or value."""


class LedgerError(Exception):
    """Base class: anything the ledger refuses or cannot do."""


class ConfigError(LedgerError):
    """forge.toml or FORGE_HOME is missing or invalid."""


class ConflictError(LedgerError):
    """Another writer appended to a stream first (optimistic concurrency)."""

    def __init__(self, stream: str, expected: int, actual: int):
        self.stream, self.expected, self.actual = stream, expected, actual
        super().__init__(
            f"conflict on stream {stream!r}: expected version {expected}, "
            f"but it is at version {actual}"
        )


class LedgerBusyError(LedgerError):
    """The store stayed locked by another writer past the lock timeout."""


class UnknownEventError(LedgerError):
    """A stored event's type is not known to this version of infer-forge."""


class CorruptEventError(LedgerError):
    """A stored event's payload cannot be decoded or validated."""


class DamagedLedgerError(LedgerError):
    """The ledger's storage itself is damaged or gone: a missing, empty, truncated or corrupt
    SQLite file, or a missing events table. `what` says what is wrong, `where` the file or
    table; the message points to `forge check`, which reports the same as a problem."""

    def __init__(self, where: str, what: str):
        self.where, self.what = where, what
        super().__init__(f"ledger {where} is damaged: {what} (run `forge check`)")


class NonFiniteError(LedgerError):
    """A value the ledger cannot hold: a float that is NaN or infinite, an integer outside
    64 bits, or (inside an event) something JSON cannot represent. Raised before anything is
    written; the message names the event type or input and the field path."""


class NotFoundError(LedgerError):
    """A stream, task, position or artifact that does not exist."""


class ArtifactIntegrityError(LedgerError):
    """An artifact's bytes no longer hash to its digest."""


class SpecError(LedgerError):
    """A spec file is invalid. `problems` holds one 'file:line: path: message' line each."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
