"""Shared fixtures. FORGE_HOME always points into the test's tmp_path (autouse)."""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
FORGE = [sys.executable, "-m", "infer_forge.cli"]
# FORGE_TEST_CLI=process: every run_forge through the installed entry point, as a subprocess
# (how the suite ran before the in-process runner; bench/suite.py times the two).
CLI_IN_PROCESS = os.environ.get("FORGE_TEST_CLI", "") != "process"


def pytest_sessionstart(session) -> None:
    """Give children the default SIGINT (below), and byte-compile the package once, as
    installing it would. Where PYTHONDONTWRITEBYTECODE is set (this build machine sets it) no
    interpreter writes bytecode, so every `forge` and server subprocess the tests start
    compiled the sources it imports again (~0.1-0.25 s of CPU each). Unchanged files are
    skipped by their mtime."""
    compileall.compile_dir(str(REPO), maxlevels=0, quiet=1)  # cli.py, __init__.py
    for sub in REPO.iterdir():  # the subpackages, whatever they are named
        if (sub / "__init__.py").is_file() and sub.name != "tests":
            compileall.compile_dir(str(sub), quiet=1)
    # A suite started from a background job (or CI's non-interactive shell) inherits SIGINT
    # ignored, and an ignored signal stays ignored across exec: every child would ignore the
    # Ctrl-C the signal tests send. A Python handler is reset to the default in a child, so
    # with this one every process the tests start gets SIGINT as a terminal gives it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(session, config, items) -> None:
    """The slowest files first (those with a budget in tests/budgets.toml, longest budget
    first), each file's tests kept together and in order: with two workers taking a file at
    a time, a long file started last would run alone at the end."""
    from tests.budgets import load_budgets

    try:
        budgets = load_budgets(TESTS / "budgets.toml")[1]
    except ValueError:
        budgets = {}  # tests/budgets.py reports it after the run
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)

    def key(pair: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        i, item = pair
        f = item.nodeid.split("::")[0]
        return (-float(budgets.get(f, 0)), first[f], i)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def need(condition: bool, reason: str) -> None:
    """Skip locally when a real part is missing; under CI=true that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def which(name: str) -> str | None:
    return shutil.which(name)


@pytest.fixture(autouse=True)
def forge_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "forge-home"
    monkeypatch.setenv("FORGE_HOME", str(home))
    return home


@pytest.fixture
def workspace(forge_home):
    from infer_forge.ledger.workspace import init_workspace

    ws, _ = init_workspace(forge_home)
    yield ws
    ws.close()


# --- PostgreSQL: one server per session, a fresh database per test ------------------------


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server's URL (database `postgres`) for the whole session: the one `.ci/run`
    started ($FORGE_TEST_POSTGRES), else a throwaway one started here and stopped at the end
    (tests/helpers/postgres.py)."""
    import tempfile

    from tests.helpers import postgres

    try:
        import psycopg
    except ImportError:
        psycopg = None
    need(psycopg is not None, "psycopg is not installed (pip install -e '.[postgres]')")
    if os.environ.get(postgres.ENV):
        yield os.environ[postgres.ENV]
        return
    why = postgres.missing()
    need(why is None, why or "")
    root = Path(tempfile.mkdtemp(prefix="forge-pg-"))
    try:
        yield postgres.start(root)
    finally:
        postgres.stop(root)


@pytest.fixture
def pg_url(pg_server, request) -> str:
    """A fresh, empty database of this test's own on the session's server (dropped after)."""
    import hashlib

    import psycopg

    db = "forge_" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}" STRATEGY FILE_COPY')
    yield pg_server.rsplit("/", 1)[0] + "/" + db
    with psycopg.connect(pg_server, autocommit=True) as conn:  # ends leftover sessions too
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


@pytest.fixture
def pg_home(pg_url, forge_home) -> Path:
    """An initialised workspace whose ledger is a fresh PostgreSQL database."""
    from infer_forge.ledger.workspace import init_workspace

    ws, _ = init_workspace(forge_home, ledger_url=pg_url)
    ws.close()
    return forge_home


@pytest.fixture(params=["sqlite", "postgres"])
def backend_home(request, forge_home) -> Path:
    """An initialised workspace on each ledger backend in turn: SQLite, then a fresh
    PostgreSQL database. forge.toml's URL is the only difference (one code path)."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_home")
    from infer_forge.ledger.workspace import init_workspace

    ws, _ = init_workspace(forge_home)
    ws.close()
    return forge_home


def insert_raw_event(home: Path, stream: str, version: int, topic: str, state: bytes) -> int:
    """Write a stored-event row straight into the ledger (SQLite or PostgreSQL, as forge.toml
    says), bypassing the store: how the tests plant unknown, corrupt or old-version events.
    Returns its position."""
    import sqlite3

    from infer_forge.ledger.config import load_config

    config = load_config(home)
    if config.backend == "postgres":
        import psycopg

        env = config.persistence_env()
        with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"],
                             user=env["POSTGRES_USER"], dbname=env["POSTGRES_DBNAME"],
                             autocommit=True) as pg:
            row = pg.execute(
                "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
                "VALUES (%s, %s, %s, %s) RETURNING notification_id",
                (stream, version, topic, state)).fetchone()
            assert row is not None
            return int(row[0])
    conn = sqlite3.connect(home / "ledger.sqlite")
    try:
        cur = conn.execute(
            "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
            "VALUES (?, ?, ?, ?)", (stream, version, topic, state))
        conn.commit()
        return cur.lastrowid
    finally:
        conn.close()


def run_forge(*args: str, home: Path | None = None, input: str | None = None,
              env: dict | None = None, timeout: float = 120,
              process: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI (`cli.main`) on these arguments; a CompletedProcess either way.

    In this process by default (click's CliRunner: ~0.4 s of interpreter start-up saved per
    call), with the environment, working directory (the repository), stdin and exit code a
    subprocess would get; signal handlers, os.environ and the logging handlers are put back
    after. `process=True` runs the installed entry point as a subprocess instead, in a
    session of its own (no controlling terminal): for the tests of the entry point itself,
    of signals, crashes, `timeout`, the terminal channel, or output written by children.

    A person's grants (`forge approve`) are confirmed with the workspace's approver key, as a
    script of theirs would (`FORGE_APPROVER_KEY_FILE`; tests/harness/guard/test_human_channel.py
    checks the channel itself)."""
    e = {}
    if home is not None:
        e["FORGE_HOME"] = str(home)
    forge_home = e.get("FORGE_HOME") or os.environ.get("FORGE_HOME")
    if forge_home and not os.environ.get("FORGE_APPROVER_KEY_FILE"):
        e["FORGE_APPROVER_KEY_FILE"] = str(Path(forge_home) / "approver.key")
    if env:
        e.update(env)
    if process or not CLI_IN_PROCESS:
        return subprocess.run([*FORGE, *args], capture_output=True, text=True, input=input,
                              env={**os.environ, **e}, timeout=timeout, cwd=str(REPO),
                              start_new_session=True)
    return _run_in_process(list(args), e, input)


def _run_in_process(args: list[str], env: dict[str, str], input: str | None
                    ) -> subprocess.CompletedProcess:
    import logging
    import traceback

    from click.testing import CliRunner
    from infer_forge.cli import main

    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                                       signal.SIGHUP)}
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    os.chdir(REPO)
    try:
        result = CliRunner().invoke(main, args, input=input or "", env=env,
                                    prog_name="forge", catch_exceptions=True)
    finally:
        os.chdir(saved_cwd)
        # Put the environment back key by key (never empty: other threads may read it).
        for k in [k for k in os.environ if k not in saved_env]:
            del os.environ[k]
        for k, v in saved_env.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
        for s, h in saved_signals.items():
            signal.signal(s, h)
        root.handlers[:], root.level = saved_handlers, saved_level
    stderr = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # What the interpreter prints for an uncaught exception, and its exit status.
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
        code = 1
    return subprocess.CompletedProcess(["forge", *args], code, result.stdout, stderr)


# --- bench client fixtures ---------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """A small byte-level BPE tokenizer directory (trained here, offline, in ~0.1 s)."""
    from infer_forge.harness.bench.datasets import small_bpe_tokenizer

    return small_bpe_tokenizer(tmp_path_factory.mktemp("tinytok"))


@pytest.fixture
def scripted_server():
    """Factory: start `harness.testing.scripted_server` as a real subprocess; returns its base URL.
    Every server started is terminated at teardown."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        p = subprocess.Popen([sys.executable, "-m", "infer_forge.harness.testing.scripted_server",
                              "--port", "0", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=str(REPO))
        procs.append(p)
        line = p.stdout.readline()  # blocks until the server prints its URL (or exits)
        if not line.startswith("listening on "):
            p.kill()
            raise RuntimeError(f"scripted server did not start: {line!r} {p.stderr.read()}")
        return line.split()[-1]

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


# --- weights and engines fixtures --------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The generated tiny-llama model directory (pulled once per session, no ledger)."""
    from infer_forge.harness.models.weights import fetch_model

    home = tmp_path_factory.mktemp("tiny-model-home")
    return fetch_model(home, "tiny-llama").path


class HFServer:
    """A running `transformers serve` on tiny-llama: `base_url`, `model_dir`, `model` (the name
    requests carry), `engine` (the RunningEngine: describe/check/metrics)."""

    def __init__(self, engine, model_dir: Path):
        self.engine = engine
        self.base_url = engine.base_url
        self.model = engine.model
        self.model_dir = model_dir


@pytest.fixture(scope="session")
def hf_server(tiny_model, tmp_path_factory):
    """One real `transformers serve` (sdpa, float32, cpu) for the whole session, stopped at
    the end (its process group is gone afterwards). Start takes ~10-20 s on 2 cores."""
    from infer_forge.harness.engines.hf import HFEngine

    logs = tmp_path_factory.mktemp("hf-server-logs")
    running = HFEngine().launch({"device": "cpu", "dtype": "float32",
                                 "attn_implementation": "sdpa"}, model=tiny_model, logs=logs)
    try:
        yield HFServer(running, tiny_model)
    finally:
        running.stop()
