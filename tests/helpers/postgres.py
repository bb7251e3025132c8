"""A throwaway PostgreSQL server for the tests: Debian's binaries (/usr/lib/postgresql/*/bin),
127.0.0.1 on a free port, trust authentication for user `forge`, fsync off, its data in a
directory of its own. As root the server runs as the `postgres` user (initdb and postgres
refuse root).

Two users, one implementation:
- `.ci/run` starts one server for the whole test run and exports its URL as
  `FORGE_TEST_POSTGRES` (`postgresql://forge@127.0.0.1:PORT/postgres`):
      python3 tests/helpers/postgres.py start DIR   # prints the URL
      python3 tests/helpers/postgres.py stop DIR    # stops it and removes DIR
- tests/conftest.py's `pg_server` starts one here when that variable is not set.

Standard library only: `.ci/run` runs it with the system Python, before the venv exists.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ENV = "FORGE_TEST_POSTGRES"


def bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def missing() -> str | None:
    """Why a server cannot be started here, or None."""
    if bindir() is None:
        return "PostgreSQL server binaries (/usr/lib/postgresql/*/bin) not found"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser"
    return None


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(root: Path) -> str:
    """Initialise and start a server with its data, socket and log under `root` (an empty
    directory this process may write); returns its URL (database `postgres`). Raises
    RuntimeError, with the server's log, when it does not start."""
    bins = bindir()
    if bins is None or missing():
        raise RuntimeError(missing() or "no PostgreSQL binaries")
    root = Path(root)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data = root / "data"
    run = subprocess.run(_as_server_user([str(bins / "initdb"), "-D", str(data), "-A", "trust",
                                          "-U", "forge", "--no-sync"]),
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"initdb failed: {run.stderr.strip()}")
    port = _free_port()
    # Durability is not what the tests test: fsync and friends off; room for the
    # connection pools of many writer processes at once.
    opts = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
    run = subprocess.run(_as_server_user([str(bins / "pg_ctl"), "-D", str(data), "-l",
                                          str(root / "log"), "-w", "-t", "60", "-o", opts,
                                          "start"]), capture_output=True, text=True)
    if run.returncode != 0:
        log = (root / "log").read_text(errors="replace")[-2000:] if (root / "log").exists() \
            else ""
        raise RuntimeError(f"pg_ctl start failed: {run.stderr.strip()} {log}")
    return f"postgresql://forge@127.0.0.1:{port}/postgres"


def stop(root: Path) -> None:
    """Stop the server under `root` (if one runs) and remove `root`."""
    root = Path(root)
    bins = bindir()
    if bins is not None and (root / "data" / "postmaster.pid").exists():
        subprocess.run(_as_server_user([str(bins / "pg_ctl"), "-D", str(root / "data"), "-m",
                                        "immediate", "stop"]), capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: postgres.py start|stop DIR", file=sys.stderr)
        return 2
    cmd, root = argv
    if cmd == "stop":
        stop(Path(root))
        return 0
    try:
        print(start(Path(root)))
    except (RuntimeError, OSError) as e:
        print(f"postgres.py: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
