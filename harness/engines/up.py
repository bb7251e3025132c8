"""`forge engine up`: launch a runtime profile's engine on a model, describe it, keep it up
until Ctrl-C (or stop at once with `once`). Records EngineLaunched/EngineStopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...ledger.specs import load_profile
from ...ledger.workspace import Workspace
from . import engine_for
from .base import engine_config_of


def engine_up(ws: Workspace, profile_path: str | Path, *, model: str | None,
              overrides: Mapping[str, Any] | None = None, once: bool = False,
              echo: Callable[[str], None] = print) -> dict[str, Any]:
    """`overrides`: engine config keys to change (`--set`, parsed by the CLI)."""
    profile = load_profile(profile_path)
    name, config = engine_config_of(profile)
    running = engine_for(name).launch(config, model=model, ws=ws, overrides=overrides)
    with running:
        info = running.describe()
        if not once:
            echo(f"{name} engine up at {running.base_url} (model {running.model}); "
                 "Ctrl-C to stop")
            watch(running.check, echo)
    return info


def watch(check: Callable[[], None], echo: Callable[[str], None]) -> None:
    """Until Ctrl-C: `check` the running processes once a second (it raises when one died).
    The interactive commands' watch loop; the caller's `with` block tears down."""
    try:
        while True:
            check()
            time.sleep(1.0)  # a watch loop for an interactive command, not synchronisation
    except KeyboardInterrupt:
        echo("stopping")
