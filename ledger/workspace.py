"""Creating and opening a workspace (FORGE_HOME): directories, forge.toml, ledger, artifacts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import events as E
from .artifacts import ArtifactStore
from .config import CONFIG_NAME, Config, load_config, resolve_home, write_default_config
from .errors import ConfigError
from .store import Ledger

WORKSPACE_STREAM = "workspace"
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


def open_workspace(home: str | Path | None = None) -> Workspace:
    config = load_config(home)
    ledger = Ledger.open(config=config)
    return Workspace(config, ledger, ArtifactStore(config.artifacts_dir, ledger.redactor))


def init_workspace(
    home: str | Path | None = None, *, ledger_url: str | None = None
) -> tuple[Workspace, bool]:
    """Create the workspace if needed. Returns (workspace, created). Idempotent."""
    from importlib.metadata import PackageNotFoundError, version

    root = resolve_home(home)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} exists and is not a directory")
    created = not (root / CONFIG_NAME).exists()
    root.mkdir(parents=True, exist_ok=True)
    for sub in SUBDIRS:
        (root / sub).mkdir(exist_ok=True)
    if created:
        write_default_config(root, ledger_url)
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
