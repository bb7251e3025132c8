"""Writing the journal's files: only when their bytes change, never half-written."""

from __future__ import annotations

from pathlib import Path

from ..ledger.atomic import write_atomic


def write_if_changed(path: Path, data: str | bytes) -> bool:
    """Write `data` (text as UTF-8) to `path` unless the file already holds it; False then.
    A changed file is replaced atomically (a reader sees the old or the new bytes); a new
    one is written in place (nobody can be reading a half-written file that did not exist)."""
    b = data.encode("utf-8") if isinstance(data, str) else data
    if path.exists():
        if path.read_bytes() == b:
            return False
        write_atomic(path, b)
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b)
    return True
