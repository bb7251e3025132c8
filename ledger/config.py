"""The workspace: FORGE_HOME and forge.toml. One home roots all state.

Resolution order for the home: an explicit path, then `$FORGE_HOME`, then `./.forge`.

Contracts:
- forge.toml has one schema (`ForgeToml`): an unknown table or key, a wrong type, a non-finite
  number, a file that is not UTF-8 TOML are each refused with one line naming file and key.
- The ledger URL never holds a password: `forge init --ledger-url postgresql://u:PW@h/db`
  writes PW to `<home>/credentials.toml` (mode 0600) and the URL without it to forge.toml; a
  password written into forge.toml by hand is refused. Otherwise the password comes from
  `$PGPASSWORD` (or `[ledger].password_env`). Messages show URLs masked (`mask_url`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .atomic import write_atomic
from .errors import ConfigError
from .home import CONFIG_NAME, no_workspace, resolve_home
from .numbers import bad_number, field_path
from .secrets.redactor import DEFAULT_SECRET_ENV
from .textfile import TextFileError, read_text

CREDENTIALS_NAME = "credentials.toml"  # secrets kept out of forge.toml (mode 0600)

DEFAULT_CONFIG = """\
# infer-forge workspace configuration. Everything but this file, the ledger and artifacts/
# is a projection that `forge index rebuild` / `forge wiki build` can recreate.
# Unknown keys are refused (a typo never falls back to a default silently).

[ledger]
# sqlite:///ledger.sqlite (relative to this home) or postgresql://user@host:5432/dbname.
# Never a password in this file: `forge init --ledger-url postgresql://user:PASSWORD@…` keeps
# it in credentials.toml next to this file (mode 0600); else it is read from $PGPASSWORD (or
# the variable named by password_env = "…").
url = "sqlite:///ledger.sqlite"
lock_timeout_s = 5
# PostgreSQL: seconds to wait for a connection before giving up.
connect_timeout_s = 5

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
# The push guard (forge repos hooks): refs of these remotes matching these branch patterns
# take a recorded approval for each push (forge repos approve).
protected_remotes = ["*"]
protected_branches = ["main", "master", "release/*"]
production_endpoints = []          # URLs (prefix) or host[:port] of production servers
# Against a production endpoint forge allows reads (/health, /metrics, /server_info,
# /v1/models) and probe traffic within production_probe; it refuses flush_cache, profiling,
# weight updates and more load. An action listed in production_allow (e.g. "flush_cache",
# "load") still needs a recorded approval (forge approve).
production_allow = []
production_probe = {max_rps = 1.0, max_duration_s = 30, max_requests = 30}
# Recorded tool calls run in bubblewrap (read-only root, writable task directories, no
# network unless the task allows it) with an allowlisted environment: auto | required | off.
sandbox = "auto"
sandbox_env = []                   # more variable names every tool call gets
sandbox_writable = []              # more directories every tool call may write

[data]
# Prompts and responses of class "production" (production endpoints, and datasets or
# endpoints classed so below) are stored only as counts, lengths and sha256 digests.
store_production = false
# [data.classes]                     # dataset name, endpoint URL or host -> class
# "prod-traffic" = "production"      # public | internal | production

# [models.small]                     # a model tier for agent executors and reviewers
# url = "http://127.0.0.1:30000/v1"  # any OpenAI-compatible chat endpoint (SGLang too)
# model = "Qwen/Qwen3-8B"
# family = "qwen"                    # a reviewer must be of another family
# api_key_env = "SMALL_API_KEY"      # read at call time, never recorded
# price_in_per_mtok = 0.0
# price_out_per_mtok = 0.0

[skills]
dirs = []                            # your own skill folders, next to the shipped ones

[repos]
# The MonoRepo root (forge repos init MANIFEST), relative to FORGE_HOME unless absolute.
root = "monorepo"
"""

# --- the schema of forge.toml: every table and key, nothing else ------------------------


class _Table(BaseModel):
    # strict: TOML values are typed already; "5" is not a number of seconds, 5.0 not an int.
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)


class LedgerSettings(_Table):
    url: str = "sqlite:///ledger.sqlite"
    lock_timeout_s: int = Field(5, ge=1, le=86400)  # 0 would mean "library default"/"forever"
    connect_timeout_s: int = Field(5, ge=1, le=86400)
    password_env: str = Field("PGPASSWORD", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretsSettings(_Table):
    env: list[str] = Field(default_factory=lambda: list(DEFAULT_SECRET_ENV))
    files: list[str] = Field(default_factory=list)


class ModelTiers(_Table):
    none: str = ""
    small: str = ""
    large: str = ""
    human: str = ""


class ProbeBudget(_Table):
    """Probe traffic a production endpoint may get from one plan (a bench run)."""

    max_rps: float = Field(1.0, gt=0, le=1e6)
    max_duration_s: float = Field(30.0, gt=0, le=86400)
    max_requests: int = Field(30, ge=1, le=1_000_000)


DataClass = Literal["public", "internal", "production"]


class DataSettings(_Table):
    """The data policy (harness/guard/data_policy.py): `classes` maps dataset names and
    endpoint URLs or hosts to a class; production endpoints are `production` by default."""

    store_production: bool = False
    classes: dict[str, DataClass] = Field(default_factory=dict)


class GuardSettings(_Table):
    # fnmatch patterns over a remote's name or URL, and over branch names (refs/heads/…)
    protected_remotes: list[str] = Field(default_factory=lambda: ["*"])
    protected_branches: list[str] = Field(default_factory=lambda: ["main", "master",
                                                                   "release/*"])
    production_endpoints: list[str] = Field(default_factory=list)
    # Actions that forge.toml lets through against production, each with an approval
    # (harness/guard/production.py): "flush_cache", "start_profile", "load", a path, ...
    production_allow: list[str] = Field(default_factory=list)
    production_probe: ProbeBudget = Field(default_factory=ProbeBudget)
    # Recorded tool calls (harness/guard/sandbox.py): "auto" runs them in bubblewrap where
    # it works (else unsandboxed, saying so), "required" refuses without it, "off" is the
    # old way (forge's whole environment, no sandbox). `sandbox_env`: variable names (or
    # fnmatch patterns) passed to every call on top of the built-in allowlist (secret-named
    # ones only when a task names them); `sandbox_writable`: more directories every call
    # may write (relative to FORGE_HOME unless absolute), e.g. a compiler cache.
    sandbox: Literal["auto", "off", "required"] = "auto"
    sandbox_env: list[str] = Field(default_factory=list)
    sandbox_writable: list[str] = Field(default_factory=list)


class RepoSettings(_Table):
    root: str = Field("monorepo", min_length=1)


class ModelSettings(_Table):
    """One model tier (`[models.<tier>]`): an OpenAI-compatible chat endpoint. The key is read
    from `api_key_env` when a call is made and never recorded."""

    url: str = Field(min_length=1)  # base URL, e.g. http://127.0.0.1:30000/v1
    model: str = Field(min_length=1)
    family: str = Field(min_length=1)  # e.g. qwen, claude, gpt: a reviewer's must differ
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    price_in_per_mtok: float = Field(0.0, ge=0)  # USD per million prompt tokens
    price_out_per_mtok: float = Field(0.0, ge=0)  # USD per million completion tokens
    timeout_s: float = Field(120.0, gt=0)
    max_tokens: int = Field(1024, ge=1)
    temperature: float = Field(0.0, ge=0, le=2)


class SkillSettings(_Table):
    dirs: list[str] = Field(default_factory=list)  # user skill folders (relative to FORGE_HOME)


class NarrativeSettings(_Table):
    url: str | None = None
    model: str | None = None
    api_key_env: str | None = None


class WikiSettingsToml(_Table):
    embeddings: bool = True
    embedding_model: str | None = None
    narrative: NarrativeSettings | None = None


EngineName = Literal["hf", "sglang", "external"]
TomlScalar = str | int | float | bool
EngineOptions = dict[str, TomlScalar | list[TomlScalar]]  # an engine's own flags: free-form


class ForgeToml(_Table):
    """forge.toml, whole. Engine tables hold the engine's own flags (free-form values)."""

    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    engines: dict[EngineName, EngineOptions] = Field(default_factory=dict)
    model_tiers: ModelTiers = Field(default_factory=ModelTiers)
    guard: GuardSettings = Field(default_factory=GuardSettings)
    data: DataSettings = Field(default_factory=DataSettings)
    repos: RepoSettings = Field(default_factory=RepoSettings)
    models: dict[str, ModelSettings] = Field(default_factory=dict)  # tier -> endpoint
    skills: SkillSettings = Field(default_factory=SkillSettings)
    wiki: WikiSettingsToml = Field(default_factory=WikiSettingsToml)


class _CredentialsLedger(_Table):
    password: str


class Credentials(_Table):
    """credentials.toml: `[ledger] password = "…"` (the PostgreSQL password)."""

    ledger: _CredentialsLedger | None = None


_MESSAGES = {
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
}


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The table model at `loc` inside `model` (for naming the keys a table knows)."""
    for part in loc:
        field_info = model.model_fields.get(str(part))
        if field_info is None:
            return None
        ann = field_info.annotation
        nxt = next((a for a in (ann, *get_args(ann))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def _schema_problem(path: Path, model: type[BaseModel], e: ValidationError) -> ConfigError:
    """One line for a schema error: every unknown key at once (with the keys their table
    knows), else the first wrong value."""
    errors = e.errors()
    unknown = [err["loc"] for err in errors if err["type"] == "extra_forbidden"]
    if unknown:
        names = ", ".join(".".join(map(str, loc)) for loc in unknown)
        table = _model_at(model, tuple(unknown[0][:-1]))
        known = f" (known here: {', '.join(table.model_fields)})" if table else ""
        noun = "key" if len(unknown) == 1 else "keys"
        return ConfigError(f"{path}: unknown {noun} {names}{known}")
    err = errors[0]
    loc = err["loc"]
    if loc[:1] == ("engines",) and "[key]" in loc:
        return ConfigError(f"{path}: engines: unknown engine {err['input']!r} (known: "
                           f"{', '.join(get_args(EngineName))})")
    where = ""
    for part in loc:
        if isinstance(part, int):
            where += f"[{part}]"
        elif not str(part).startswith(("str", "int", "list[", "float", "bool")):
            where += ("." if where else "") + str(part)  # (union branch labels left out)
    msg = _MESSAGES.get(err["type"])
    if loc[:1] == ("engines",) and len(loc) > 2:
        msg = "expected a string, number, boolean or a list of them"
    elif where.endswith("_timeout_s"):
        msg = "expected a positive integer (seconds)"
    elif err["type"] == "string_pattern_mismatch":
        msg = "expected an environment variable name"
    msg = msg or " ".join(str(err["msg"]).split())
    return ConfigError(f"{path}: {where or '(top)'}: {msg}")


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        text = read_text(path, MAX_TOML_BYTES, f"a {what}")
    except TextFileError as e:
        raise ConfigError(f"{path}: {e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    bad = bad_number(data)
    if bad is not None:
        raise ConfigError(f"{path}: {field_path('', bad[0])}: {bad[1]}")
    return data


MAX_TOML_BYTES = 1024 * 1024


# --- ledger URLs: never with a password in them ------------------------------------------


def mask_url(url: str) -> str:
    """`url` with any password replaced by `***` (for messages)."""
    head, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{head}://{userinfo.split(':', 1)[0]}:***@{host}"


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password or None)."""
    head, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url, None
    user, _, password = userinfo.partition(":")
    return f"{head}://{user}@{host}", unquote(password)


def check_ledger_url(url: str, where: str, *, allow_password: bool = False) -> None:
    """Refuse a ledger URL this version cannot use; messages never show a password."""
    try:
        u = urlparse(url)
        u.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as e:
        raise ConfigError(f"{where}: ledger.url: not a valid URL ({mask_url(url)}: "
                          f"{' '.join(str(e).split())})") from None
    if u.scheme == "sqlite":
        if u.netloc != "" or not unquote(u.path.lstrip("/")):
            raise ConfigError(f"{where}: ledger.url: bad sqlite URL {mask_url(url)!r} "
                              "(use sqlite:///ledger.sqlite or sqlite:////abs/path)")
        return
    if u.scheme in ("postgresql", "postgres"):
        if not allow_password and split_password(url)[1] is not None:
            raise ConfigError(
                f"{where}: ledger.url: holds a password ({mask_url(url)}); remove it: "
                f"`forge init --ledger-url` keeps it in {CREDENTIALS_NAME}, or set $PGPASSWORD")
        return
    raise ConfigError(
        f"{where}: ledger.url: unsupported scheme {u.scheme!r} (use sqlite:/// or postgresql://)"
    )


# --- the configuration -------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    home: Path
    ledger_url: str
    lock_timeout_s: int = 5
    secret_env: tuple[str, ...] = DEFAULT_SECRET_ENV
    secret_files: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)
    connect_timeout_s: int = 5
    password_env: str = "PGPASSWORD"
    ledger_password: str | None = field(default=None, repr=False)  # from credentials.toml
    settings: ForgeToml = field(default_factory=ForgeToml)  # forge.toml, typed

    @property
    def monorepo_root(self) -> Path:
        """The MonoRepo root: `[repos] root`, relative to FORGE_HOME unless absolute."""
        p = Path(self.settings.repos.root).expanduser()
        return p if p.is_absolute() else self.home / p

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    @property
    def display_url(self) -> str:
        return mask_url(self.ledger_url)

    def password(self) -> str:
        """The PostgreSQL password: credentials.toml, else $password_env, else empty."""
        if self.ledger_password is not None:
            return self.ledger_password
        url_password = split_password(self.ledger_url)[1]
        return url_password or os.environ.get(self.password_env, "")

    def secret_values(self) -> list[str]:
        """Secrets the configuration itself holds (the ledger password): never stored."""
        pw = self.password() if self.backend == "postgres" else ""
        return [pw] if pw else []

    def scrub(self, message: str) -> str:
        """`message` without the ledger password (errors may echo connection strings)."""
        for pw in self.secret_values():
            message = message.replace(pw, "***")
        return message

    def persistence_env(self) -> dict[str, str]:
        """The eventsourcing environment for this ledger URL: the backend is configuration."""
        check_ledger_url(self.ledger_url, str(self.home / CONFIG_NAME), allow_password=True)
        url = urlparse(self.ledger_url)
        if url.scheme == "sqlite":
            path = Path(unquote(url.path.lstrip("/")))
            if not path.is_absolute() and not self.ledger_url.startswith("sqlite:////"):
                path = self.home / path
            return {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(path),
                "SQLITE_LOCK_TIMEOUT": str(self.lock_timeout_s),
                "ORIGINATOR_ID_TYPE": "text",
            }
        if url.scheme in ("postgresql", "postgres"):
            return {
                "PERSISTENCE_MODULE": "eventsourcing.postgres",
                "POSTGRES_DBNAME": unquote(url.path.lstrip("/")) or "forge",
                "POSTGRES_HOST": url.hostname or "127.0.0.1",
                "POSTGRES_PORT": str(url.port or 5432),
                "POSTGRES_USER": unquote(url.username or "forge"),
                "POSTGRES_PASSWORD": self.password(),
                "POSTGRES_LOCK_TIMEOUT": str(self.lock_timeout_s),
                # How long to wait for a connection from the pool (the library's default is
                # 30 s); a refused or unreachable server fails after this, not after 30 s.
                "POSTGRES_CONNECT_TIMEOUT": str(self.connect_timeout_s),
                "ORIGINATOR_ID_TYPE": "text",
            }
        raise ConfigError(f"{self.home / CONFIG_NAME}: ledger.url: unsupported scheme "
                          f"{url.scheme!r} (use sqlite:/// or postgresql://)")

    @property
    def backend(self) -> str:
        return "postgres" if self.ledger_url.startswith("postgres") else "sqlite"


def parse_config(path: Path, data: dict[str, Any]) -> ForgeToml:
    """Validate forge.toml's data against the schema (one-line ConfigError naming the key)."""
    try:
        settings = ForgeToml.model_validate(data)
    except ValidationError as e:
        raise _schema_problem(path, ForgeToml, e) from None
    check_ledger_url(settings.ledger.url, str(path))
    return settings


def load_credentials(root: Path) -> str | None:
    """The ledger password from `<home>/credentials.toml`, or None when there is none."""
    path = root / CREDENTIALS_NAME
    if not path.exists():
        return None
    data = _read_toml(path, "credentials file")
    try:
        creds = Credentials.model_validate(data)
    except ValidationError as e:
        raise _schema_problem(path, Credentials, e) from None
    return creds.ledger.password if creds.ledger else None


def load_config(home: str | Path | None = None, *, must_exist: bool = True) -> Config:
    root = resolve_home(home)
    path = root / CONFIG_NAME
    if not path.is_file():
        if must_exist:
            raise ConfigError(no_workspace(root))
        return Config(home=root, ledger_url="sqlite:///ledger.sqlite")
    data = _read_toml(path, CONFIG_NAME)
    s = parse_config(path, data)
    files = s.secrets.files
    return Config(
        home=root,
        ledger_url=s.ledger.url,
        lock_timeout_s=s.ledger.lock_timeout_s,
        secret_env=tuple(s.secrets.env),
        secret_files=tuple(str((root / f) if not Path(f).is_absolute() else f) for f in files),
        raw=data,
        connect_timeout_s=s.ledger.connect_timeout_s,
        password_env=s.ledger.password_env,
        ledger_password=load_credentials(root) if s.ledger.url.startswith("postgres") else None,
        settings=s,
    )


def write_credentials(home: Path, password: str) -> Path:
    """Write `<home>/credentials.toml` (mode 0600 from the start: never readable by others)."""
    import json

    path = home / CREDENTIALS_NAME
    write_atomic(path, "# The ledger's PostgreSQL password (kept out of forge.toml). Mode "
                       f"0600.\n[ledger]\npassword = {json.dumps(password)}\n", mode=0o600)
    return path


def write_default_config(home: Path, ledger_url: str | None = None) -> Path:
    """Write forge.toml; a password in `ledger_url` goes to credentials.toml, never here."""
    import json

    text = DEFAULT_CONFIG.replace("{env}", json.dumps(list(DEFAULT_SECRET_ENV)))
    if ledger_url:
        url, password = split_password(ledger_url)
        check_ledger_url(url, "--ledger-url")
        if password is not None:
            write_credentials(home, password)
        text = text.replace('url = "sqlite:///ledger.sqlite"', f"url = {json.dumps(url)}")
    path = home / CONFIG_NAME
    write_atomic(path, text)
    return path
