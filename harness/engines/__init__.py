"""Engines: one interface (base.py) over `transformers serve` (hf.py), SGLang (sglang.py) and
external endpoints (external.py); `engine_for` picks the adapter for an engine name."""

from typing import Any

from ..errors import HarnessError
from .base import Engine, engine_config_of
from .external import ExternalEngine
from .hf import HFEngine
from .sglang import SGLangEngine

ENGINES = ("hf", "sglang", "external")


def engine_for(profile_or_name: Any) -> Engine:
    """The engine adapter for a name ("hf", "sglang", "external") or a runtime profile."""
    name = profile_or_name if isinstance(profile_or_name, str) else \
        engine_config_of(profile_or_name)[0]
    match name:
        case "hf":
            return HFEngine()
        case "sglang":
            return SGLangEngine()
        case "external":
            return ExternalEngine()
    raise HarnessError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")

