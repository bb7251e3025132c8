"""Content-addressed artifact store for large outputs (logs, benchmark records, traces).

Layout: `<home>/artifacts/sha256/<2 hex>/<62 hex>`. Contracts:
- `put` redacts text before hashing, so the digest names exactly the bytes on disk; binary
  content (not valid UTF-8) is stored as is, except a compressed archive (gzip, zip, tar,
  tar.gz: `ledger/archives.py`), whose members are redacted inside it (decompressed as a
  stream, at most `archives.MAX_EXPANDED` bytes) and the archive rebuilt; an archive that
  cannot be read (damaged, encrypted, a decompression bomb) is refused with one line
  (`ArchiveError`): what cannot be redacted is not stored. `put_file` and `put_stream` do
  the same in bounded memory.
- Writes go to a temporary file, are fsynced, then renamed: a crash leaves either nothing or
  the whole artifact, never a partial one under its digest.
- `read(digest, offset, limit)` reads a page of an artifact (what an agent pages through).
- The same content is stored once (dedup); `get` re-hashes and raises
  `ArtifactIntegrityError` if the bytes no longer match their digest.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from . import archives
from .errors import ArtifactIntegrityError, LedgerError, NotFoundError
from .secrets.redactor import Redactor
from .secrets.stream import StreamRedactor

PREFIX = "sha256:"


class ArtifactTooLargeError(LedgerError):
    """A file over the size a caller allows to store (`put_file(limit=)`)."""


def _bounded(f: BinaryIO, path: str | Path, limit: int | None) -> Iterator[bytes]:
    read = 0
    while chunk := f.read(1 << 20):
        read += len(chunk)
        if limit is not None and read > limit:
            raise ArtifactTooLargeError(f"{path}: grew over the limit of {limit} bytes "
                                        "while it was read")
        yield chunk


class ArtifactStore:
    def __init__(self, root: Path,
                 redactor: Redactor | Callable[[], Redactor] | None = None):
        """`redactor`: the one text is redacted with, or a function that returns it when
        first needed (the ledger's, whose patterns compile at first use)."""
        self.root = Path(root)
        self._redactor = redactor

    @property
    def redactor(self) -> Redactor | None:
        if callable(self._redactor):
            self._redactor = self._redactor()
        return self._redactor

    def _path(self, digest: str) -> Path:
        if not digest.startswith(PREFIX) or len(digest) != len(PREFIX) + 64:
            raise NotFoundError(f"not an artifact digest: {digest!r}")
        h = digest[len(PREFIX):]
        return self.root / "sha256" / h[:2] / h[2:]

    def put(self, data: bytes | str, *, redactor: Redactor | None = None,
            verbatim: bool = False) -> str:
        """Store `data` (redacted if text) and return its digest `sha256:<hex>`. `redactor`
        replaces the store's own for this call (one that knows more secret values, e.g. a
        child process's: `Redactor.for_env`). `verbatim` stores the bytes as given: only for
        copies of a user's own working tree (a repo snapshot's diff and untracked files),
        which a restore must bring back byte for byte."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        redactor = None if verbatim else (redactor or self.redactor)
        if redactor is not None:
            kind = archives.kind_of(data[:512])
            if kind is not None:
                return self._put_archive(io.BytesIO(data), kind, redactor)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                clean = redactor.text(text)
                if clean is not text:
                    data = clean.encode("utf-8")
        digest = PREFIX + hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        if path.exists():
            return digest
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def put_file(self, path: str | Path, *, redactor: Redactor | None = None,
                 limit: int | None = None) -> str:
        """Store the file at `path` as `put` would, in bounded memory (read as a stream).
        `limit`: a file of more bytes (a 6 GB sparse file where a call could write) is
        refused before it is read (`ArtifactTooLargeError`, one line), and reading stops
        there should it grow meanwhile."""
        red = redactor or self.redactor
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if limit is not None and size > limit:
                raise ArtifactTooLargeError(f"{path}: {size} bytes, over the limit of {limit}")
            kind = archives.kind_of(f.read(512)) if red is not None else None
            f.seek(0)
            if kind is not None:
                assert red is not None
                return self._put_archive(f, kind, red)
            return self.put_stream(_bounded(f, path, limit), redactor=redactor)

    def _put_archive(self, src: BinaryIO, kind: str, redactor: Redactor) -> str:
        """Store a compressed archive with its members redacted (archives.redact_archive);
        its own bytes when nothing in it was a secret."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.root, prefix=".tmp-") as out:
            changed = archives.redact_archive(src, kind, redactor, out)
            keep = out if changed else src
            keep.seek(0)
            return self.put_stream(iter(lambda: keep.read(1 << 20), b""), redactor=None,
                                   _raw=True)

    def put_stream(self, chunks: Iterable[bytes], *, redactor: Redactor | None = None,
                   _raw: bool = False) -> str:
        """Store the concatenation of `chunks` in bounded memory and return its digest.

        The text is redacted as a stream (`secrets.stream.StreamRedactor`): a secret cut by a
        chunk boundary, or split over lines that come in two chunks, is redacted as `put`
        would redact it; a part that is not UTF-8 is stored as is. Same atomicity and dedup
        as `put`; an exception from `chunks` leaves nothing behind. A stream that starts as
        a compressed archive is redacted inside (`put`)."""
        red = None if _raw else (redactor or self.redactor)
        it = iter(chunks)
        first = next(it, b"")
        while red is not None and len(first) < 512:  # enough to know an archive's magic
            more = next(it, None)
            if more is None:
                break
            first += more
        if red is not None and archives.kind_of(first[:512]) is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root, prefix=".tmp-") as spool:
                spool.write(first)
                for chunk in it:
                    spool.write(chunk)
                spool.seek(0)
                return self._put_archive(spool, archives.kind_of(first[:512]) or "", red)
        chunks = itertools.chain([first], it)
        stream = StreamRedactor(red) if red is not None else None
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    out = stream.feed(chunk) if stream is not None else chunk
                    h.update(out)
                    f.write(out)
                if stream is not None:
                    out = stream.finish()
                    h.update(out)
                    f.write(out)
                f.flush()
                os.fsync(f.fileno())
            digest = PREFIX + h.hexdigest()
            path = self._path(digest)
            if path.exists():
                Path(tmp).unlink()
                return digest
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
            return digest
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, digest: str) -> bytes:
        path = self._path(digest)
        if not path.is_file():
            raise NotFoundError(f"artifact {digest} not found under {self.root}")
        data = path.read_bytes()
        actual = PREFIX + hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ArtifactIntegrityError(
                f"artifact {digest} is corrupt: its bytes hash to {actual}"
            )
        return data

    def read(self, digest: str, offset: int = 0, limit: int = 1 << 20) -> tuple[bytes, int]:
        """At most `limit` bytes of the artifact from byte `offset`, and its whole size, read
        without loading the rest (a page is not re-hashed: `get` and `verify` check the
        whole)."""
        path = self._path(digest)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, offset))
                return f.read(max(0, limit)), size
        except (FileNotFoundError, IsADirectoryError):
            raise NotFoundError(f"artifact {digest} not found under {self.root}") from None

    def text(self, digest: str) -> str:
        return self.get(digest).decode("utf-8", errors="replace")

    def exists(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def digests(self) -> Iterator[str]:
        base = self.root / "sha256"
        if not base.is_dir():
            return
        for sub in sorted(base.iterdir()):
            for f in sorted(sub.iterdir()):
                if not f.name.startswith(".tmp-"):
                    yield PREFIX + sub.name + f.name

    def verify(self) -> list[str]:
        """Problems found (one line each): artifacts whose bytes do not match their digest."""
        problems = []
        for d in self.digests():
            try:
                self.get(d)
            except ArtifactIntegrityError as e:
                problems.append(str(e))
        return problems
