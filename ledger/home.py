"""Where the workspace is, and what can be told of it before the ledger loads.

Standard library only: this is read for an answer that cannot wait for pydantic and the
store (`forge mcp`'s first answer, harness/mcp/front.py).

- `resolve_home(home)`: the one rule (an explicit path, then `$FORGE_HOME`, then
  `./.forge`); ledger/config.py uses it.
- `glance(home, task_id)`: the problem that keeps a session from starting, in one line with
  what to run, or None: no workspace there, a forge.toml that cannot be read or is not
  TOML, a SQLite ledger that is missing or cannot be read, a task with no events. What it
  cannot tell (forge.toml's schema, a PostgreSQL ledger, a damaged page deeper in the file)
  the real open finds afterwards; a None is no promise.
"""

from __future__ import annotations

import os
import sqlite3
import tomllib
from contextlib import closing
from pathlib import Path
from urllib.parse import unquote, urlparse

from .streams import task_stream

CONFIG_NAME = "forge.toml"
DEFAULT_LEDGER_URL = "sqlite:///ledger.sqlite"
EVENTS_TABLE = "stored_events"  # the eventsourcing recorder's table (ledger/store.py)


def resolve_home(home: str | Path | None = None) -> Path:
    if home is not None:
        return Path(home).expanduser().resolve()
    env = os.environ.get("FORGE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.cwd() / ".forge").resolve()


def no_workspace(root: Path) -> str:
    return f"no workspace at {root} ({CONFIG_NAME} missing): run `forge init`"


def unknown_task(task_id: str, root: Path) -> str:
    return (f"unknown task {task_id[:200]!r} in {root}: `forge task list` shows its tasks, "
            "`forge task new FILE.yaml` defines one")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def sqlite_file(root: Path, url: str) -> Path | None:
    """The SQLite file of a ledger URL (relative to the home, as ledger/config.py reads it);
    None for any other backend."""
    u = urlparse(url)
    if u.scheme != "sqlite":
        return None
    path = Path(unquote(u.path.lstrip("/")))
    if not path.is_absolute() and not url.startswith("sqlite:////"):
        path = root / path
    return path


def glance(home: str | Path | None, task_id: str | None = None) -> str | None:
    """The start-up problem (module contract)."""
    root = resolve_home(home)
    if root.exists() and not root.is_dir():
        return f"{root} is not a directory: point FORGE_HOME (or --home) at a workspace " \
               "(`forge init --home DIR` makes one)"
    config = root / CONFIG_NAME
    if not config.is_file():
        return no_workspace(root)
    try:
        data = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return f"{config}: {_one_line(e)} (fix it, or `forge init` a new home)"
    ledger = data.get("ledger")
    url = ledger.get("url") if isinstance(ledger, dict) else DEFAULT_LEDGER_URL
    db = sqlite_file(root, url) if isinstance(url, str) else None
    if db is None:
        return None  # PostgreSQL (or a URL the real open refuses in its own words)
    if not db.is_file():
        return f"ledger {db} is missing (the workspace was initialised: {CONFIG_NAME} " \
               "exists); restore it or run `forge check`"
    try:
        with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)) as c:
            found = c.execute(f"SELECT 1 FROM {EVENTS_TABLE} WHERE originator_id=? LIMIT 1",
                              [task_stream(task_id)]).fetchone() if task_id else True
    except sqlite3.Error as e:
        if "locked" in str(e) or "busy" in str(e):
            return None  # a writer holds it: the real open waits its own lock timeout
        return f"ledger {db} cannot be read: {_one_line(e)} (run `forge check`)"
    return None if found else unknown_task(task_id or "", root)
