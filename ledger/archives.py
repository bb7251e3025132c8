"""Compressed artifacts (gzip, zip, tar, and tar.gz), read inside for secrets: redacted when
stored (`ArtifactStore.put`), scanned by `forge secrets scan`.

Contract:
- `kind_of(head)`: "gzip", "zip" or "tar" from a file's first bytes (its magic), else None.
- `redact_archive(src, kind, redactor, out)`: writes to `out` the archive `src` with every
  member's text redacted as a stream (`secrets.stream.StreamRedactor`; a member that is not
  UTF-8 is copied as is, as `put` stores binary content; an archive inside is redacted in
  turn, up to `MAX_DEPTH` deep). Returns whether anything was redacted: when not, the caller
  stores the original bytes (the same digest as before). Names, modes and times of members
  are kept; gzip output is deterministic (mtime 0).
- `members(src, kind)`: (member path, chunks of its bytes) for every regular member, nested
  archives opened in turn; `src` a binary file object. Read in bounded memory.
- Bounds: at most `MAX_EXPANDED` bytes are decompressed from one artifact (all members,
  all depths) — a decompression bomb stops there with `ArchiveTooLarge`; a member of a zip
  or tar is held in a temporary file (spilled to disk past `_SPOOL`), never whole in memory.
  A damaged archive, an encrypted zip member or nesting past `MAX_DEPTH` is `ArchiveError`:
  what cannot be read cannot be redacted, so `put` refuses it (one line).
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from typing import IO

from .errors import LedgerError
from .secrets.redactor import Redactor
from .secrets.stream import StreamRedactor

MAX_EXPANDED = 1 << 30  # bytes decompressed from one artifact, all members together
MAX_DEPTH = 3  # archives inside archives
_READ = 1 << 20
_SPOOL = 8 << 20  # a member's bytes held in memory before its temporary file goes to disk


class ArchiveError(LedgerError):
    """A compressed artifact that cannot be read (damaged, encrypted, nested too deep)."""


class ArchiveTooLarge(ArchiveError):
    """More than MAX_EXPANDED bytes decompressed from one artifact."""


def kind_of(head: bytes) -> str | None:
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


class _Budget:
    """Bytes still allowed to be decompressed from one artifact."""

    def __init__(self, limit: int | None = None):
        self.limit = MAX_EXPANDED if limit is None else limit
        self.used = 0

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise ArchiveTooLarge(f"more than {self.limit} bytes decompressed "
                                  "(a decompression bomb, or too large to read)")


def _chunks(f: IO[bytes], budget: _Budget | None = None) -> Iterator[bytes]:
    while chunk := f.read(_READ):
        if budget is not None:
            budget.take(len(chunk))
        yield chunk


def _spool(chunks: Iterator[bytes]) -> IO[bytes]:
    tmp = tempfile.SpooledTemporaryFile(max_size=_SPOOL)  # noqa: SIM115 - returned open
    for c in chunks:
        tmp.write(c)
    tmp.seek(0)
    return tmp


def _gunzip(src: IO[bytes], budget: _Budget) -> Iterator[bytes]:
    """The decompressed bytes of a gzip stream (all its members), `_READ` at a time."""
    d = zlib.decompressobj(wbits=31)
    pending, started = b"", False
    try:
        while True:
            data = d.unconsumed_tail or pending or src.read(_READ)
            pending = b""
            if not data:
                break
            if not started and not data.strip(b"\0"):
                continue  # zero padding after the last member
            started = True
            out = d.decompress(data, _READ)
            budget.take(len(out))
            if out:
                yield out
            if d.eof:  # another gzip member may follow
                pending, started = d.unused_data, False
                d = zlib.decompressobj(wbits=31)
    except zlib.error as e:
        raise ArchiveError(f"gzip stream is damaged: {e}") from None
    if started:
        raise ArchiveError("gzip stream is truncated")


def _inner_kind(tmp: IO[bytes]) -> str | None:
    head = tmp.read(512)
    tmp.seek(0)
    return kind_of(head)


def members(src: IO[bytes], kind: str, *, budget: _Budget | None = None, depth: int = 0,
            prefix: str = "") -> Iterator[tuple[str, Iterator[bytes]]]:
    """(path, chunks) of every regular member of the archive `src` of `kind` (module doc)."""
    budget = budget or _Budget()
    if depth >= MAX_DEPTH:
        raise ArchiveError(f"{prefix or 'archive'}: archives nested more than {MAX_DEPTH} deep")
    for name, f in _open_members(src, kind, budget):
        path = f"{prefix}{name}"
        inner = _inner_kind(f)
        if inner is not None:
            yield from members(f, inner, budget=budget, depth=depth + 1,
                               prefix=path + "!" if name else prefix)  # a .gz: its tar
        else:
            yield path, _chunks(f)


def _open_members(src: IO[bytes], kind: str, budget: _Budget
                  ) -> Iterator[tuple[str, IO[bytes]]]:
    """(name, its bytes as a seekable file) of each regular member, budget charged."""
    if kind == "gzip":
        yield "", _spool(_gunzip(src, budget))
    elif kind == "zip":
        yield from ((name, f) for name, f, _ in _zip_members(src, budget) if f is not None)
    else:
        yield from ((info.name, f) for info, f in _tar_members(src, budget) if f is not None)


# --- redaction when storing ---------------------------------------------------------------


def _redact_member(f: IO[bytes], redactor: Redactor, out: IO[bytes], budget: _Budget,
                   depth: int, name: str) -> bool:
    """Write one member's bytes to `out`, redacted (text as a stream, an archive inside in
    turn); True when they changed."""
    inner = _inner_kind(f)
    if inner is not None:
        if depth + 1 >= MAX_DEPTH:
            raise ArchiveError(f"{name}: archives nested more than {MAX_DEPTH} deep")
        if _redact(f, inner, redactor, out, budget, depth + 1):
            return True
        f.seek(0)
        out.seek(0)
        out.truncate()
        shutil.copyfileobj(f, out)  # unchanged: the member's own bytes
        return False
    stream = StreamRedactor(redactor)
    before, after = hashlib.sha256(), hashlib.sha256()
    for chunk in _chunks(f):
        before.update(chunk)
        red = stream.feed(chunk)
        after.update(red)
        out.write(red)
    red = stream.finish()
    after.update(red)
    out.write(red)
    return before.digest() != after.digest()


def _redact(src: IO[bytes], kind: str, redactor: Redactor, out: IO[bytes], budget: _Budget,
            depth: int) -> bool:
    changed = False
    if kind == "gzip":
        for _, member in _open_members(src, "gzip", budget):
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as red:
                changed = _redact_member(member, redactor, red, budget, depth, "gzip")
                red.seek(0)
                with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
                    shutil.copyfileobj(red, gz)
        return changed
    if kind == "zip":
        with zipfile.ZipFile(out, "w") as zout:
            for name, zf, zinfo in _zip_members(src, budget):
                if zf is None:
                    zout.writestr(zinfo, b"")
                    continue
                with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as red:
                    changed |= _redact_member(zf, redactor, red, budget, depth, name)
                    red.seek(0)
                    with zout.open(_zip_info(zinfo), "w", force_zip64=True) as w:
                        shutil.copyfileobj(red, w)
        return changed
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tout:
        for tinfo, tf in _tar_members(src, budget):
            if tf is None:
                tout.addfile(tinfo)
                continue
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as red:
                changed |= _redact_member(tf, redactor, red, budget, depth, tinfo.name)
                tinfo.size = red.tell()
                red.seek(0)
                tout.addfile(tinfo, red)
    return changed


def _zip_info(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
    new.compress_type, new.external_attr = info.compress_type, info.external_attr
    return new


def _zip_members(src: IO[bytes], budget: _Budget
                 ) -> Iterator[tuple[str, IO[bytes] | None, zipfile.ZipInfo]]:
    try:
        with zipfile.ZipFile(src) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    yield info.filename, None, info
                    continue
                if info.flag_bits & 0x1:
                    raise ArchiveError(f"zip member {info.filename} is encrypted")
                with zf.open(info) as m:
                    yield info.filename, _spool(_chunks(m, budget)), info
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ArchiveError(f"zip archive is damaged: {e}") from None


def _tar_members(src: IO[bytes], budget: _Budget
                 ) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    try:
        with tarfile.open(fileobj=src, mode="r:") as tf:
            for info in tf:
                if not info.isreg():
                    yield info, None
                    continue
                m = tf.extractfile(info)
                assert m is not None
                yield info, _spool(_chunks(m, budget))
    except (tarfile.TarError, EOFError) as e:
        raise ArchiveError(f"tar archive is damaged: {e}") from None


def redact_archive(src: IO[bytes], kind: str, redactor: Redactor, out: IO[bytes], *,
                   limit: int | None = None) -> bool:
    """Write `src` (an archive of `kind`) to `out` with its members' secrets redacted;
    True when anything was (module doc). `limit`: bytes to decompress at most (default
    MAX_EXPANDED)."""
    return _redact(src, kind, redactor, out, _Budget(limit), 0)
