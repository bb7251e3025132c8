"""Creating and opening a workspace (FORGE_HOME): directories, forge.toml, ledger, artifacts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import events as E
from .artifacts import ArtifactStore
from .config import (
    CONFIG_NAME,
    CREDENTIALS_NAME,
    Config,
    check_ledger_url,
    load_config,
    resolve_home,
    split_password,
    write_default_config,
)
from .errors import ConfigError, LedgerError
from .store import Ledger
from .streams import WORKSPACE_STREAM

SUBDIRS = ("artifacts", "models", "wiki", "site")


@dataclass
class Workspace:
    config: Config
    ledger: Ledger
    artifacts: ArtifactStore

    @property
    def home(self) -> Path:
        return self.config.home

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_workspace(home: str | Path | None = None, *, create: bool = False) -> Workspace:
    """Open an initialised workspace. Its ledger must exist and be sound: a missing or
    damaged ledger raises DamagedLedgerError (only `create`, from init, makes a new one)."""
    config = load_config(home)
    ledger = Ledger.open(config=config, create=create)
    # The ledger's redactor, built when an artifact first needs it (reads never do).
    return Workspace(config, ledger, ArtifactStore(config.artifacts_dir, lambda: ledger.redactor))


def init_workspace(
    home: str | Path | None = None, *, ledger_url: str | None = None
) -> tuple[Workspace, bool]:
    """Create the workspace if needed. Returns (workspace, created). Idempotent."""
    from importlib.metadata import PackageNotFoundError, version

    root = resolve_home(home)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} exists and is not a directory")
    created = not (root / CONFIG_NAME).exists()
    if ledger_url is not None:
        # Before anything is written; a password never reaches forge.toml or a message.
        check_ledger_url(split_password(ledger_url)[0], "--ledger-url")
    root.mkdir(parents=True, exist_ok=True)
    for sub in SUBDIRS:
        (root / sub).mkdir(exist_ok=True)
    if created:
        had_credentials = (root / CREDENTIALS_NAME).exists()
        write_default_config(root, ledger_url)
        try:
            ws = open_workspace(root, create=True)
        except LedgerError:
            # A ledger that cannot be opened (server down, wrong database): leave no
            # half-made configuration behind, so that `forge init` can simply be run again.
            (root / CONFIG_NAME).unlink(missing_ok=True)
            if not had_credentials:
                (root / CREDENTIALS_NAME).unlink(missing_ok=True)
            raise
    else:
        # An initialised workspace (forge.toml exists) keeps its ledger: a missing or damaged
        # one is an error naming the file, never silently replaced by an empty history.
        ws = open_workspace(root)
    try:
        forge_version = version("infer-forge")
    except PackageNotFoundError:  # running from a source tree
        forge_version = "0+unknown"
    ws.ledger.append(
        WORKSPACE_STREAM,
        [E.WorkspaceInitialized(home=str(root), forge_version=forge_version,
                                ledger_backend=ws.config.backend)],
        command_id="workspace-initialized",  # once per ledger, however often init runs
    )
    return ws, created
