"""A wiki page as data, rendered two ways from the same blocks: markdown with typed
frontmatter and `[[path|label]]` wiki links (the journal), and HTML (the static site).

Blocks: ("h", text) | ("p", text) | ("list", [text]) | ("table", columns, rows) |
("code", str) | ("svg", svg).

Links are data, never text. A text is a plain `str` (anything a user or an agent typed:
reasons, goals, candidate values, titles; it is never read as markup), a `Link` (made only by
forge's page generators, with `link()`), or a `Text` mixing the two (`text(...)`). So user text
cannot form a link, whatever it holds: the markdown escapes `[`, `]`, `\\`, `<` in it and the
HTML escapes it. The HTML renderer also emits an `<a href>` only for a link to a page of the
site (a relative page path built of page-name characters, and one of the built pages when
the build passes them); any other link renders as its label.

Page names: `page_name(value)` is the file name of the page of an id or name. A valid id
(ledger.ids: lowercase, starts and ends with a letter or digit) is its own page name; anything
else becomes `<slug>~<sha256 prefix>` (no id contains `~`). So two different values never share
a page, on a case-insensitive file system too, and every name is short enough for any file
system.

SVG blocks come from forge's own drawings (plot.py, graphs.py), which escape every text they
draw with `esc()`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from html import escape
from typing import Any

import yaml

from ..ledger.ids import is_id

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# `[[target|label]]` in the markdown journal (for lint); inside markdown tables the pipe is
# escaped as `\|`. A target holds no `[`, so `\[[[t|l]]` (an escaped bracket before a link)
# finds the link.
LINK = re.compile(r"\[\[([^\]|\\\[]+)(?:\\?\|([^\]]*))?\]\]")
# A page path: segments of page-name characters, each starting with a letter, digit or `~`
# (so never `.` or `..`), no scheme, no leading `/`.
PAGE_PATH = re.compile(r"[a-z0-9~][a-z0-9._~-]*(?:/[a-z0-9~][a-z0-9._~-]*)*")
MAX_ENCODED = 48  # characters of readable slug kept in an encoded page name


# --- text: plain strings and links --------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """A link to a page of the wiki, made by a page generator (never parsed from text)."""

    path: str
    label: str

    def __format__(self, spec: str) -> str:
        raise TypeError("a Link is not a string: combine it with text(...), not an f-string")


class Text(tuple):
    """A run of plain strings and Links."""

    def __format__(self, spec: str) -> str:
        raise TypeError("a Text is not a string: combine it with text(...), not an f-string")


def link(path: str, label: Any = None) -> Link:
    return Link(path, str(label) if label is not None else path.rsplit("/", 1)[-1])


def text(*parts: Any) -> Text:
    """Plain strings and Links in order (nested Texts flattened, None as nothing, other values
    as their str)."""
    out: list[str | Link] = []
    for p in parts:
        if p is None:
            continue
        if isinstance(p, Text):
            out.extend(p)
        elif isinstance(p, Link | str):
            out.append(p)
        else:
            out.append(str(p))
    return Text(out)


def join(sep: str, items: Iterable[Any]) -> Text:
    parts: list[Any] = []
    for i, x in enumerate(items):
        if i:
            parts.append(sep)
        parts.append(x)
    return text(*parts)


def _segments(v: Any) -> list[str | Link]:
    if isinstance(v, Text):
        return list(v)
    if isinstance(v, Link):
        return [v]
    return [_cell(v)]


def plain(v: Any) -> str:
    """Text as a reader sees it: links by their labels."""
    return "".join(s.label if isinstance(s, Link) else s for s in _segments(v))


def slug(text_: Any) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text_)).strip("-.")
    return s or "none"


def page_name(value: Any) -> str:
    """The page (file) name of an id or a name: injective, filesystem-safe, bounded."""
    s = str(value)
    if is_id(s):
        return s
    core = re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:MAX_ENCODED].strip("-")
    h = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{core}~{h}"


def is_page_path(path: Any) -> bool:
    return isinstance(path, str) and PAGE_PATH.fullmatch(path) is not None


@dataclass
class Page:
    path: str  # e.g. "tasks/tune-qwen-h200" (no extension)
    kind: str  # task | point | profile | model | decision | dimension | index | log | graph
    title: str
    meta: dict[str, Any] = field(default_factory=dict)  # typed frontmatter
    blocks: list[tuple] = field(default_factory=list)
    position: int = 0  # the ledger position this page reflects
    summary: str = ""  # for search and embeddings
    facets: dict[str, Any] = field(default_factory=dict)
    embed: str = ""  # the text embedded for related pages (shared with retrieve's corpus)

    def add(self, *block: Any) -> None:
        self.blocks.append(tuple(block))

    def links(self) -> set[str]:
        return {s.path for b in self.blocks for t in _texts(b) for s in _segments(t)
                if isinstance(s, Link)}

    def text(self) -> str:
        """Plain text of the page (search index)."""
        parts = [self.title, self.summary]
        for b in self.blocks:
            parts.extend(plain(t) for t in _texts(b))
        return " ".join(p for p in parts if p)


def _texts(b: tuple) -> list[Any]:
    kind = b[0]
    if kind in ("h", "p"):
        return [b[1]]
    if kind == "list":
        return list(b[1])
    if kind == "table":
        return [c for row in b[2] for c in row]
    return []


def _cell(v: Any) -> str:
    if type(v) is str:
        return v
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.0f}"
    if isinstance(v, Text | Link):
        return plain(v)
    return str(v)


def sort_key(v: Any) -> tuple:
    """Orders values of mixed or missing types (None first, then numbers, then strings):
    rows from the index may hold NULL where others hold text."""
    if v is None:
        return (0, 0.0, "")
    if isinstance(v, bool | int | float):
        f = float(v)
        return (1, f if f == f else float("inf"), "")
    if isinstance(v, str):
        return (2, 0.0, v)
    if isinstance(v, tuple):
        return (3, 0.0, "", tuple(sort_key(x) for x in v))
    return (4, 0.0, repr(v))


# --- markdown ---------------------------------------------------------------------------

_MD_ESCAPES = {"\\": "\\\\", "[": "\\[", "]": "\\]"}
_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")  # what could open an HTML tag or an autolink


def md_escape(s: str, table: bool = False) -> str:
    """Plain text for the markdown journal: one line, and nothing in it can form a wiki link,
    a markdown link, an autolink or an HTML tag (CommonMark backslash escapes; a `<` before
    a space or a digit stays as it is)."""
    s = " ".join(s.splitlines())
    s = _MD_TAG.sub("\\\\<", "".join(_MD_ESCAPES.get(c, c) for c in s))
    return s.replace("|", "\\|") if table else s


def _md_label(label: str, table: bool) -> str:
    """A link's label (it may hold a title someone typed): one line, no bracket, no tag."""
    label = " ".join(label.splitlines()).replace("]", ")").replace("[", "(")
    label = _MD_TAG.sub("\\\\<", label)
    return label.replace("|", "\\|") if table else label


def _md(v: Any, table: bool = False) -> str:
    out = []
    for s in _segments(v):
        if isinstance(s, Link):
            if is_page_path(s.path):
                sep = "\\|" if table else "|"
                out.append(f"[[{s.path}{sep}{_md_label(s.label, table)}]]")
            else:
                out.append(md_escape(s.label, table))
        else:
            out.append(md_escape(s, table))
    return "".join(out)


def _fence(code: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def _svg(svg: str) -> str:
    """Forge's drawings escape their texts; brackets become references here too, so that
    nothing in a drawing reads as a wiki link in the markdown."""
    return " ".join(svg.splitlines()).replace("[", "&#91;").replace("]", "&#93;")


def to_markdown(page: Page) -> str:
    front = {"type": page.kind, "title": page.title, **page.meta,
             "ledger_position": page.position}
    dumped = yaml.dump(front, Dumper=_DUMPER, sort_keys=True, allow_unicode=True)
    out = ["---", dumped.rstrip(), "---",
           "", f"# {md_escape(page.title)}", ""]
    for b in page.blocks:
        kind = b[0]
        if kind == "h":
            out += [f"## {_md(b[1])}", ""]
        elif kind == "p":
            out += [_md(b[1]), ""]
        elif kind == "list":
            out += [f"- {_md(x)}" for x in b[1]] + [""]
        elif kind == "table":
            cols, rows = b[1], b[2]
            out.append("| " + " | ".join(md_escape(str(c), True) for c in cols) + " |")
            out.append("|" + "---|" * len(cols))
            for r in rows:
                out.append("| " + " | ".join(_md(c, True) for c in r) + " |")
            out.append("")
        elif kind == "code":
            fence = _fence(b[1])
            out += [fence, b[1], fence, ""]
        elif kind == "svg":
            out += [_svg(b[1]), ""]
    return "\n".join(out).rstrip() + "\n"


def parse_frontmatter(text_: str) -> dict[str, Any]:
    if not text_.startswith("---\n"):
        return {}
    end = text_.find("\n---\n", 4)
    if end < 0:
        return {}
    try:
        data = yaml.safe_load(text_[4:end])
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


# --- html -------------------------------------------------------------------------------

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;
color:#222}nav a{margin-right:1em}table{border-collapse:collapse;margin:.5em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}code,pre{background:#f6f6f6}pre{padding:.5em;overflow:auto}
.meta{color:#666;font-size:12px}.kind{color:#888;font-size:12px;margin-left:.5em}
.pass{color:#080}.fail{color:#b00}.inconclusive{color:#a60}"""
VERDICTS = ("pass", "fail", "inconclusive")


def esc(v: Any) -> str:
    """Text for HTML and SVG, in element content and in quoted attributes alike."""
    return escape(str(v), quote=True).replace("[", "&#91;").replace("]", "&#93;")


def linkable(path: str, known: set[str] | frozenset[str] | None) -> bool:
    """May the site link to `path`? A relative page path, and a built page when known."""
    return is_page_path(path) and (known is None or path in known)


def _html_text(v: Any, prefix: str, known: set[str] | None) -> str:
    if type(v) is str and v in VERDICTS:
        return f'<span class="{v}">{v}</span>'
    out = []
    for s in _segments(v):
        if isinstance(s, Link):
            if linkable(s.path, known):
                out.append(f'<a href="{prefix}{s.path}.html">{esc(s.label)}</a>')
            else:
                out.append(esc(s.label))
        else:
            out.append(esc(s))
    return "".join(out)


def to_html(page: Page, nav: list[tuple[str, str]], known: set[str] | None = None) -> str:
    """The page as HTML. `known`: the paths of the built pages (links elsewhere are text)."""
    depth = page.path.count("/")
    prefix = "../" * depth
    body = [f"<h1>{esc(page.title)}</h1>",
            f'<p class="meta">{esc(page.kind)} · ledger position {esc(page.position)}</p>']
    for b in page.blocks:
        kind = b[0]
        if kind == "h":
            body.append(f"<h2>{_html_text(b[1], prefix, known)}</h2>")
        elif kind == "p":
            body.append(f"<p>{_html_text(b[1], prefix, known)}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_html_text(x, prefix, known)}</li>"
                                         for x in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{esc(c)}</th>" for c in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_html_text(c, prefix, known)}</td>"
                                            for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif kind == "code":
            body.append(f"<pre>{esc(b[1])}</pre>")
        elif kind == "svg":
            body.append(f"<figure>{_svg(b[1])}</figure>")
    navhtml = " ".join(f'<a href="{prefix}{p}.html">{esc(label)}</a>'
                       for p, label in nav if is_page_path(p))
    search = (f'<form action="{prefix}search.html" method="get" style="display:inline">'
              f'<input name="q" placeholder="search" size="24"></form>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(page.title)} · infer-forge journal</title>"
            f"<style>{CSS}</style></head><body><nav>{navhtml} {search}</nav>"
            + "".join(body) + "</body></html>\n")
