"""The workspace: FORGE_HOME and forge.toml. One home roots all state.

Resolution order for the home: an explicit path, then `$FORGE_HOME`, then `./.forge`.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .errors import ConfigError
from .redact import DEFAULT_SECRET_ENV

CONFIG_NAME = "forge.toml"

DEFAULT_CONFIG = """\
# infer-forge workspace configuration. Everything but this file, the ledger and artifacts/
# is a projection that `forge index rebuild` / `forge wiki build` can recreate.

[ledger]
# sqlite:///ledger.sqlite (relative to this home) or postgresql://user@host:5432/dbname
# (the password comes from $PGPASSWORD or [ledger].password_env, never from this file).
url = "sqlite:///ledger.sqlite"
lock_timeout_s = 5

[secrets]
# Values of these environment variables and the contents of these files are redacted from
# every event and artifact, on top of detect-secrets' provider patterns.
env = {env}
files = []

[engines.hf]
device = "cpu"

[model_tiers]
# Execution routing: which model serves each tier ("none" runs without a model).
none = ""
small = ""
large = ""

[guard]
protected_branches = ["main", "master", "release/*"]
production_endpoints = []
"""


def resolve_home(home: str | Path | None = None) -> Path:
    if home is not None:
        return Path(home).expanduser().resolve()
    env = os.environ.get("FORGE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.cwd() / ".forge").resolve()


@dataclass(frozen=True)
class Config:
    home: Path
    ledger_url: str
    lock_timeout_s: int = 5
    secret_env: tuple[str, ...] = DEFAULT_SECRET_ENV
    secret_files: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    def persistence_env(self) -> dict[str, str]:
        """The eventsourcing environment for this ledger URL: the backend is configuration."""
        url = urlparse(self.ledger_url)
        if url.scheme == "sqlite":
            path = Path(unquote(url.path.lstrip("/"))) if url.netloc == "" else None
            if path is None or not str(path):
                raise ConfigError(f"{self.home / CONFIG_NAME}: ledger.url: bad sqlite URL")
            if not path.is_absolute() and not self.ledger_url.startswith("sqlite:////"):
                path = self.home / path
            return {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(path),
                "SQLITE_LOCK_TIMEOUT": str(self.lock_timeout_s),
                "ORIGINATOR_ID_TYPE": "text",
            }
        if url.scheme in ("postgresql", "postgres"):
            password_env = self.raw.get("ledger", {}).get("password_env", "PGPASSWORD")
            env = {
                "PERSISTENCE_MODULE": "eventsourcing.postgres",
                "POSTGRES_DBNAME": url.path.lstrip("/") or "forge",
                "POSTGRES_HOST": url.hostname or "127.0.0.1",
                "POSTGRES_PORT": str(url.port or 5432),
                "POSTGRES_USER": unquote(url.username or "forge"),
                "POSTGRES_PASSWORD": unquote(url.password or os.environ.get(password_env, "")),
                "POSTGRES_LOCK_TIMEOUT": str(self.lock_timeout_s),
                "ORIGINATOR_ID_TYPE": "text",
            }
            return env
        raise ConfigError(
            f"{self.home / CONFIG_NAME}: ledger.url: unsupported scheme {url.scheme!r} "
            "(use sqlite:/// or postgresql://)"
        )

    @property
    def backend(self) -> str:
        return "postgres" if self.ledger_url.startswith("postgres") else "sqlite"


def load_config(home: str | Path | None = None, *, must_exist: bool = True) -> Config:
    root = resolve_home(home)
    path = root / CONFIG_NAME
    if not path.is_file():
        if must_exist:
            raise ConfigError(f"no workspace at {root} ({CONFIG_NAME} missing): run `forge init`")
        return Config(home=root, ledger_url="sqlite:///ledger.sqlite")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    ledger = data.get("ledger", {})
    secrets = data.get("secrets", {})
    url = ledger.get("url", "sqlite:///ledger.sqlite")
    if not isinstance(url, str):
        raise ConfigError(f"{path}: ledger.url: expected a string")
    timeout = ledger.get("lock_timeout_s", 5)
    # 0 would mean the library default (SQLite) or waiting forever (PostgreSQL).
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
        raise ConfigError(f"{path}: ledger.lock_timeout_s: expected a positive integer (seconds)")
    env_names = secrets.get("env", list(DEFAULT_SECRET_ENV))
    files = secrets.get("files", [])
    if not isinstance(env_names, list) or not all(isinstance(x, str) for x in env_names):
        raise ConfigError(f"{path}: secrets.env: expected a list of variable names")
    if not isinstance(files, list) or not all(isinstance(x, str) for x in files):
        raise ConfigError(f"{path}: secrets.files: expected a list of paths")
    return Config(
        home=root,
        ledger_url=url,
        lock_timeout_s=timeout,
        secret_env=tuple(env_names),
        secret_files=tuple(str((root / f) if not Path(f).is_absolute() else f) for f in files),
        raw=data,
    )


def write_default_config(home: Path, ledger_url: str | None = None) -> Path:
    import json

    text = DEFAULT_CONFIG.replace("{env}", json.dumps(list(DEFAULT_SECRET_ENV)))
    if ledger_url:
        text = text.replace('url = "sqlite:///ledger.sqlite"', f"url = {json.dumps(ledger_url)}")
    path = home / CONFIG_NAME
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
