"""Redaction of a stream of chunks (`ArtifactStore.put_stream`): a secret split across a
chunk boundary, or across two lines that arrive in different chunks, is still redacted.

Contract: `StreamRedactor(redactor)`; `feed(chunk) -> bytes` returns what may be written now,
`finish() -> bytes` the rest. The concatenated output equals `redactor.text` of the whole
input (a line longer than `MAX_HOLD` aside), and is never more than `MAX_HOLD` bytes plus a
line behind.

How: the input is released a line at a time. The last `HOLD_LINES` complete lines and the
incomplete one stay held (lookahead: `Authorization:` waits for the line that holds its
value), and with them a run of token-only lines and the line before it (a wrapped token's head
waits for all of its rest); the last lines already released are kept
as context (lookbehind: the rest of a wrapped token is redacted with its head before it).
Each release redacts context + released + held text together and keeps the released lines
of the result: every redaction keeps line breaks (`patterns.tag_lines`), so line k of
the result is line k of the input. Context grows back over a run of token-only lines (a
wrapped token of any length keeps its head in view) and, inside an open private-key block,
is the block's BEGIN line, so the body that follows in later chunks is redacted too.

A chunk that is not UTF-8 text (a binary artifact) is passed through as `put` stores binary
content; a line longer than `MAX_HOLD` is released at a delimiter without lookahead.
"""

from __future__ import annotations

import re

from .redactor import Redactor

HOLD_LINES = 3
CONTEXT_LINES = 4
MAX_HOLD = 1 << 20  # bytes held back before a release is forced
MAX_CONTEXT = 64 << 10  # bytes of context kept over a wrapped token
_TOKEN_LINE = re.compile(rb"[ \t]*[A-Za-z0-9_\-+/=.]+\r?")
_OPENS = re.compile(rb"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-\d+:")
_CLOSES = re.compile(rb"-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|Private-MAC:")
_MARKERS = re.compile(_OPENS.pattern + b"|" + _CLOSES.pattern)
_BLOCK_CONTEXT = {b"-": b"-----BEGIN PRIVATE KEY-----\n", b"P": b"PuTTY-User-Key-File-2: x\n"}
# Where a forced release may cut a long line: no token holds these.
_DELIMITER = re.compile(rb"[\s\"',;<>(){}\[\]|]")


class StreamRedactor:
    def __init__(self, redactor: Redactor):
        self._red = redactor
        self._pending = b""  # not released yet
        self._recent = b""  # the last complete lines released (real text, for context)
        self._open = b""  # b"-" / b"P": a key block opened and not closed yet

    def feed(self, chunk: bytes) -> bytes:
        self._pending += chunk
        cut = _cut(self._pending, HOLD_LINES)
        # A token wrapped over the held lines keeps its head (and the run) held with them:
        # the head is redacted only when the rest is in view.
        while cut > 0 and _continues(self._pending, cut):
            cut = self._pending.rfind(b"\n", 0, cut - 1) + 1
        if cut > 0:
            return self._release(cut, lookahead=True)
        return self._force() if len(self._pending) > MAX_HOLD else b""

    def finish(self) -> bytes:
        return self._release(len(self._pending), lookahead=False) if self._pending else b""

    def _context(self) -> bytes:
        return _BLOCK_CONTEXT[self._open] if self._open else self._recent

    def _release(self, cut: int, *, lookahead: bool) -> bytes:
        head, rest = self._pending[:cut], self._pending[cut:]
        self._pending = rest
        # Lookahead: the held complete lines (a partial line may end inside a character).
        ahead = rest[:rest.rfind(b"\n") + 1] if lookahead else b""
        context = self._context()
        try:
            text = (context + head + ahead).decode("utf-8")
        except UnicodeDecodeError:
            # Not UTF-8 text: stored as is, as `put` stores binary content.
            self._recent, self._open = b"", b""
            return head
        clean = self._red.text(text)
        if clean is text:
            out = head
        else:
            lines = clean.split("\n")
            if len(lines) != text.count("\n") + 1:  # pragma: no cover - rules keep lines
                raise AssertionError("a redaction changed the number of lines")
            skip = context.count(b"\n")
            n = head.count(b"\n") + (0 if head.endswith(b"\n") else 1)
            body = "\n".join(lines[skip:skip + n])
            out = (body + "\n" if head.endswith(b"\n") else body).encode("utf-8")
        self._advance(head)
        return out

    def _force(self) -> bytes:
        """A line longer than MAX_HOLD: release up to its last delimiter, no lookahead."""
        last = None
        for m in _DELIMITER.finditer(self._pending, max(0, len(self._pending) - 4096)):
            last = m.end()
        cut = last or len(self._pending)
        rest = self._pending[cut:]
        self._pending = self._pending[:cut]
        out = self._release(cut, lookahead=False)
        self._pending = rest
        return out

    def _advance(self, head: bytes) -> None:
        """The context for the next release, after `head` was released."""
        for m in _MARKERS.finditer(head):
            self._open = m.group()[:1] if _OPENS.fullmatch(m.group()) else b""
        if not head.endswith(b"\n"):
            self._recent = b""  # a forced cut: the next text does not start a line
            return
        lines = (self._recent + head).split(b"\n")[:-1]  # complete lines only
        keep = min(CONTEXT_LINES, len(lines))
        size = sum(len(x) + 1 for x in lines[-keep:])
        # Grow back over a run of token-only lines: a wrapped token keeps its head in view.
        while keep < len(lines) and size < MAX_CONTEXT and _TOKEN_LINE.fullmatch(lines[-keep]):
            keep += 1
            size += len(lines[-keep]) + 1
        self._recent = b"".join(x + b"\n" for x in lines[-keep:]) if keep else b""


def _continues(data: bytes, cut: int) -> bool:
    """Whether the line that starts at `cut` may continue a token wrapped from the line
    before it (which ends with a token character): then they are released together."""
    before = data[data.rfind(b"\n", 0, cut - 1) + 1:cut - 1].rstrip(b"\r")
    end = data.find(b"\n", cut)
    after = data[cut:len(data) if end < 0 else end]
    return bool(before) and _TOKEN_LINE.fullmatch(after) is not None and \
        _TOKEN_LINE.fullmatch(before[-1:]) is not None


def _cut(data: bytes, hold: int) -> int:
    """Where released text ends: after the line `hold` complete lines before the last
    (incomplete) one; 0 when there are not that many."""
    pos = len(data)
    for _ in range(hold + 1):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1
