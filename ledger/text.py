"""Text fit to print: the one sanitiser for what forge shows from stored or remote text.

A summary, a metric name, a SQL cell or a server's log line may carry terminal controls: a
`\\r` that lets a line overwrite itself, an ESC sequence that moves the cursor or recolours,
an OSC (`ESC ] 0 ; title BEL`) that sets the terminal's title or writes its clipboard, C1
controls (`U+009B` is a CSI on many terminals).

Contract:
- `printable(text, newlines=...)` writes every C0 control but `\\t` (and `\\n` where
  `newlines`: where a newline is structure), DEL and every C1 control as a visible
  `\\u00XX` escape; everything else is unchanged. An ESC sequence is left inert: its ESC
  byte shows as `\\u001b` and the rest is plain text. The escape is JSON's own, so a JSON
  text passed through it stays valid and decodes to the same data.
- `one_line(text, n)`: `text` on one line (runs of whitespace, newlines too, as one space),
  at most `n` characters (cut with "…"): a reason, a sub-goal, a handoff in a summary.
- `PrintableStream` is a text stream that passes every write through `printable` (newlines
  kept): the CLI's stdout and stderr, its printing edge. Bytes written to its `buffer` are
  data (an export, a protocol) and pass as they are.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROLS_KEEP_NL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m[0]):04x}"


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with its control characters written as visible escapes (module contract)."""
    return (_CONTROLS_KEEP_NL if newlines else _CONTROLS).sub(_escape, text)


def one_line(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def has_controls(text: str, *, newlines: bool = False) -> bool:
    return (_CONTROLS_KEEP_NL if newlines else _CONTROLS).search(text) is not None


class PrintableStream:
    """A text stream writing through `printable` (newlines are structure here); every other
    attribute (`buffer`, `fileno`, `isatty`, `encoding`, …) is the wrapped stream's."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, s: str) -> int:
        self.stream.write(printable(s, newlines=True))
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
