"""Tool output on the site: a bounded, redacted preview of an artifact a decision's trace names
(a tool's stdout or stderr, an engine's log) and a page per artifact with a longer excerpt.

Contracts:
- `preview(digest, what, relative, data)` is pure: the artifact's bytes as text (UTF-8,
  undecodable bytes replaced), terminal escapes and control characters removed, secrets
  redacted (`ledger.secrets.redactor.redact_message`: provider patterns, the values of the
  secret-named environment variables); `head` is its first HEAD_LINES lines (each cut at
  LINE_CHARS), `excerpt` its first PAGE_LINES lines within PAGE_CHARS. The caller reads at
  most READ_BYTES of the file (wiki/build.py).
- `artifact_path(digest)`: the page of an artifact (`artifacts/<first 16 hex digits>`).
- `artifact_page(p, position)`: the page: what it is, its digest and file, the excerpt (as
  code: never markup), and whether it was cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .page import Page, code, strong, text

READ_BYTES = 64 * 1024  # of an artifact's file read for its preview and page
HEAD_LINES, LINE_CHARS = 8, 160  # the preview beside a tool call
PAGE_LINES, PAGE_CHARS = 400, 48 * 1024  # the artifact's page
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Preview:
    digest: str
    what: str
    relative: str  # the file under FORGE_HOME (or where the artifact store is)
    head: str
    excerpt: str
    cut: bool  # the excerpt is not the whole artifact
    size: int  # bytes of the artifact read (at most READ_BYTES)


def _clean(data: bytes) -> str:
    s = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", _ANSI.sub("", s))


def preview(digest: str, what: str, relative: str, data: bytes, whole: bool = True
            ) -> Preview:
    """The preview of an artifact from its first bytes (`whole`: they are all of it)."""
    # In the function for start-up time: the pages' module imports this one, and every
    # forge command the pages' module.
    from ..ledger.secrets.redactor import redact_message

    lines = redact_message(_clean(data)).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    head = "\n".join(ln if len(ln) <= LINE_CHARS else ln[:LINE_CHARS - 1] + "…"
                     for ln in lines[:HEAD_LINES])
    excerpt = "\n".join(lines[:PAGE_LINES])
    cut = not whole or len(lines) > PAGE_LINES or len(excerpt) > PAGE_CHARS
    return Preview(digest, what, relative, head, excerpt[:PAGE_CHARS], cut, len(data))


def artifact_path(digest: str) -> str:
    return f"artifacts/{digest.removeprefix('sha256:')[:16]}"


def artifact_page(p: Preview, position: int) -> Page:
    page = Page(artifact_path(p.digest), "artifact", p.what, position=position,
                summary=f"{p.what}: {p.head[:200]}")
    page.meta = {"digest": p.digest, "what": p.what, "file": p.relative}
    page.add("p", text(strong("Digest:"), " ", code(p.digest)))
    page.add("p", text(strong("File:"), " ", code(p.relative)))
    page.add("p", "Secrets redacted; " + ("the first lines only: the whole artifact is the "
                                          "file above." if p.cut else "the whole artifact."))
    page.add("code", p.excerpt or "(empty)")
    return page
