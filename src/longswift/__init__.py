"""longswift: lossless acceleration of ultra-long generation from Llama-family models (TokenSwift)."""

from .config import GenerationConfig, ModelConfig, RuntimeConfig, SamplingConfig, SpecConfig
from .engine import Engine, GenerationStream, load
from .errors import LongswiftError
from .stats import GenerationResult, GenerationStats

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
