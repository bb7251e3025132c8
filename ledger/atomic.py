"""Replacing a file atomically: the one writer behind the files forge rewrites in place
(forge.toml and credentials, the build cache, the journal's pages and caches, embeddings).
The artifact store keeps its own: it names a file after the digest of what it wrote, so it
writes before it knows the name (`artifacts.put_stream`).

A reader sees the old bytes or the new, never a part; a writer that fails or is killed
leaves the old file as it was and, unless killed outright, no temporary file behind. The
temporary file is a new name of its own in the target's directory (so `os.replace` is a
rename within one file system, and two writers never share one), created with `mode`
under the process's umask, as `open` would create the file itself.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def replacing(path: Path, *, mode: int = 0o666, fsync: bool = False) -> Iterator[BinaryIO]:
    """A new file, opened for writing in binary, that takes `path`'s place when the block
    ends without an exception (and is removed when it raises). `fsync`: its bytes reach the
    disk before the rename, so the file survives a crash of the machine, not only of forge.
    The directory must exist."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o666,
                 fsync: bool = False) -> None:
    """Put `data` (text as UTF-8) in `path` in one step (`replacing`)."""
    with replacing(path, mode=mode, fsync=fsync) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
