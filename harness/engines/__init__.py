"""Engines: one interface over `transformers serve` (hf), SGLang and external endpoints."""

from .base import (
    Engine,
    NotSupported,
    ReadOnlyError,
    RunningEngine,
    apply_overrides,
    engine_config_of,
    engine_for,
    launch_profile,
)

__all__ = ["Engine", "NotSupported", "ReadOnlyError", "RunningEngine", "apply_overrides",
           "engine_config_of", "engine_for", "launch_profile"]
