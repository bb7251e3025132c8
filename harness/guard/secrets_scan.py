"""`forge secrets scan`: look for secrets in everything a workspace has stored.

Contract: `scan_workspace(ws, progress=)` reads, never writes, and returns a `ScanReport`:
one `Hit(source, where, kind)` per finding — where it is and what kind of secret it looks
like, never the secret — and how much was read (lines, bytes, seconds, per source). The
places, all under FORGE_HOME:
- the ledger: every stored event's payload (its JSON decoded: a secret-named field is found
  by name, as the redactor finds it before a write), and each row's stream name;
- the artifact store: every artifact, line by line (redacted as a stream, so a file of any
  size is read in bounded memory); a compressed artifact (gzip, zip, tar, tar.gz:
  `ledger/archives.py`) member by member inside it, at most `archives.MAX_EXPANDED` bytes
  decompressed: past that (a decompression bomb) the finding is "too large to scan", and an
  archive that cannot be read (damaged, encrypted) is a finding too: neither was looked in;
- the index (`index.duckdb`, opened read-only under its lock): every text column of every
  table (VARCHAR, JSON and lists of them, as text);
- the journal (`wiki/`) and the site (`site/`): every text file (markdown, HTML, JSON, SVG);
  binary files (a NUL in their first 8 KiB: embedding caches) are counted and skipped.

What a secret is: `ledger.secrets.redactor.Redactor`'s rules with the workspace's configured secret
values (`ws.ledger.redactor`): what the redactor would have replaced had it seen the text.
Text it already replaced (`[REDACTED:…]`) is not a finding. The ledger and the artifacts
should never hold one (everything is redacted before it is written); a finding means a
write went around the redactor, a rule was added since, or a secret is configured that was
not when the text was written.
"""

from __future__ import annotations

import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...ledger import archives
from ...ledger.secrets.locate import locate, shown
from ...ledger.secrets.redactor import Redactor
from ...ledger.secrets.stream import StreamRedactor
from ...ledger.workspace import Workspace
from ...ledger.yamlio import dotted_path
from ...projections.errors import ProjectionError
from ..errors import HarnessError

Progress = Callable[[str], None]
_TAG = re.compile(r"\[REDACTED:([^\]]+)\]")
_READ = 1 << 20  # bytes read at a time from a file
_BATCH = 5000  # index values screened together
_EVERY_S = 2.0  # seconds between progress lines within a source


@dataclass(frozen=True)
class Hit:
    source: str  # ledger | artifacts | index | wiki | site
    where: str
    kind: str

    def line(self) -> str:
        return f"{self.where}: {self.kind}"


@dataclass
class ScanReport:
    hits: list[Hit] = field(default_factory=list)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def lines(self) -> int:
        return sum(s.get("lines", 0) for s in self.sources.values())

    @property
    def bytes(self) -> int:
        return sum(s.get("bytes", 0) for s in self.sources.values())

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"hits": [{"source": h.source, "where": h.where, "kind": h.kind}
                         for h in self.hits],
                "sources": self.sources, "lines": self.lines, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "lines_per_s": round(self.lines_per_s)}


def new_kinds(before: str, after: str) -> list[str]:
    """The kinds of the `[REDACTED:<kind>]` tags that redacting `before` into `after` added."""
    added = Counter(_TAG.findall(after)) - Counter(_TAG.findall(before))
    return sorted(added) or ["secret"]


class _Ticker:
    def __init__(self, progress: Progress | None, source: str):
        self.progress, self.source, self.last = progress, source, time.monotonic()

    def tick(self, what: str) -> None:
        now = time.monotonic()
        if self.progress is not None and now - self.last >= _EVERY_S:
            self.last = now
            self.progress(f"{self.source}: {what}")


def scan_workspace(ws: Workspace, progress: Progress | None = None) -> ScanReport:
    red = ws.ledger.redactor
    home = Path(ws.home)
    report = ScanReport()
    t0 = time.perf_counter()
    scans: list[tuple[str, Callable[[dict[str, int], _Ticker], Iterator[Hit]]]] = [
        ("ledger", lambda c, t: _scan_ledger(ws, red, c, t)),
        ("artifacts", lambda c, t: _scan_artifacts(ws, red, home, c, t)),
        ("index", lambda c, t: _scan_index(ws, red, c, t)),
        ("wiki", lambda c, t: _scan_tree(home / "wiki", home, "wiki", red, c, t)),
        ("site", lambda c, t: _scan_tree(home / "site", home, "site", red, c, t))]
    for source, scan in scans:
        if progress is not None:
            progress(f"scanning {source}")
        counts: dict[str, int] = {"items": 0, "lines": 0, "bytes": 0}
        t = time.perf_counter()
        for hit in scan(counts, _Ticker(progress, source)):
            report.hits.append(hit)
        counts["ms"] = round((time.perf_counter() - t) * 1000)
        report.sources[source] = counts
    report.seconds = time.perf_counter() - t0
    return report


# --- the ledger ---------------------------------------------------------------------------


def _field(loc: tuple[Any, ...], red: Redactor) -> str:
    """A field path that never shows a secret (`locate.shown`)."""
    return dotted_path(shown(red, loc))


def _scan_ledger(ws: Workspace, red: Redactor, counts: dict[str, int], ticker: _Ticker
                 ) -> Iterator[Hit]:
    head = ws.ledger.max_position()
    for pos, stream, version, topic, state in ws.ledger.rows():
        counts["items"] += 1
        counts["lines"] += 1
        counts["bytes"] += len(state)
        ticker.tick(f"{pos}/{head} events")
        at = f"ledger position {pos}"
        if red.text(stream) is not stream:
            yield Hit("ledger", f"{at}: stream name", ", ".join(new_kinds(stream,
                                                                          red.text(stream))))
        data = bytes(state)
        try:
            if red.json_bytes(data) is data:
                continue
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:  # not what the store writes: read it as text
            text = data.decode("utf-8", "replace")
            clean = red.text(text)
            if clean is not text:
                yield Hit("ledger", f"{at} ({topic})", ", ".join(new_kinds(text, clean)))
            continue
        where = f"{at} ({stream} v{version} {topic})"
        found = locate(red, doc)
        for loc, kind in found:
            yield Hit("ledger", f"{where} {_field(loc, red)}", kind)
        if not found:
            yield Hit("ledger", where, "secret")


# --- files: artifacts, journal, site ------------------------------------------------------


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            yield chunk


def scan_lines(chunks: Iterable[bytes], red: Redactor, counts: dict[str, int]
               ) -> Iterator[tuple[int, list[str]]]:
    """(line number, kinds) for each line of the text in `chunks` that holds a secret. The
    text is redacted as a stream (`StreamRedactor`, which keeps every line where it is), and
    each redacted line is compared with the line it came from."""
    stream = StreamRedactor(red)
    lines_in: deque[bytes] = deque()
    partial_in = partial_out = b""
    number = 0

    def compare(out: bytes, last: bool) -> Iterator[tuple[int, list[str]]]:
        nonlocal partial_out, number
        parts = (partial_out + out).split(b"\n")
        partial_out = b"" if last else parts.pop()
        for line in parts:
            original = lines_in.popleft() if lines_in else b""
            number += 1
            if line != original:
                yield number, new_kinds(original.decode("utf-8", "replace"),
                                        line.decode("utf-8", "replace"))

    for chunk in chunks:
        counts["bytes"] += len(chunk)
        counts["lines"] += chunk.count(b"\n")
        parts = (partial_in + chunk).split(b"\n")
        partial_in = parts.pop()
        lines_in.extend(parts)
        yield from compare(stream.feed(chunk), last=False)
    if partial_in:
        lines_in.append(partial_in)
        counts["lines"] += 1
    yield from compare(stream.finish(), last=True)


def _scan_artifacts(ws: Workspace, red: Redactor, home: Path, counts: dict[str, int],
                    ticker: _Ticker) -> Iterator[Hit]:
    root = Path(ws.artifacts.root)
    for digest in ws.artifacts.digests():
        h = digest.removeprefix("sha256:")
        path = root / "sha256" / h[:2] / h[2:]
        counts["items"] += 1
        ticker.tick(f"{counts['items']} artifacts, {counts['lines']} lines")
        rel = _relative(path, home)
        with open(path, "rb") as f:
            kind = archives.kind_of(f.read(512))
        if kind is not None:
            yield from _scan_archive(path, kind, f"{rel} ({digest[:19]}…)", red, counts)
            continue
        for number, kinds in scan_lines(_file_chunks(path), red, counts):
            yield Hit("artifacts", f"{rel} ({digest[:19]}…) line {number}", ", ".join(kinds))


def _scan_archive(path: Path, kind: str, where: str, red: Redactor, counts: dict[str, int]
                  ) -> Iterator[Hit]:
    """Every member of a compressed artifact, bounded (module doc)."""
    counts.setdefault("archives", 0)
    counts["archives"] += 1
    try:
        with open(path, "rb") as f:
            for name, chunks in archives.members(f, kind):
                member = f"{where} {kind} member {name}" if name else f"{where} ({kind})"
                for number, kinds in scan_lines(chunks, red, counts):
                    yield Hit("artifacts", f"{member} line {number}", ", ".join(kinds))
    except archives.ArchiveTooLarge as e:
        yield Hit("artifacts", f"{where} ({kind})", f"too large to scan: {e}")
    except archives.ArchiveError as e:
        yield Hit("artifacts", f"{where} ({kind})", f"unreadable archive: {e}")


def _relative(path: Path, home: Path) -> str:
    try:
        return str(path.relative_to(home))
    except ValueError:
        return str(path)


def _is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def _scan_tree(root: Path, home: Path, source: str, red: Redactor, counts: dict[str, int],
               ticker: _Ticker) -> Iterator[Hit]:
    if not root.is_dir():
        return
    counts["skipped_binary"] = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if _is_binary(path):
            counts["skipped_binary"] += 1
            continue
        counts["items"] += 1
        ticker.tick(f"{counts['items']} files, {counts['lines']} lines")
        rel = _relative(path, home)
        for number, kinds in scan_lines(_file_chunks(path), red, counts):
            yield Hit(source, f"{rel} line {number}", ", ".join(kinds))


# --- the index ----------------------------------------------------------------------------

_TEXT_TYPES = ("VARCHAR", "JSON")


def _scan_index(ws: Workspace, red: Redactor, counts: dict[str, int], ticker: _Ticker
                ) -> Iterator[Hit]:
    # In the function for start-up time: the index session (~40 ms).
    from ...projections.index.session import read_index

    try:
        with read_index(ws) as con:
            if con is None:
                return
            columns = con.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position").fetchall()
            tables = {t for (t,) in con.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_type = 'BASE TABLE' AND table_schema = 'main'").fetchall()}
            text_columns: dict[str, list[str]] = {}
            for table, column, dtype in columns:
                if table in tables and str(dtype).startswith(_TEXT_TYPES):
                    text_columns.setdefault(table, []).append(column)
            for table, cols in text_columns.items():
                counts["items"] += len(cols)
                ticker.tick(f"{table}, {counts['lines']} values")
                yield from _scan_table(con, red, table, cols, counts)
    except ProjectionError as e:  # locked by another command, or not an index
        raise HarnessError(f"{e}; scan again when it is done") from None


def _scan_table(con: Any, red: Redactor, table: str, columns: list[str],
                counts: dict[str, int]) -> Iterator[Hit]:
    """Every text column of one table, in one query (a query per column costs more than
    reading a small table)."""
    cast = ", ".join(f'CAST("{c}" AS VARCHAR)' for c in columns)
    cur = con.execute(f'SELECT rowid, {cast} FROM "{table}"')
    while rows := cur.fetchmany(_BATCH):
        values = [v for row in rows for v in row[1:] if v is not None]
        counts["lines"] += len(values)
        blob = "\n".join(values)
        counts["bytes"] += len(blob)
        # One screen for the batch: most batches hold nothing a rule could match.
        if not red.might_contain_secret(blob):
            continue
        for row in rows:
            for column, v in zip(columns, row[1:], strict=True):
                if v is None:
                    continue
                clean = red.text(v)
                if clean is not v:
                    yield Hit("index", f"index {table}.{column} row {row[0]}",
                              ", ".join(new_kinds(v, clean)))
