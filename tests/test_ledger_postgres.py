"""The same store contract on PostgreSQL: a throwaway server (Debian's postgres binaries) on
127.0.0.1, selected by forge.toml's ledger URL only — no other code path differs."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.config import load_config
from infer_forge.ledger.errors import (
    ConflictError,
    CorruptEventError,
    LedgerBusyError,
    UnknownEventError,
)
from infer_forge.ledger.replay import replay_task
from infer_forge.ledger.state import fingerprint
from infer_forge.ledger.store import Append, Ledger

from .conftest import need, run_forge
from .test_ledger_store import WRITER, _run_together, _spawn, build_task, define, measurement


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _as_server_user(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def pg_server():
    bindir = _pg_bin()
    need(bindir is not None, "PostgreSQL server binaries (/usr/lib/postgresql/*/bin) not found")
    try:
        import psycopg
    except ImportError:
        psycopg = None
    need(psycopg is not None, "psycopg is not installed (pip install -e '.[postgres]')")
    if os.geteuid() == 0:
        need(shutil.which("runuser") is not None, "running as root without runuser")
    root = Path(tempfile.mkdtemp(prefix="forge-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                                    "-U", "forge", "--no-sync"]),
                   check=True, capture_output=True)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l",
                                    str(root / "log"), "-w", "-t", "60", "-o", opts, "start"]),
                   check=True, capture_output=True)
    try:
        yield port
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m",
                                        "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_home(pg_server, forge_home, request):
    """A workspace whose ledger is a fresh PostgreSQL database."""
    import psycopg

    db = "forge_" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    with psycopg.connect(f"host=127.0.0.1 port={pg_server} user=forge dbname=postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        conn.execute(f'CREATE DATABASE "{db}"')
    url = f"postgresql://forge@127.0.0.1:{pg_server}/{db}"
    res = run_forge("init", "--ledger-url", url, home=forge_home)
    assert res.returncode == 0, res.stderr
    return forge_home


def _sql(pg_home: Path, statement: str, params: tuple = ()) -> None:
    import psycopg

    with Ledger.open(pg_home) as ledger:
        env = ledger.config.persistence_env()
    with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"],
                         user=env["POSTGRES_USER"], dbname=env["POSTGRES_DBNAME"],
                         autocommit=True) as conn:
        conn.execute(statement, params)


def test_postgres_is_chosen_by_configuration_only(pg_home):
    with Ledger.open(pg_home) as ledger:
        assert ledger.config.backend == "postgres"
        assert type(ledger.recorder).__module__ == "eventsourcing.postgres"
        log = list(ledger.log())
        assert [r.type for r in log] == ["WorkspaceInitialized"]
        assert log[0].event.ledger_backend == "postgres"


def test_postgres_atomic_idempotent_conflicts_and_positions(pg_home):
    with Ledger.open(pg_home) as a, Ledger.open(pg_home) as b:
        res = a.save(Append("task:x", [define("x"), measurement(1, "x")]),
                     Append("task:y", [define("y")]), command_id="c1")
        assert res.appended == {"task:x": [1, 2], "task:y": [1, 1]}
        top = a.max_position()
        assert res.positions == [top - 3, top - 2, top - 1]  # then the command marker
        again = b.save(Append("task:x", [define("x")]), command_id="c1")
        assert again.duplicate and b.max_position() == top
        with pytest.raises(ConflictError) as exc:
            b.append("task:x", [measurement(2, "x")], expected_version=1)
        assert str(exc.value) == ("conflict on stream 'task:x': expected version 1, "
                                  "but it is at version 2")
        with pytest.raises(ConflictError):  # all or nothing across streams
            a.save(Append("task:y", [measurement(3, "y")]),
                   Append("task:x", [measurement(4, "x")], expected_version=0))
        assert a.version("task:y") == 1 and a.max_position() == top
        sl = a.stream_log("task:x")
        assert [r.version for r in sl] == [1, 2]
        assert [r.position for r in sl] == [r.position for r in a.log() if r.stream == "task:x"]


def test_postgres_replay_fingerprint_and_check(pg_home):
    with Ledger.open(pg_home) as ledger:
        build_task(ledger, "t1")
        positions = [r.position for r in ledger.stream_log("task:t1")]
        full = replay_task(ledger, "t1")
        mid = replay_task(ledger, "t1", until=positions[3])
    with Ledger.open(pg_home) as other:
        assert fingerprint(replay_task(other, "t1")) == fingerprint(full)
    assert full.status == "exited" and mid.version == 4
    check = run_forge("check", home=pg_home)
    assert check.returncode == 0 and check.stdout.strip().endswith("ok"), check.stdout
    out = run_forge("replay", "t1", "--until", str(positions[3]), "--json", home=pg_home)
    assert out.returncode == 0 and '"version": 4' in out.stdout


def test_postgres_processes_on_one_stream_lose_nothing(pg_home):
    with Ledger.open(pg_home) as ledger:
        ledger.append("task:hot", [define("hot")])
    procs = [_spawn("contend", str(pg_home), "task:hot", f"w{k}", "8") for k in range(4)]
    results = _run_together(procs)
    assert [r["ok"] for r in results] == [8] * 4
    with Ledger.open(pg_home) as ledger:
        reasons = sorted(r.event.reason for r in ledger.stream_log("task:hot")[1:])
        positions = [r[0] for r in ledger.rows()]
    assert reasons == sorted(f"w{k}:{i}" for k in range(4) for i in range(8))
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def test_postgres_kill9_during_appends(pg_home):
    acked: list[str] = []
    for kill_after in (2, 5, 1):
        proc = subprocess.Popen([sys.executable, str(WRITER), "batches", str(pg_home), "cmd",
                                 str(len(acked))], stdout=subprocess.PIPE, text=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if len(lines) >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                break
        lines += proc.stdout.read().splitlines()
        proc.wait()
        proc.stdout.close()
        acked += [ln.split()[1] for ln in lines if ln.startswith("ACK")]
    with Ledger.open(pg_home) as ledger:
        for cid in acked:
            assert ledger.command_done(cid)
        per_command: dict[str, int] = {}
        for r in ledger.log():
            if r.stream in ("task:crash", "task:side"):
                per_command[r.event.command_id] = per_command.get(r.event.command_id, 0) + 1
    assert set(acked) <= set(per_command) and set(per_command.values()) == {21}
    assert run_forge("check", home=pg_home).returncode == 0


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


@pytest.mark.parametrize(("topic", "state", "error"), [
    ("EngineExploded", b'{"_v": 1}', UnknownEventError),
    ("MeasurementRecorded", b'{"event_id": ', CorruptEventError),
])
def test_postgres_unknown_or_corrupt_event_is_loud(pg_home, topic, state, error):
    with Ledger.open(pg_home) as ledger:
        ledger.append("task:t1", [define()])
    _sql(pg_home, "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
                  "VALUES (%s, %s, %s, %s)", ("task:t1", 2, topic, state))
    with Ledger.open(pg_home) as ledger, pytest.raises(error, match="'task:t1' version 2"):
        replay_task(ledger, "t1")
    check = run_forge("check", home=pg_home)
    assert check.returncode == 1 and "version 2" in check.stdout
    assert E.EVENT_TYPES  # the registry is untouched by a bad row


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


def test_postgres_password_never_reaches_forge_toml_messages_or_ledger(pg_server, forge_home):
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={pg_server} user=forge dbname=postgres",
                         autocommit=True) as conn:
        conn.execute('DROP DATABASE IF EXISTS "forge_pw"')
        conn.execute('CREATE DATABASE "forge_pw"')
    quoted = quote(SECRET, safe="")
    url = f"postgresql://forge:{quoted}@127.0.0.1:{pg_server}/forge_pw"
    res = run_forge("init", "--ledger-url", url, home=forge_home)
    assert res.returncode == 0, res.stderr
    forms = (SECRET, quoted, "s3cret")
    assert not any(f in res.stdout + res.stderr for f in forms)
    toml = (forge_home / "forge.toml").read_text()
    assert not any(f in toml for f in forms)
    assert f'url = "postgresql://forge@127.0.0.1:{pg_server}/forge_pw"' in toml
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
    cfg.write_text(toml.replace("postgresql://forge@", f"postgresql://forge:{quoted}@"))
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
