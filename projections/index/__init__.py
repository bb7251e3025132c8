"""The multi-dimensional index: a catch-up projection of the ledger's global log into DuckDB.

- `schema`: the tables and views, the deployment-point dimensions, the tracking row.
- `dims`: dimensions and column values read from event payloads.
- `projector`: each notification → pending rows of the tables (and `skipped` for an
  event the ledger cannot decode).
- `catchup`: batches → Arrow → DuckDB, each batch and its tracking position in one
  transaction (exactly once).
- `session`: opening the index (file lock, catch-up, rebuild on a schema change) for the
  commands, and the locked-down read-only session `forge sql` queries run in.

The names below are the package's public API (the CLI, the wiki, tests and benchmarks).
"""

from .catchup import DEFAULT_BATCH, CatchUpProgress, CatchUpResult, catch_up
from .schema import (
    DIM_NAMES,
    DIMS,
    INDEX_SCHEMA_VERSION,
    SCHEMA_KEY,
    TABLES,
    fingerprint,
    tracked_position,
)
from .session import (
    LOCKDOWN,
    IndexSession,
    connect,
    index_path,
    locked_connection,
    open_index,
    rebuild,
    status,
    update,
)

__all__ = ["DEFAULT_BATCH", "DIMS", "DIM_NAMES", "INDEX_SCHEMA_VERSION", "LOCKDOWN", "SCHEMA_KEY",
           "TABLES", "CatchUpProgress", "CatchUpResult", "IndexSession", "catch_up", "connect",
           "fingerprint", "index_path", "locked_connection", "open_index", "rebuild", "status",
           "tracked_position", "update"]
