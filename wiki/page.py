"""A wiki page as data, rendered two ways from the same blocks: markdown with typed
frontmatter and `[[path|label]]` wiki links (the journal), and HTML (the static site).

Blocks: ("h", text) | ("p", text) | ("list", [text]) | ("table", columns, rows) |
("code", text) | ("svg", svg). Text may hold wiki links `[[path|label]]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape
from typing import Any

import yaml

# `[[target|label]]`; inside markdown tables the pipe is escaped as `\|`.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
LINK = re.compile(r"\[\[([^\]|\\]+)(?:\\?\|([^\]]*))?\]\]")


def link(path: str, label: str | None = None) -> str:
    label = (label if label is not None else path.rsplit("/", 1)[-1]).replace("]", ")")
    return f"[[{path}|{label}]]"


def slug(text: Any) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")
    return s or "none"


@dataclass
class Page:
    path: str  # e.g. "tasks/tune-qwen-h200" (no extension)
    kind: str  # task | point | profile | model | decision | dimension | index | log
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
        out: set[str] = set()
        for b in self.blocks:
            for text in _texts(b):
                if "[[" in text:
                    out.update(m.group(1) for m in LINK.finditer(text))
        return out

    def text(self) -> str:
        """Plain text of the page (search index)."""
        parts = [self.title, self.summary]
        for b in self.blocks:
            if b[0] in ("svg", "code"):
                continue
            parts.extend(LINK.sub(lambda m: m.group(2) or m.group(1), t) for t in _texts(b))
        return " ".join(p for p in parts if p)


def _texts(b: tuple) -> list[str]:
    kind = b[0]
    if kind in ("h", "p", "code"):
        return [b[1]]
    if kind == "list":
        return list(b[1])
    if kind == "table":
        return [c for row in b[2] for c in row if isinstance(c, str)]
    return []


def _cell(v: Any) -> str:
    if type(v) is str:
        return v
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


# --- markdown ---------------------------------------------------------------------------


def to_markdown(page: Page) -> str:
    front = {"type": page.kind, "title": page.title, **page.meta,
             "ledger_position": page.position}
    dumped = yaml.dump(front, Dumper=_DUMPER, sort_keys=True, allow_unicode=True)
    out = ["---", dumped.rstrip(), "---",
           "", f"# {page.title}", ""]
    for b in page.blocks:
        kind = b[0]
        if kind == "h":
            out += [f"## {b[1]}", ""]
        elif kind == "p":
            out += [b[1], ""]
        elif kind == "list":
            out += [f"- {x}" for x in b[1]] + [""]
        elif kind == "table":
            cols, rows = b[1], b[2]
            out.append("| " + " | ".join(cols) + " |")
            out.append("|" + "---|" * len(cols))
            for r in rows:
                out.append("| " + " | ".join(_cell(c).replace("|", "\\|") for c in r) + " |")
            out.append("")
        elif kind == "code":
            out += ["```", b[1], "```", ""]
        elif kind == "svg":
            out += [b[1], ""]
    return "\n".join(out).rstrip() + "\n"


def parse_frontmatter(text: str) -> dict[str, Any]:
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---\n", 4)
    if end < 0:
        return {}
    try:
        data = yaml.safe_load(text[4:end])
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


def _html_text(text: str, prefix: str) -> str:
    if "[[" not in text:  # the common case: plain text or a number
        if text in ("pass", "fail", "inconclusive"):
            return f'<span class="{text}">{text}</span>'
        return escape(text)
    out, last = [], 0
    for m in LINK.finditer(text):
        out.append(escape(text[last:m.start()]))
        target, label = m.group(1), m.group(2) or m.group(1)
        out.append(f'<a href="{prefix}{escape(target)}.html">{escape(label)}</a>')
        last = m.end()
    out.append(escape(text[last:]))
    html = "".join(out)
    for verdict in ("pass", "fail", "inconclusive"):
        if html == verdict:
            return f'<span class="{verdict}">{verdict}</span>'
    return html


def to_html(page: Page, nav: list[tuple[str, str]]) -> str:
    depth = page.path.count("/")
    prefix = "../" * depth
    body = [f"<h1>{escape(page.title)}</h1>",
            f'<p class="meta">{escape(page.kind)} · ledger position {page.position}</p>']
    for b in page.blocks:
        kind = b[0]
        if kind == "h":
            body.append(f"<h2>{_html_text(b[1], prefix)}</h2>")
        elif kind == "p":
            body.append(f"<p>{_html_text(b[1], prefix)}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_html_text(x, prefix)}</li>" for x in b[1])
                        + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{escape(c)}</th>" for c in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_html_text(_cell(c), prefix)}</td>"
                                            for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif kind == "code":
            body.append(f"<pre>{escape(b[1])}</pre>")
        elif kind == "svg":
            body.append(f"<figure>{b[1]}</figure>")
    navhtml = " ".join(f'<a href="{prefix}{escape(p)}.html">{escape(label)}</a>'
                       for p, label in nav)
    search = (f'<form action="{prefix}search.html" method="get" style="display:inline">'
              f'<input name="q" placeholder="search" size="24"></form>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(page.title)} · infer-forge journal</title>"
            f"<style>{CSS}</style></head><body><nav>{navhtml} {search}</nav>"
            + "".join(body) + "</body></html>\n")
