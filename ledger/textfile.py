"""Reading a small text file someone hands in (a spec, forge.toml, a metrics JSON): bounded in
size, read no further than the bound, UTF-8 only. The one reader behind `yamlio`, `config` and
the bench importer; each puts the file (and its own error class) before the reason."""

from __future__ import annotations

from pathlib import Path

from .errors import LedgerError


class TextFileError(LedgerError):
    """Why a file is not readable text: a one-line reason without the file's name; `line` is the
    1-based line of an undecodable byte (0 when the problem has no line)."""

    def __init__(self, reason: str, line: int = 0):
        self.line = line
        super().__init__(reason)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def read_text(path: Path, max_bytes: int, what: str) -> str:
    """The file's text. `what` names what the file should be (`a YAML spec`), for the reason
    given when it is larger than `max_bytes` or not UTF-8."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise TextFileError(f"cannot read: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise TextFileError(f"larger than {_size(max_bytes)} (not {what}?)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextFileError(f"not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}): "
                            f"not {what}?", raw[:e.start].count(b"\n") + 1) from None
