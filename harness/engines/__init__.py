"""Engines: one interface (base.py) over `transformers serve` (hf.py), SGLang (sglang.py) and
external endpoints (external.py); `engine_for` picks the adapter for an engine name."""

from ..errors import HarnessError
from .base import Engine
from .external import ExternalEngine
from .hf import HFEngine
from .sglang import SGLangEngine

ENGINES = ("hf", "sglang", "external")


def engine_for(name: str) -> Engine:
    """The engine adapter for an engine name ("hf", "sglang", "external"); a runtime
    profile's is `engine_config_of(profile)[0]`."""
    match name:
        case "hf":
            return HFEngine()
        case "sglang":
            return SGLangEngine()
        case "external":
            return ExternalEngine()
    raise HarnessError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")

