"""(One concept past 500 lines: the page model and its two renderings share the escaping and
link rules, which are safest kept side by side in one module.)

A wiki page as data, rendered two ways from the same blocks: markdown with typed
frontmatter and `[[path|label]]` wiki links (the journal), and HTML (the static site): the
same markdown, with `[label](page.html)` links, rendered by markdown-it-py.

Blocks: ("h", text) | ("p", text) | ("list", [text]) | ("table", columns, rows) |
("code", str) | ("svg", svg) | ("details", summary, [block]) (blocks shown on demand: a
`<details>` element on the site, a bold line and the blocks in the journal).

Links and markup are data, never text. A text is a plain `str` (anything a user or an agent
typed: reasons, goals, candidate values, titles; it is never read as markup), a `Link` (made
only by forge's page generators, with `link()`), a `Strong` or `Code` (`strong()`, `code()`:
forge's own emphasis, its content plain text), or a `Text` mixing them (`text(...)`). So user
text cannot form a link, a tag or any markup, whatever it holds: `md_escape` backslash-escapes
everything in it that CommonMark could read as markup, so it shows as typed, in the journal
and on the site. The site's renderer (`MD`) allows no raw HTML, images, autolinks or
reference definitions, escapes every text it writes, and emits an `<a href>` only for a link
to a page of the site (a relative page path built of page-name characters, and one of the
built pages when the build passes them); any other link renders as its label.

Page names: `page_name(value)` is the file name of the page of an id or name. A valid id
(ledger.ids: lowercase, starts and ends with a letter or digit) is its own page name; anything
else becomes `<slug>~<sha256 prefix>` (no id contains `~`). So two different values never share
a page, on a case-insensitive file system too, and every name is short enough for any file
system.

SVG blocks come from forge's own drawings (plot.py, graphs.py), which escape every text they
draw.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

import yaml

from ..ledger.ids import is_id
from .numbers import number

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

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


@dataclass(frozen=True)
class Strong:
    """Text shown strong (`**…**` in markdown), made by a page generator: `strong(...)`."""

    text: str

    def __format__(self, spec: str) -> str:
        raise TypeError("a Strong is not a string: combine it with text(...), not an f-string")


@dataclass(frozen=True)
class Code:
    """Text shown as code (a backtick span in markdown), made by a page generator."""

    text: str

    def __format__(self, spec: str) -> str:
        raise TypeError("a Code is not a string: combine it with text(...), not an f-string")


MARKUP = (Link, Strong, Code)  # segments of a Text that are not plain strings


class Text(tuple):
    """A run of plain strings, Links and markup (Strong, Code)."""

    def __format__(self, spec: str) -> str:
        raise TypeError("a Text is not a string: combine it with text(...), not an f-string")

    def __repr__(self) -> str:  # not a tuple's: a build's record of pages tells them apart
        return f"Text{tuple.__repr__(self)}"


def link(path: str, label: Any = None) -> Link:
    return Link(path, str(label) if label is not None else path.rsplit("/", 1)[-1])


def strong(v: Any) -> Strong:
    return Strong(" ".join(str(v).split()))


def code(v: Any) -> Code:
    return Code(" ".join(str(v).splitlines()))


def text(*parts: Any) -> Text:
    """Plain strings, Links and markup in order (nested Texts flattened, None as nothing,
    other values as their str)."""
    out: list[Any] = []
    for p in parts:
        if p is None:
            continue
        if isinstance(p, Text):
            out.extend(p)
        elif isinstance(p, MARKUP) or isinstance(p, str):
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


def _segments(v: Any) -> list[Any]:
    if isinstance(v, Text):
        return list(v)
    if isinstance(v, MARKUP):
        return [v]
    return [_cell(v)]


def _plain(s: Any) -> str:
    return s.label if isinstance(s, Link) else s.text if isinstance(s, Strong | Code) else s


def plain(v: Any) -> str:
    """Text as a reader sees it: links by their labels, markup by its text."""
    return "".join(_plain(s) for s in _segments(v))


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

    def text(self, limit: int | None = None) -> str:
        """Plain text of the page (search index); `limit`: its first `limit` characters,
        made of the blocks they need only."""
        parts = [x for x in (self.title, self.summary) if x]
        size = sum(len(x) + 1 for x in parts)
        for b in self.blocks:
            if limit is not None and size > limit:
                break
            for t in _texts(b):
                x = plain(t)
                if x:
                    parts.append(x)
                    size += len(x) + 1
        out = " ".join(parts)
        return out if limit is None else out[:limit]


def _texts(b: tuple) -> list[Any]:
    kind = b[0]
    if kind in ("h", "p"):
        return [b[1]]
    if kind == "details":
        return [b[1], *(t for inner in b[2] for t in _texts(inner))]
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
        return number(v)  # by magnitude, never in e-notation (numbers.py)
    if isinstance(v, Text | Link | Strong | Code):
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

# What could start markup in plain text: `\` `` ` `` `*` `[` `]` `~` `#` anywhere, `_` where
# it could delimit emphasis (not between two letters or digits), `<` where it could open a tag
# or an autolink, `&` where it could start a character reference.
_MD_SPECIAL = re.compile(r"[\\`*\[\]~#]|(?<![^\W_])_|_(?![^\W_])|<(?=[A-Za-z/!?])"
                         r"|&(?=[A-Za-z0-9#])")
_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")  # what could open an HTML tag or an autolink
_MD_BLOCK = frozenset("-+=>")  # at the start of a block: a list, a rule or heading, a quote
_MD_ORDERED = re.compile(r"\d{1,9}(?=[.)])")  # at the start of a block: an ordered list


def md_escape(s: str, table: bool = False, start: bool = False) -> str:
    """Plain text for markdown, one line, that any CommonMark renderer shows as typed (the
    site's markdown-it, a viewer of the journal): nothing in it forms a wiki link, a link, an
    autolink, an HTML tag, a character reference, emphasis or code (backslash escapes); at the
    `start` of a block nothing opens a block (list, quote, heading, rule, code); in a `table`
    nothing ends the cell."""
    s = _MD_SPECIAL.sub(r"\\\g<0>", " ".join(s.splitlines()))
    if start:
        s = s.lstrip()
        if s[:1] in _MD_BLOCK:
            s = "\\" + s
        elif m := _MD_ORDERED.match(s):
            s = f"{m.group()}\\{s[m.end():]}"
    return s.replace("|", "\\|") if table else s


def _md_label(label: str, table: bool) -> str:
    """A wiki link's label (it may hold a title someone typed): one line, no bracket, no
    tag."""
    label = " ".join(label.splitlines()).replace("]", ")").replace("[", "(")
    label = _MD_TAG.sub("\\\\<", label)
    return label.replace("|", "\\|") if table else label


def _backticks(s: str) -> int:
    """The longest run of backticks in `s`."""
    return max((len(m) for m in re.findall(r"`+", s)), default=0)


def _code_span(s: str, table: bool) -> str:
    if not s.strip():
        return md_escape(s, table)
    fence = "`" * (_backticks(s) + 1)
    if s[0] == "`" or s[-1] == "`" or (s[0] == " " and s[-1] == " "):
        s = f" {s} "  # a renderer strips one space each side
    return fence + (s.replace("|", "\\|") if table else s) + fence


LinkMd = Callable[[Link, bool, bool], str]  # (link, in a table, at the start of a block)


def _wiki_link(s: Link, table: bool, start: bool) -> str:
    """The journal's link: `[[path|label]]` to a page path, else the label as text."""
    if is_page_path(s.path):
        sep = "\\|" if table else "|"
        return f"[[{s.path}{sep}{_md_label(s.label, table)}]]"
    return md_escape(s.label, table, start)


def _md(v: Any, link_md: LinkMd, table: bool = False, start: bool = False) -> str:
    out = []
    for s in _segments(v):
        if isinstance(s, Link):
            part = link_md(s, table, start)
        elif isinstance(s, Strong):
            part = f"**{md_escape(s.text, table)}**" if s.text.strip() else ""
        elif isinstance(s, Code):
            part = _code_span(s.text, table)
        else:
            part = md_escape(s, table, start)
        out.append(part)
        start = start and not part.strip()
    return "".join(out)


def _fence(code_: str) -> str:
    return "`" * max(3, _backticks(code_) + 1)


def _svg(svg: str) -> str:
    """Forge's drawings escape their texts; brackets become references here too, so that
    nothing in a drawing reads as a wiki link in the markdown."""
    return " ".join(svg.splitlines()).replace("[", "&#91;").replace("]", "&#93;")


def _block_md(b: tuple, link_md: LinkMd) -> list[str]:
    """The markdown lines of one block (not an SVG block), a blank line after them."""
    kind = b[0]
    if kind == "h":
        return [f"## {_md(b[1], link_md, start=True)}", ""]
    if kind == "p":
        return [_md(b[1], link_md, start=True), ""]
    if kind == "list":
        return [f"- {_md(x, link_md, start=True)}" for x in b[1]] + [""]
    if kind == "table":
        cols, rows = b[1], b[2]
        return (["| " + " | ".join(md_escape(str(c), True) for c in cols) + " |",
                 "|" + "---|" * len(cols)]
                + ["| " + " | ".join(_md(c, link_md, True) for c in r) + " |" for r in rows]
                + [""])
    if kind == "code":
        fence = _fence(b[1])
        return [fence, b[1], fence, ""]
    if kind == "details":
        out = [f"**{md_escape(plain(b[1]))}**", ""]
        for inner in b[2]:
            out += _block_md(inner, link_md) if inner[0] != "svg" else [_svg(inner[1]), ""]
        return out
    return []


def to_markdown(page: Page) -> str:
    front = {"type": page.kind, "title": page.title, **page.meta,
             "ledger_position": page.position}
    dumped = yaml.dump(front, Dumper=_DUMPER, sort_keys=True, allow_unicode=True)
    out = ["---", dumped.rstrip(), "---",
           "", f"# {md_escape(page.title, start=True)}", ""]
    for b in page.blocks:
        out += [_svg(b[1]), ""] if b[0] == "svg" else _block_md(b, _wiki_link)
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

# The site's one stylesheet (the search page's too): system fonts, a readable measure, a colour
# per verdict, dark mode by the reader's setting, tables that scroll inside their own box and
# drawings at the page's width, so no page is wider than a 390 px screen.
CSS = """:root{--bg:#fff;--fg:#1d2127;--muted:#5c6673;--line:#e1e5ea;--soft:#f4f6f8;
--code:#eef1f4;--accent:#2453d6;--ok:#237a35;--bad:#c02626;--warn:#a85b00;--plain:#5c6673;
color-scheme:light dark}
@media (prefers-color-scheme:dark){:root{--bg:#14171b;--fg:#e4e7eb;--muted:#9aa4b1;
--line:#2b3139;--soft:#1b1f25;--code:#222830;--accent:#8eb1ff;--ok:#5fd37a;--bad:#ff8a8a;
--warn:#ffbf69;--plain:#9aa4b1}}
*{box-sizing:border-box}html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);overflow-wrap:break-word;
font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",sans-serif}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
header.site{background:var(--soft);border-bottom:1px solid var(--line)}
header nav{max-width:1180px;margin:0 auto;padding:.55em 1.2em;display:flex;flex-wrap:wrap;
align-items:center;gap:.25em 1.1em}
header nav a{color:var(--fg)}header nav a.brand{font-weight:650;margin-right:.4em}
header nav form{margin:0 0 0 auto}
input,button{font:inherit;color:var(--fg);background:var(--bg);border:1px solid var(--line);
border-radius:6px;padding:.3em .6em;max-width:100%}
main{max-width:1180px;margin:0 auto;padding:.6em 1.2em 3em}
h1{font-size:1.65em;line-height:1.25;margin:.7em 0 .25em;letter-spacing:-.01em}
h2{font-size:1.15em;margin:2em 0 .6em;padding-bottom:.25em;border-bottom:1px solid var(--line)}
p,ul{margin:.5em 0}li{margin:.2em 0}
.meta{color:var(--muted);font-size:13px;margin:0 0 1.4em}
.badge{display:inline-block;padding:0 .6em;border:1px solid currentColor;border-radius:999px;
font-size:12px;font-weight:600;line-height:1.6;margin-right:.5em;color:var(--plain)}
.scroll{overflow-x:auto;max-width:100%;margin:.6em 0}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}tbody tr:hover td{background:var(--soft)}
code,pre{font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
background:var(--code);border-radius:4px}
code{padding:.05em .3em;overflow-wrap:anywhere}pre{padding:.7em 1em;overflow:auto}
pre code{padding:0;background:none}
figure{margin:1em 0;padding:.4em;background:#fff;border:1px solid var(--line);
border-radius:8px}figure svg{display:block;width:100%;height:auto}
details{margin:.6em 0}summary{cursor:pointer;color:var(--muted)}
#results{padding-left:1.2em}#results li{margin:.7em 0}
.kind{color:var(--muted);font-size:12px;margin-left:.5em}.snip{color:var(--muted);font-size:13px}
.pass,.accepted,.delivered{color:var(--ok);font-weight:600}
.fail,.rejected,.failed{color:var(--bad);font-weight:600}
.inconclusive,.deferred{color:var(--warn);font-weight:600}
.stopped,.baseline{color:var(--plain)}
@media (max-width:600px){body{font-size:14px}main{padding:.4em .8em 2em}
header nav{padding:.5em .8em}header nav form{margin:0;flex-basis:100%}
header nav input{width:100%}h1{font-size:1.35em}th,td{padding:4px 7px}
figure{overflow-x:auto}figure svg{min-width:560px}}"""
# A table cell (or paragraph) that is one of these words is shown in the verdict's colour.
VERDICTS = ("pass", "fail", "inconclusive", "accepted", "rejected", "delivered", "failed",
            "deferred", "stopped", "baseline")
# The href of a page of the site, relative to a page: `../` steps, then a page path.
SITE_HREF = re.compile(r"(?:\.\./)*" + PAGE_PATH.pattern + r"\.html")


def esc(v: Any) -> str:
    """Text for HTML and SVG, in element content and in quoted attributes alike."""
    return escape(str(v), quote=True).replace("[", "&#91;").replace("]", "&#93;")


def linkable(path: str, known: set[str] | frozenset[str] | None) -> bool:
    """May the site link to `path`? A relative page path, and a built page when known."""
    return is_page_path(path) and (known is None or path in known)


def _render_text(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
    t = tokens[idx].content
    if len(tokens) == 1 and t in VERDICTS:  # a cell (or paragraph) that is a verdict
        return f'<span class="{t}">{t}</span>'
    return esc(t)


def _render_code_inline(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
    return f"<code>{esc(tokens[idx].content)}</code>"


def _render_code_block(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
    return f"<pre><code>{esc(tokens[idx].content)}</code></pre>\n"


def _render_link_open(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
    """A link to a built page of the site (`env`: this page's `prefix` and the `known`
    pages, or None for any page path); any other link renders as its label alone."""
    href = str(tokens[idx].attrGet("href") or "")
    prefix = env["prefix"]
    rest = href[len(prefix):] if href.startswith(prefix) else ""
    if not (rest.endswith(".html") and linkable(rest[:-5], env["known"])):
        env["dropped"] = True
        return ""
    return f'<a href="{esc(href)}">'


def _render_link_close(self: Any, tokens: list, idx: int, options: Any, env: dict) -> str:
    return "" if env.pop("dropped", False) else "</a>"


# Where an inline rule of the site's renderer can start (newline, backslash escape, code span,
# emphasis, link, entity; and `]`, `<`, `!`, `~` for good measure): a run of inline text
# without any of these is parsed into one text token.
_INLINE_MARKUP = re.compile(r"[\n\\`*_\[\]&<!~]")
INLINE_MEMO = 50_000  # inline texts whose tokens the renderer keeps (cell texts repeat a lot)


@functools.cache
def _markdown_it() -> MarkdownIt:
    """CommonMark with tables; no raw HTML, images, autolinks or reference definitions; a
    link only to a page of the site (`SITE_HREF`, then `_render_link_open`); every text
    escaped with `esc`. Built on first use: importing the wiki (every forge command) stays
    fast.

    Off as well, because forge's markdown never holds them (`md_escape`, one line per block):
    indented code, block quotes, thematic breaks, setext headings. And the inline text of a
    heading, paragraph, list item or table cell in which no inline rule can start
    (`_INLINE_MARKUP`) becomes its one text token without the inline parser, exactly the
    token the parser makes (tested): most table cells are plain numbers and names, and the
    parser's cost is per run of text, not per character. Other inline texts are parsed once
    and their tokens kept (`INLINE_MEMO` of them; each use gets copies): links, headers and
    candidates repeat on many pages."""
    from markdown_it import MarkdownIt
    from markdown_it.rules_core import StateCore
    from markdown_it.token import Token

    class SiteMarkdown(MarkdownIt):
        def validateLink(self, url: str) -> bool:
            return SITE_HREF.fullmatch(url) is not None

    parsed: dict[str, list[Token]] = {}  # inline text -> its tokens, as the parser made them

    def inline(state: StateCore) -> None:  # markdown-it's core rule `inline`, shortcuts first
        for token in state.tokens:
            if token.type != "inline":
                continue
            content = token.content
            if content and _INLINE_MARKUP.search(content) is None:
                plain = Token("text", "", 0)
                plain.content = content
                token.children = [plain]
                continue
            got = parsed.get(content)
            if got is None:
                got = state.md.inline.parse(content, state.md, {}, [])
                if len(parsed) >= INLINE_MEMO:
                    parsed.clear()
                parsed[content] = got
            # copies: later rules (text_join) change the tokens they are given
            token.children = [copy.deepcopy(t) if t.children else copy.copy(t) for t in got]

    md = SiteMarkdown("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable("table")
    md.disable(["image", "autolink", "html_inline", "html_block", "reference",
                "code", "blockquote", "hr", "lheading"])
    md.core.ruler.at("inline", inline)
    for name, rule in (("text", _render_text), ("code_inline", _render_code_inline),
                       ("code_block", _render_code_block), ("fence", _render_code_block),
                       ("link_open", _render_link_open), ("link_close", _render_link_close)):
        md.add_render_rule(name, rule)
    return md


def __getattr__(name: str) -> Any:
    if name == "MD":  # the site's renderer, `page.MD`, built on first use
        return _markdown_it()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _site_link(prefix: str, known: set[str] | frozenset[str] | None) -> LinkMd:
    def link_md(s: Link, table: bool, start: bool) -> str:
        if linkable(s.path, known):
            return f"[{md_escape(s.label, table)}]({prefix}{s.path}.html)"
        return md_escape(s.label, table, start)

    return link_md


def nav_html(nav: list[tuple[str, str]], prefix: str) -> str:
    """The site's header: its name, the navigation and the search box (every page, the
    search page too)."""
    links = "".join(f'<a href="{prefix}{p}.html">{esc(label)}</a>'
                    for p, label in nav if is_page_path(p) and p != "index")
    return (f'<header class="site"><nav><a class="brand" href="{prefix}index.html">'
            f"infer-forge journal</a>{links}"
            f'<form action="{prefix}search.html" method="get">'
            f'<input name="q" placeholder="search the journal" size="22"></form></nav></header>')


def shell(title: str, body: str, nav: list[tuple[str, str]], prefix: str,
          script: str = "") -> str:
    """A whole page of the site: head (the one stylesheet), header, `body` in <main>, and
    forge's own `script` (the search page's) last."""
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)} · infer-forge journal</title>"
            f"<style>{CSS}</style></head><body>{nav_html(nav, prefix)}<main>{body}</main>"
            f"{script}</body></html>\n")


def _badges(page: Page) -> str:
    """The page's kind and, for a decision or a task, its verdict or state."""
    state = (page.meta.get("kind") if page.kind == "decision"
             else page.meta.get("exit_state") or page.meta.get("status")
             if page.kind == "task" else None)
    out = f'<span class="badge">{esc(page.kind)}</span>'
    if isinstance(state, str) and state:
        cls = f"badge {state}" if state in VERDICTS else "badge"
        out += f'<span class="{cls}">{esc(state)}</span>'
    return out


def _block_html(b: tuple, link_md: LinkMd, env: dict[str, Any]) -> str:
    if b[0] == "svg":
        return f"<figure>{_svg(b[1])}</figure>"
    if b[0] == "details":
        inner = "".join(_block_html(x, link_md, env) for x in b[2])
        return f"<details><summary>{esc(plain(b[1]))}</summary>{inner}</details>"
    html = _markdown_it().render("\n".join(_block_md(b, link_md)), env)
    if b[0] == "table":  # a wide table scrolls in its own box, never the page
        html = html.replace("<table>", '<div class="scroll"><table>', 1)
        html = html.replace("</table>", "</table></div>", 1)
    return html


def to_html(page: Page, nav: list[tuple[str, str]], known: set[str] | None = None) -> str:
    """The page as HTML: each block's markdown rendered by markdown-it (`MD`); forge's own
    drawings as they are. `known`: the paths of the built pages (links elsewhere are text)."""
    depth = page.path.count("/")
    prefix = "../" * depth
    link_md = _site_link(prefix, known)
    env: dict[str, Any] = {"prefix": prefix, "known": known}
    body = [f"<h1>{esc(page.title)}</h1>",
            f'<p class="meta">{_badges(page)}ledger position {esc(page.position)}</p>']
    body += [_block_html(b, link_md, env) for b in page.blocks]
    return shell(page.title, "".join(body), nav, prefix)
