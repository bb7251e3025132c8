"""What only PostgreSQL has: the backend chosen by forge.toml's URL, its lock timeout, the
password kept out of forge.toml, messages and the ledger, and a server that does not answer.
The store contract itself runs on both backends in tests/ledger/test_ledger_store.py (the server
and the fresh database per test come from tests/conftest.py)."""

from __future__ import annotations

import socket
import stat
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.config import load_config
from infer_forge.ledger.errors import LedgerBusyError
from infer_forge.ledger.store import Ledger

from tests.conftest import need, run_forge

from .test_ledger_store import define, measurement


def test_postgres_is_chosen_by_configuration_only(pg_home):
    with Ledger.open(pg_home) as ledger:
        assert ledger.config.backend == "postgres"
        assert type(ledger.recorder).__module__ == "eventsourcing.postgres"
        log = list(ledger.log())
        assert [r.type for r in log] == ["WorkspaceInitialized"]
        assert log[0].event.ledger_backend == "postgres"


@pytest.mark.slow  # the library retries a lock timeout 10 times before giving up (~12 s)
def test_postgres_lock_timeout_is_a_busy_error_while_reads_continue(pg_home):
    import psycopg

    cfg = pg_home / "forge.toml"
    cfg.write_text(cfg.read_text().replace("lock_timeout_s = 5", "lock_timeout_s = 1"))
    with Ledger.open(pg_home) as ledger:
        ledger.append("task:t1", [define()])
        env = ledger.config.persistence_env()
        with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"],
                             user=env["POSTGRES_USER"], dbname=env["POSTGRES_DBNAME"]) as conn:
            conn.execute("LOCK TABLE stored_events IN EXCLUSIVE MODE")  # held until rollback
            with pytest.raises(LedgerBusyError) as exc:
                ledger.append("task:t1", [measurement(1)], command_id="locked")
            assert "\n" not in str(exc.value) and "lock timeout 1s" in str(exc.value)
            assert ledger.version("task:t1") == 1 and len(list(ledger.log())) == 2
            conn.rollback()
        ledger.append("task:t1", [measurement(1)], command_id="locked")
        assert ledger.version("task:t1") == 2


# --- the password stays out of forge.toml, messages and the ledger; a server that
# does not answer fails after the configured connect timeout ---------------------------------

SECRET = "Pg-s3cret/w@odd:chars"


def _all_ledger_bytes(home: Path) -> bytes:
    import psycopg

    env = load_config(home).persistence_env()
    with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"],
                         user=env["POSTGRES_USER"], dbname=env["POSTGRES_DBNAME"]) as conn:
        rows = conn.execute("SELECT originator_id, topic, state FROM stored_events").fetchall()
    return b"".join(r[0].encode() + r[1].encode() + bytes(r[2]) for r in rows)


def test_postgres_password_never_reaches_forge_toml_messages_or_ledger(pg_url, forge_home):
    # The server trusts every local connection, so any password "works": what is tested is
    # where it goes.
    u = urlsplit(pg_url)
    where = f"{u.hostname}:{u.port}{u.path}"
    quoted = quote(SECRET, safe="")
    url = f"postgresql://{u.username}:{quoted}@{where}"
    res = run_forge("init", "--ledger-url", url, home=forge_home)
    assert res.returncode == 0, res.stderr
    forms = (SECRET, quoted, "s3cret")
    assert not any(f in res.stdout + res.stderr for f in forms)
    toml = (forge_home / "forge.toml").read_text()
    assert not any(f in toml for f in forms)
    assert f'url = "postgresql://{u.username}@{where}"' in toml
    creds = forge_home / "credentials.toml"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    config = load_config(forge_home)
    assert config.password() == SECRET  # what the driver gets
    assert config.persistence_env()["POSTGRES_PASSWORD"] == SECRET
    # The password is a configured secret: an event mentioning it is stored redacted.
    with Ledger.open(forge_home) as ledger:
        ledger.append("task:t1", [define(), E.MeasurementRecorded(
            task_id="t1", run_id="r1", source="test", metrics={"x": 1.0},
            error=f"psql failed: PGPASSWORD={SECRET} psql -h db")])
    stored = _all_ledger_bytes(forge_home)
    assert b"s3cret" not in stored and b"REDACTED" in stored
    for args in (("log",), ("check",), ("events", "export")):
        out = run_forge(*args, home=forge_home)
        assert out.returncode == 0, out.stderr
        assert "s3cret" not in out.stdout + out.stderr
    # A password written into forge.toml by hand is refused, and the message masks it.
    cfg = forge_home / "forge.toml"
    cfg.write_text(toml.replace(f"postgresql://{u.username}@",
                                f"postgresql://{u.username}:{quoted}@"))
    bad = run_forge("log", home=forge_home)
    assert bad.returncode == 1 and "holds a password" in bad.stderr
    assert not any(f in bad.stdout + bad.stderr for f in forms)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket goes: nothing listens


def test_unreachable_postgres_fails_after_the_configured_timeout(forge_home):
    """The library waits 30 s by default; forge.toml's connect_timeout_s (default 5) rules.
    Elapsed times are generous upper bounds (a busy machine), not a benchmark."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        psycopg = None
    need(psycopg is not None, "psycopg is not installed (pip install -e '.[postgres]')")
    port = _closed_port()
    url = f"postgresql://forge:{quote(SECRET, safe='')}@127.0.0.1:{port}/forge"
    t0 = time.monotonic()
    res = run_forge("init", "--ledger-url", url, home=forge_home)
    elapsed = time.monotonic() - t0
    assert res.returncode == 1 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "cannot open ledger postgresql://forge@127.0.0.1" in line and "s3cret" not in line
    assert elapsed < 5 + 10, elapsed
    # Nothing half-made is left: no forge.toml, no credentials; init can simply run again.
    assert not (forge_home / "forge.toml").exists()
    assert not (forge_home / "credentials.toml").exists()
    (forge_home / "forge.toml").write_text(
        f'[ledger]\nurl = "postgresql://forge@127.0.0.1:{port}/forge"\nconnect_timeout_s = 1\n')
    t0 = time.monotonic()
    res = run_forge("log", home=forge_home)
    elapsed = time.monotonic() - t0
    assert res.returncode == 1 and "1.00 sec" in res.stderr and "Traceback" not in res.stderr
    assert elapsed < 1 + 10, elapsed
