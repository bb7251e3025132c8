"""forge.toml has one schema: unknown tables and keys are refused by name
(a typo never falls back to a local SQLite ledger), as are sections that are not tables,
wrong types, non-finite numbers, binary files and passwords in the ledger URL; every refusal
is one line naming the file and the key, and nothing is written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from infer_forge.cli import main
from infer_forge.ledger.config import DEFAULT_CONFIG, load_config, mask_url, split_password
from infer_forge.ledger.errors import ConfigError

from tests.conftest import run_forge


@pytest.fixture
def home(forge_home) -> Path:
    assert CliRunner().invoke(main, ["init"]).exit_code == 0
    return forge_home


def _rows(home: Path) -> list[tuple]:
    with sqlite3.connect(home / "ledger.sqlite") as c:
        return c.execute("SELECT rowid, originator_id, originator_version, topic, state "
                         "FROM stored_events ORDER BY rowid").fetchall()


def _edit(home: Path, old: str | None, new: str) -> Path:
    cfg = home / "forge.toml"
    if old is None:  # the whole file
        cfg.write_text(new)
        return cfg
    text = cfg.read_text()
    assert old in text, old
    cfg.write_text(text.replace(old, new, 1))
    return cfg


BAD = {
    # typo'd table and keys: named, with what the table knows
    "table-typo": (("[ledger]", "[ledgr]"), "unknown key ledgr (known here: ledger,"),
    "key-typo": (('url = "sqlite', 'ulr = "sqlite'),
                 "unknown key ledger.ulr (known here: url, lock_timeout_s,"),
    "unknown-top-level-key": (("[ledger]", 'backend = "postgres"\n[ledger]'),
                              "unknown key backend (known here: ledger, secrets,"),
    "nested-typo": (('device = "cpu"', 'device = "cpu"\n[model_tiers.extra]'),
                    "unknown key model_tiers.extra"),
    "several-unknown": (("lock_timeout_s = 5", "lock_timeout = 5\nlock_timout_s = 5"),
                        "unknown keys ledger.lock_timeout, ledger.lock_timout_s"),
    "unknown-engine": (("[engines.hf]", "[engines.vllm]"),
                       "engines: unknown engine 'vllm' (known: hf, sglang, external)"),
    # sections that are not tables
    "section-not-a-table": ((None, "secrets = 5\n"), "secrets: expected a table"),
    "ledger-not-a-table": ((None, 'ledger = "sqlite:///ledger.sqlite"\n'),
                           "ledger: expected a table"),
    "engines-not-a-table": ((None, "engines = [1]\n"), "engines: expected a table"),
    "engine-not-a-table": ((None, 'engines.hf = "cpu"\n'), "engines.hf: expected a table"),
    # wrong types and values
    "timeout-as-text": (("lock_timeout_s = 5", 'lock_timeout_s = "5"'),
                        "ledger.lock_timeout_s: expected a positive integer"),
    "timeout-as-float": (("lock_timeout_s = 5", "lock_timeout_s = 5.5"),
                         "ledger.lock_timeout_s: expected a positive integer"),
    "timeout-as-bool": (("lock_timeout_s = 5", "lock_timeout_s = true"),
                        "ledger.lock_timeout_s: expected a positive integer"),
    "connect-timeout-zero": (("connect_timeout_s = 5", "connect_timeout_s = 0"),
                             "ledger.connect_timeout_s: expected a positive integer"),
    "files-not-a-list": (("files = []", 'files = "/etc/token"'),
                         "secrets.files: expected a list"),
    "branch-not-text": (('protected_branches = ["main"', 'protected_branches = [1, "main"'),
                        "guard.protected_branches"),
    "password-env-not-a-name": (("lock_timeout_s = 5", 'lock_timeout_s = 5\npassword_env = "$X"'),
                                "ledger.password_env: expected an environment variable name"),
    # numbers the ledger could never hold
    "nan": (('device = "cpu"', 'device = "cpu"\nmem_fraction = nan'),
            "engines.hf.mem_fraction: NaN is not a finite number"),
    "inf-timeout": (("lock_timeout_s = 5", "lock_timeout_s = inf"),
                    "lock_timeout_s"),
    # URLs
    "password-in-url": (('url = "sqlite:///ledger.sqlite"',
                         'url = "postgresql://forge:hunter2-pw@db:5432/forge"'),
                        "ledger.url: holds a password (postgresql://forge:"),  # masked
    "bad-port": (('url = "sqlite:///ledger.sqlite"', 'url = "postgresql://forge@db:notaport/f"'),
                 "ledger.url: not a valid URL"),
    "bad-scheme": (('url = "sqlite:///ledger.sqlite"', 'url = "mysql://db/forge"'),
                   "unsupported scheme 'mysql'"),
    "toml-syntax": (("[ledger]", "[ledger"), "forge.toml: "),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_forge_toml_is_one_line_and_writes_nothing(home, case):
    (old, new), says = BAD[case]
    before = _rows(home)
    cfg = _edit(home, old, new)
    for args in (["log"], ["measure", "t1", "--metric", "x=1"], ["task", "new", "nope.yaml"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: {cfg}: "), r.stderr
        assert says in lines[0], lines[0]
        assert "hunter2-pw" not in r.output + r.stderr
    assert _rows(home) == before


@pytest.mark.parametrize("content", [b"\x00\x01\x02\xff\xfe binary", "[ledger]\nurl = 'caf\xe9'\n"
                                     .encode("latin-1"), bytes(range(256)) * 8])
def test_binary_forge_toml_is_one_line(home, content):
    cfg = home / "forge.toml"
    cfg.write_bytes(content)
    r = run_forge("log", home=home)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"Error: {cfg}: ")


def test_every_documented_key_is_accepted(home):
    """The schema knows every key the package reads (ledger, secrets, engines, model tiers,
    guard, wiki and its narrative): a complete forge.toml loads."""
    cfg = home / "forge.toml"
    cfg.write_text(cfg.read_text() + """
[engines.sglang]
mem_fraction_static = 0.8
cuda_graph_bs = [1, 2, 4]

[wiki]
embeddings = false
embedding_model = "/models/minilm"

[wiki.narrative]
url = "http://127.0.0.1:30000/v1"
model = "qwen"
api_key_env = "NARRATIVE_KEY"
""".replace("[model_tiers]", "[model_tiers]\nhuman = \"\""))
    cfg.write_text(cfg.read_text().replace("lock_timeout_s = 5",
                                           'lock_timeout_s = 5\npassword_env = "FORGE_PG"'))
    c = load_config(home)
    assert c.password_env == "FORGE_PG" and c.connect_timeout_s == 5
    assert c.raw["wiki"]["narrative"]["model"] == "qwen"
    assert CliRunner().invoke(main, ["log"]).exit_code == 0


def test_default_config_is_the_schema_default(tmp_path):
    """An empty forge.toml and the written default mean the same configuration."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "forge.toml").write_text("")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "forge.toml").write_text(DEFAULT_CONFIG.replace("{env}", "[]"))
    a, b = load_config(tmp_path / "a"), load_config(tmp_path / "b")
    assert (a.ledger_url, a.lock_timeout_s, a.connect_timeout_s) == \
        (b.ledger_url, b.lock_timeout_s, b.connect_timeout_s)


@pytest.mark.parametrize(("url", "masked", "clean", "password"), [
    ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db", "postgresql://u@h:5432/db",
     "pw"),
    ("postgresql://u:p%40ss@h/db", "postgresql://u:***@h/db", "postgresql://u@h/db", "p@ss"),
    ("postgresql://u:p@ss/w@h/db", "postgresql://u:***@h/db", "postgresql://u@h/db", "p@ss/w"),
    ("postgresql://u@h/db", "postgresql://u@h/db", "postgresql://u@h/db", None),
    ("sqlite:///ledger.sqlite", "sqlite:///ledger.sqlite", "sqlite:///ledger.sqlite", None),
])
def test_mask_and_split_url(url, masked, clean, password):
    assert mask_url(url) == masked
    assert split_password(url) == (clean, password)


def test_init_refuses_a_bad_url_before_writing_anything(tmp_path):
    target = tmp_path / "ws"
    for url, says in (("mysql://u:topsecret1@db/f", "unsupported scheme"),
                      ("postgresql://u:topsecret1@db:99999/f", "not a valid URL"),
                      ("sqlite://host/ledger.sqlite", "bad sqlite URL")):
        r = run_forge("init", "--home", str(target), "--ledger-url", url)
        assert r.returncode == 1 and says in r.stderr and "topsecret1" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert not (target / "forge.toml").exists()
        assert not (target / "credentials.toml").exists()


def test_config_error_type_is_ledger_config_error(home):
    _edit(home, "[ledger]", "[ledgr]")
    with pytest.raises(ConfigError, match="unknown key ledgr"):
        load_config(home)


@pytest.mark.parametrize(("content", "says"), [
    (b'[ledger]\npasword = "x"\n', "unknown key ledger.pasword (known here: password)"),
    (b"[ledger]\npassword = 5\n", "ledger.password: expected a string"),
    (b"\xff\xfe\x00\x01", "not UTF-8 text"),
    (b"ledger = 1\n", "ledger: expected a table"),
])
def test_bad_credentials_file_is_one_line_naming_it(home, content, says):
    cfg = home / "forge.toml"
    cfg.write_text('[ledger]\nurl = "postgresql://forge@127.0.0.1:9/forge"\n')
    creds = home / "credentials.toml"
    creds.write_bytes(content)
    r = CliRunner().invoke(main, ["log"])
    assert r.exit_code == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"Error: {creds}: ") and says in line, line


@pytest.mark.timeout(60)
def test_endless_credentials_file_is_refused_at_the_size_bound(home):
    """A credentials.toml that never ends (a link to /dev/zero) is refused at the 1 MiB bound
    by the one bounded reader (ledger.textfile), not read until memory runs out."""
    (home / "forge.toml").write_text('[ledger]\nurl = "postgresql://forge@127.0.0.1:9/forge"\n')
    creds = home / "credentials.toml"
    creds.symlink_to("/dev/zero")
    r = CliRunner().invoke(main, ["log"])
    assert r.exit_code == 1
    (line,) = r.stderr.strip().splitlines()
    assert line == f"Error: {creds}: larger than 1 MiB (not a credentials file?)", line
