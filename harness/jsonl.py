"""JSON lines, read one way: a file of JSON values one per line (a dataset, bench_serving
results, stored records), and the last JSON line a command prints on stdout (an evaluator's
metrics, an executor's answer, a graph node's metrics).

- `read_lines` yields (line number, raw bytes); a line longer than `max_line_bytes` or an
  unreadable file is a one-line HarnessError naming `path:line`, so memory stays bounded.
- `parse_line` reads one line: blank is None; not UTF-8, malformed JSON or JSON nested too
  deeply is a one-line HarnessError naming `where` (`path:line`).
- `iter_jsonl` is both: (line number, value) for each non-blank line.
- `last_json_line` is the value on the last non-empty line of a text, or ValueError saying
  why there is none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import HarnessError

MAX_LINE_BYTES = 16 << 20


def read_lines(path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES
               ) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes with the line ending) of the file at `path`."""
    p = Path(path)
    try:
        f = p.open("rb")
    except OSError as e:
        raise HarnessError(f"cannot read {p}: {e.strerror or e}") from None
    no = 0
    with f:
        while True:
            try:
                raw = f.readline(max_line_bytes + 1)
            except OSError as e:
                raise HarnessError(f"{p}:{no + 1}: cannot read: {e.strerror or e}") from None
            if not raw:
                return
            no += 1
            if len(raw) > max_line_bytes:
                raise HarnessError(f"{p}:{no}: line longer than {max_line_bytes >> 20} MiB")
            yield no, raw


def parse_line(raw: bytes | str, where: str) -> Any | None:
    """The JSON value of one line (None when blank)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise HarnessError(f"{where}: not UTF-8 text") from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise HarnessError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise HarnessError(f"{where}: malformed JSON (nested too deeply)") from None


def iter_jsonl(path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES
               ) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line of the JSONL file at `path`."""
    for no, raw in read_lines(path, max_line_bytes=max_line_bytes):
        value = parse_line(raw, f"{path}:{no}")
        if value is not None:
            yield no, value


def iter_jsonl_text(lines: Iterable[bytes | str], where: str) -> Iterator[tuple[int, Any]]:
    """`iter_jsonl` over lines already in memory (e.g. an artifact); errors name `where:N`."""
    for no, raw in enumerate(lines, 1):
        value = parse_line(raw, f"{where}:{no}")
        if value is not None:
            yield no, value


def last_json_line(text: str) -> Any:
    """The JSON value on the last non-empty line of `text` (a command's stdout). ValueError
    with a one-line reason when that line is missing or not JSON."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("no output on stdout (expected a JSON object)")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"last stdout line is not JSON: {e.msg} in {lines[-1][:120]!r}") \
            from None
    except RecursionError:
        raise ValueError(f"last stdout line is not JSON: nested too deeply in "
                         f"{lines[-1][:120]!r}") from None
