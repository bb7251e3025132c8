"""Secrets split in two: a token wrapped across lines, and a token split across a mapping's
key and its value.

- `redact_wrapped(text, rules)`: a token printed at a fixed width (a PEM body, a JWT or an
  API key wrapped at 64 or 76 columns, a line-buffered child printing it in two lines) is
  found by joining each line break that stands inside a token (a token character before it,
  a next line that is one run of token characters after its indentation) and running the
  provider rules on the joined text. A match that crosses a joined break is redacted in the
  original text line by line: every line keeps its place, so a log's line numbers (and the
  artifact store's streaming redactor, which counts lines) stay right.
- `split_kind(key, value, rules)`: a key that holds the head of a token and a value that holds
  the rest (`{"sk-proj-Ab12": "Cd34…"}`, `{"Bearer": "abc…"}`, a `user:password` pair read
  into a mapping) — the provider rules run on key + separator + value, and a match that
  starts in the key and ends in the value names the kind.

Used by `redactor.Redactor` on its slow path only (text that tripped a trigger).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from .patterns import Rule

_TOKEN = r"A-Za-z0-9_\-+/=."
# A line break inside a token: `group(1)` is what the join removes.
_WRAP_BREAK = re.compile(rf"(?<=[{_TOKEN}])(\r?\n[ \t]*)(?=[{_TOKEN}]+\r?(?:\n|$))")
_BREAK = re.compile(r"(\r?\n[ \t]*)")
# A word, not the rest of a token (random token characters are rarely all letters of one case).
_WORD = re.compile(r"[A-Za-z][a-z]*|[A-Z]+")
# How far a wrapped token may run (a 4096-bit PEM body is ~50 lines of 64).
MAX_WRAP_LINES = 256
# A continuation line for the long-text scan (bytes): one run of token characters.
CONTINUATION = re.compile(rf"\r?\n[ \t]*[{_TOKEN}]+\r?(?=\n|$)".encode())


def _span(m: re.Match[str], group: int) -> tuple[int, int]:
    if group and m.lastindex and m.group(group) is not None:
        return m.span(group)
    return m.span()


def _wrap_breaks(text: str) -> list[tuple[int, int]]:
    """The spans of the line breaks (with the next line's indentation) that stand inside a
    wrapped token. A break qualifies when the line before ends with a token character, the
    line after is one run of token characters, and the lines look wrapped at a fixed width:
    the line before is at least as long as the one after, and within a run of continuation
    lines every line but the last is as long as the first (so the short last piece of a
    token ends the run: a one-word line after it is not taken for more of the token), and a
    run's first continuation is not a plain word (`done` after a line that ends a token)."""
    out: list[tuple[int, int]] = []
    width: int | None = None  # the length of the run's first continuation line
    run_at = -1  # where the line after the last accepted break starts
    for m in _WRAP_BREAK.finditer(text):
        a, b = m.span(1)
        line_start = text.rfind("\n", 0, a) + 1
        prev = text[line_start:a].rstrip("\r")
        end = text.find("\n", b)
        end = len(text) if end < 0 else end
        nxt = text[b:end].rstrip("\r")  # without its indentation
        nxt_raw = end - (text.index("\n", a) + 1)
        if line_start == run_at and width is not None:  # the line before continues a run
            ok = len(prev.strip()) == width and len(prev) >= nxt_raw
        else:  # a run's first continuation: not a word (`done` after a whole token)
            ok = len(prev) >= nxt_raw and _WORD.fullmatch(nxt) is None
            width = len(nxt)
        if ok:
            out.append((a, b))
            run_at = text.index("\n", a) + 1
    return out


def redact_wrapped(text: str, rules: Sequence[Rule]) -> str:
    """`text` with every token that a line break splits redacted line by line (see the
    module); the same object back when there is none."""
    breaks = _wrap_breaks(text)
    if not breaks:
        return text
    pieces: list[str] = []
    joins: list[int] = []  # where each removed break was, in the joined text
    removed: list[int] = []  # how much was removed up to and including each break
    last = total = 0
    for a, b in breaks:
        pieces.append(text[last:a])
        joins.append(a - total)
        total += b - a
        removed.append(total)
        last = b
    pieces.append(text[last:])
    joined = "".join(pieces)

    def orig(pos: int) -> int:  # a character's place in `text`
        i = bisect.bisect_right(joins, pos)
        return pos + (removed[i - 1] if i else 0)

    spans: list[tuple[int, int, str]] = []
    for rule in rules:
        for m in rule.pattern.finditer(joined):
            s, e = _span(m, rule.group)
            i = bisect.bisect_right(joins, s)
            if i < len(joins) and joins[i] < e:  # a joined break lies inside the match
                spans.append((orig(s), orig(e - 1) + 1, rule.label))
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    last = 0
    for a, b, label in spans:
        if a < last:  # overlaps one already redacted
            a = last
            if a >= b:
                continue
        out.append(text[last:a])
        tag = f"[REDACTED:{label}]"
        out.append("".join(p if i % 2 else (tag if p else "")
                           for i, p in enumerate(_BREAK.split(text[a:b]))))
        last = b
    out.append(text[last:])
    return "".join(out)


# Separators a split may have dropped between the head and the rest of a token.
_SPLIT_SEPS = ("", " ", ":")


def split_kind(key: str, value: str, rules: Sequence[Rule]) -> str | None:
    """The kind of the token that `key` starts and `value` continues, or None."""
    for sep in _SPLIT_SEPS:
        joined = key + sep + value
        head, tail = len(key), len(key) + len(sep)
        for rule in rules:
            for m in rule.pattern.finditer(joined):
                # From the match's start (`Bearer` in the key) to the secret's end.
                if m.start() < head and _span(m, rule.group)[1] > tail:
                    return rule.label
    return None
