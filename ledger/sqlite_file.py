"""What can be told of a SQLite ledger file without the store, and which ones this process
holds open. Standard library only: the store (ledger/store.py) checks a file with it before
opening, and the read commands that read the file without the store
(`projections/fast_reads.py`) check it the same way first.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from .errors import DamagedLedgerError


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


SQLITE_MAGIC = b"SQLite format 3\x00"

# The SQLite ledger files this process holds open, by (device, inode), and how many times.
# POSIX locks belong to the process: closing ANY descriptor of a file drops every lock the
# process holds on it, SQLite's included. `check_sqlite_file` opens and closes the file to
# read its header; done while a connection of this process is open (a second workspace
# opened in a long-lived process: the MCP server, a graph run's workers, the tests' in-process
# CLI) it dropped that connection's shared lock, so another process closing the ledger took
# it for the last user, checkpointed and deleted the write-ahead log under the open
# connection: later writes went unseen ("file is not a database"). The header is read only
# when this process holds the file nowhere; SQLite itself shares its descriptors safely.
_OPEN_FILES: Counter[tuple[int, int]] = Counter()
_OPEN_LOCK = threading.Lock()


def _file_key(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def held_open(path: Path) -> bool:
    key = _file_key(path)
    with _OPEN_LOCK:
        return key is not None and _OPEN_FILES[key] > 0


def hold(path: Path) -> tuple[int, int] | None:
    key = _file_key(path)
    if key is not None:
        with _OPEN_LOCK:
            _OPEN_FILES[key] += 1
    return key


def release(key: tuple[int, int]) -> None:
    with _OPEN_LOCK:
        _OPEN_FILES[key] -= 1
        if _OPEN_FILES[key] <= 0:
            del _OPEN_FILES[key]


def check_sqlite_file(path: Path, *, missing_ok: bool = False) -> None:
    """What can be told of a SQLite ledger file without opening it: it exists and is not
    empty (unless `missing_ok`: a workspace being created), starts with SQLite's header and
    is as long as the header says (a leftover write-ahead log with content may still
    complete it: then SQLite's own recovery decides). Raises DamagedLedgerError naming the
    file and the fault."""
    where = str(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if missing_ok:
            return
        wal = path.with_name(path.name + "-wal")
        left = (f" (its write-ahead log {wal.name} is still there: restore the file beside it)"
                if wal.exists() else "")
        raise DamagedLedgerError(where, "the file is missing (the workspace was initialised: "
                                        f"forge.toml exists); restore it from a backup{left}"
                                 ) from None
    except OSError as e:
        raise DamagedLedgerError(where, f"cannot read it: {one_line(e)}") from None
    if not path.is_file():
        raise DamagedLedgerError(where, "it is not a regular file")
    if size == 0:
        if missing_ok:  # init after a crash between SQLite creating the file and writing it
            return
        raise DamagedLedgerError(where, "the file is empty (0 bytes)")
    try:
        with path.open("rb") as f:
            head = f.read(100)
    except OSError as e:
        raise DamagedLedgerError(where, f"cannot read it: {one_line(e)}") from None
    if not head.startswith(SQLITE_MAGIC[: len(head)]) or len(head) < len(SQLITE_MAGIC):
        raise DamagedLedgerError(where, "it is not an SQLite database (bad header)")
    if size < 100:
        raise DamagedLedgerError(where, f"truncated to {size} bytes (shorter than the "
                                        "100-byte SQLite header)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    # The header's page count is valid when its "version valid for" matches the change
    # counter (SQLite's rule); then the file holds at least that many pages.
    if pages and head[24:28] == head[92:96] and size < pages * page_size:
        wal = path.with_name(path.name + "-wal")
        if not (wal.exists() and wal.stat().st_size > 0):
            raise DamagedLedgerError(where, f"truncated: {size} bytes, but its header says "
                                            f"{pages} pages of {page_size} bytes "
                                            f"({pages * page_size} bytes)")
