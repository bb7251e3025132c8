"""The static site's text-search index, sharded so that a browser loads only what a query
needs (`search.html` reads it; `search.json`, every entry in one file, stays for tools).

Each shard is a script, `forgeSearch("<name>", <JSON>);` (the search page defines
`forgeSearch`): a page opened from `file://` may load scripts where fetch() is refused, so
search works on the built files as it does under `forge wiki serve`. Layout under the site's
`search/` folder (`<name>` is the path without `.js`):
- `meta.js`: {"v": 2, "docs": n, "per": DOCS_PER_SHARD, "shards": [names]};
- `t/<name>.js`, one per token prefix: {token: [code, ...]}, where a code is
  `2 * doc + (1 if the token is in the doc's title)`; the prefix is the token's first two
  characters (code points), the name their UTF-8 bytes in hex (any character, a safe name);
- `d/<k>.js`: docs k·per … (k+1)·per−1 as [url, title, kind, snippet], or null where a
  page was removed.

A doc keeps its number from build to build (read back from the doc shards; new pages take
the next numbers, removed pages leave a hole until holes outnumber the docs), so a build after
a few events rewrites only the doc shards of the pages that changed and the token shards whose
tokens gained or lost a page.

Tokens: runs of letters and digits (`[^\\W_]+`, lowercased), the same as the page's
`/[^\\p{L}\\p{N}]+/u` split. A query term of two or more characters matches every token it
begins (one shard read per term); a one-character term matches that token only.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SEARCH_DIR = "search"
DOCS_PER_SHARD = 500
SNIPPET = 200  # characters of a doc's text kept for its result line (the page shows 200)
_TOKEN = re.compile(r"[^\W_]+")


def tokens(s: str) -> list[str]:
    return _TOKEN.findall(s.lower())


def snippet(s: str) -> str:
    """A doc's text for its result line: at most SNIPPET characters, ending at a word, "…"
    where it was cut."""
    if len(s) <= SNIPPET:
        return s
    cut = s[:SNIPPET - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > SNIPPET // 2 else cut).rstrip() + "…"


def shard_name(token: str) -> str:
    return token[:2].encode("utf-8").hex()


def _dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def script(name: str, obj: object) -> str:
    """A shard as the script the search page loads. JSON is JavaScript; the two line
    separators JSON allows in strings are escaped for older engines."""
    data = _dumps(obj).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f"forgeSearch({json.dumps(name)},{data});\n"


def unscript(text: str) -> Any:
    """The data of a shard's script (`script`'s inverse)."""
    head, _, rest = text.partition(",")
    if not head.startswith("forgeSearch(") or not rest.endswith(");\n"):
        raise ValueError("not a search shard")
    return json.loads(rest[:-3])


def kept_numbers(root: Path) -> dict[str, int]:
    """url -> doc number, as the doc shards under `root` hold them ({} when unreadable)."""
    try:
        meta = unscript((root / "meta.js").read_text(encoding="utf-8"))
        per = meta["per"]
        out: dict[str, int] = {}
        for f in (root / "d").glob("*.js"):
            for j, e in enumerate(unscript(f.read_text(encoding="utf-8"))):
                if e:
                    out[e[0]] = int(f.stem) * per + j
        return out
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return {}  # a damaged index is only an index: number afresh


def numbering(entries: Sequence[dict[str, str]], kept: dict[str, int]) -> list[int]:
    """Each entry's doc number: the kept one, else the next free one after the highest."""
    urls = {e["u"] for e in entries}
    kept = {u: n for u, n in kept.items() if u in urls}
    if len(set(kept.values())) != len(kept) or (kept and max(kept.values()) >= 2 * len(entries)
                                                + DOCS_PER_SHARD):
        kept = {}  # holes outnumber the docs (or a damaged record): number afresh
    nxt = max(kept.values(), default=-1) + 1
    out = []
    for e in entries:
        if e["u"] not in kept:
            kept[e["u"]], nxt = nxt, nxt + 1
        out.append(kept[e["u"]])
    return out


def search_files(entries: Sequence[dict[str, str]],
                 kept: dict[str, int] | None = None) -> dict[str, str]:
    """Relative path (under `search/`) -> file text, for entries {u, t, k, s}; doc numbers
    kept from `kept` (url -> number) where it has them."""
    nums = numbering(entries, kept or {})
    best: dict[str, dict[int, int]] = defaultdict(dict)
    for i, e in zip(nums, entries, strict=True):
        for tok in tokens(e["s"]):
            best[tok].setdefault(i, 0)
        for tok in tokens(e["t"]):
            best[tok][i] = 1
    shards: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for tok, marks in best.items():
        shards[shard_name(tok)][tok] = [2 * d + t for d, t in sorted(marks.items())]
    out = {f"t/{name}.js": script(f"t/{name}", s) for name, s in shards.items()}
    slots = max(nums, default=-1) + 1
    docs: list[list[str] | None] = [None] * slots
    for i, e in zip(nums, entries, strict=True):
        docs[i] = [e["u"], e["t"], e["k"], snippet(e["s"])]
    for k in range(0, slots, DOCS_PER_SHARD):
        out[f"d/{k // DOCS_PER_SHARD}.js"] = script(f"d/{k // DOCS_PER_SHARD}",
                                                    docs[k:k + DOCS_PER_SHARD])
    out["meta.js"] = script("meta", {"v": 2, "docs": slots, "per": DOCS_PER_SHARD,
                                     "shards": sorted(shards)})
    return out


def write_search_index(site_dir: Path, entries: Sequence[dict[str, str]], write) -> int:
    """Write the shards that changed (`write(path, text) -> bool`), remove those no longer
    made; returns how many files were written."""
    root = site_dir / SEARCH_DIR
    files = search_files(entries, kept_numbers(root))
    written = sum(bool(write(root / rel, text)) for rel, text in files.items())
    keep = {root / rel for rel in files}
    for f in root.rglob("*.js*") if root.is_dir() else ():  # .json: an older build's shards
        if f not in keep and f.suffix in (".js", ".json"):
            f.unlink()
    return written
