"""longswift: lossless acceleration of ultra-long generation from Llama-family models (TokenSwift).

The API's names load on first use (PEP 562), so that `import longswift.console` (the command's entry
point) costs nothing until the command line imports torch inside its own Ctrl-C handling."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    "Engine": "engine",
    "GenerationConfig": "config",
    "GenerationResult": "stats",
    "GenerationStats": "stats",
    "GenerationStream": "engine",
    "LongswiftError": "errors",
    "ModelConfig": "config",
    "RuntimeConfig": "config",
    "SamplingConfig": "config",
    "SpecConfig": "config",
    "load": "engine",
}

__all__ = sorted(_API)

if TYPE_CHECKING:
    from .config import GenerationConfig, ModelConfig, RuntimeConfig, SamplingConfig, SpecConfig
    from .engine import Engine, GenerationStream, load
    from .errors import LongswiftError
    from .stats import GenerationResult, GenerationStats


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'longswift' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
