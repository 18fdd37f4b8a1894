"""longswift: lossless acceleration of ultra-long generation from Llama-family models (TokenSwift).

The API's names, and the package's modules as attributes (`longswift.engine`), load on first use
(PEP 562), so that `import longswift.console` (the command's entry point) costs nothing until the
command line imports torch inside its own Ctrl-C handling."""

from __future__ import annotations

import importlib as _importlib
import importlib.util as _importlib_util
from typing import TYPE_CHECKING as _TYPE_CHECKING

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "GenerationStream",
    "LongswiftError",
    "ModelConfig",
    "RuntimeConfig",
    "SamplingConfig",
    "SpecConfig",
    "load",
]

# each name of __all__ -> the module that defines it
_HOME = {"Engine": "engine", "GenerationStream": "stream", "load": "engine", "LongswiftError": "errors",
         "GenerationResult": "stats", "GenerationStats": "stats", "GenerationConfig": "config",
         "ModelConfig": "config", "RuntimeConfig": "config", "SamplingConfig": "config", "SpecConfig": "config"}

if _TYPE_CHECKING:
    from .config import GenerationConfig, ModelConfig, RuntimeConfig, SamplingConfig, SpecConfig
    from .engine import Engine, load
    from .stream import GenerationStream
    from .errors import LongswiftError
    from .stats import GenerationResult, GenerationStats
else:
    def __getattr__(name: str):
        if name in _HOME:
            value = getattr(_importlib.import_module(f".{_HOME[name]}", __name__), name)
        elif _importlib_util.find_spec(f"{__name__}.{name}") is not None:  # a module of the package
            value = _importlib.import_module(f".{name}", __name__)
        else:
            raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
        globals()[name] = value  # later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({n for n in globals() if not n.startswith("_") and n != "annotations"} | set(__all__) | {"__version__"})
