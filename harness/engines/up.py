"""`forge engine up`: launch a runtime profile's engine on a model, describe it, keep it up
until Ctrl-C (or stop at once with `once`). Records EngineLaunched/EngineStopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import HarnessError
from .base import engine_config_of, engine_for


def load_profile_file(path: str | Path) -> Any:
    """A RuntimeProfile spec (validated) when ledger.specs can read it, else the YAML mapping."""
    try:
        from ...ledger.specs import load_profile
    except ImportError:  # pragma: no cover - specs land with issue 3
        load_profile = None
    if load_profile is not None:
        try:
            return load_profile(path)
        except Exception as e:  # the spec layer's own error type
            raise HarnessError(" ".join(str(e).split())) from None
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise HarnessError(f"{path}: {e}") from None


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs, values read as YAML scalars (true, 8, bfloat16) by the specs' bounded
    loader (no alias bomb or recursive anchor, finite numbers); a bad value is one line."""
    from ...ledger.specs import SpecError, load_yaml_text

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise HarnessError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = load_yaml_text(raw, f"--set {key.strip()}")[0] \
                if raw.strip() else None
        except SpecError as e:
            raise HarnessError(e.problems[0]) from None
    return out


def engine_up(ws, profile_path: str | Path, *, model: str | None, sets: Sequence[str] = (),
              once: bool = False, echo: Callable[[str], None] = print) -> dict[str, Any]:
    profile = load_profile_file(profile_path)
    name, config = engine_config_of(profile)
    running = engine_for(name).launch(config, model=model, ws=ws, overrides=parse_sets(sets))
    with running:
        info = running.describe()
        if not once:
            echo(f"{name} engine up at {running.base_url} (model {running.model}); "
                 "Ctrl-C to stop")
            try:
                while True:
                    running.check()
                    time.sleep(1.0)  # a watch loop for an interactive command
            except KeyboardInterrupt:
                echo("stopping")
    return info
