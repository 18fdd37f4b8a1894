"""Typed configurations. Defaults live here once; the CLI builds its flags from these fields.

One module a config (model, generation: sampling and generation, spec, runtime), what they share (checks) and
the settings written as text (parsing); every name is importable from here."""

from __future__ import annotations

from .checks import SEED_MAX, SEED_MIN, check_types, flag_help, flag_name, seed_problem, torch_seed, validated
from .generation import MIN_TEMPERATURE, PENALTY_RANGE, GenerationConfig, SamplingConfig
from .model import SUPPORTED_ARCHITECTURES, ModelConfig
from .parsing import (DTYPES, HEADS_WORDS, MAX_ROPE_FACTOR, ROPE_SCALINGS, dtype_name, parse_number_list,
                      parse_rope_scaling, parse_tree, same_rope_scaling)
from .runtime import GRAPH_ATTENTIONS, MAX_THREADS, READ_EVERY_CUDA, RuntimeConfig
from .spec import (CPU_MAX_NODES, CPU_NGRAM_TOPK, CPU_TREE, DRAFT_CACHES, GPU_MAX_NODES, LOOKUP_NODES,
                   MAX_LOOKUP_NODES, MAX_NGRAM_TOPK, PAPER_NGRAM_TOPK, PAPER_TREE, WALKS, SpecConfig,
                   changed_spec_fields, unused_spec_fields)

__all__ = [
    "CPU_MAX_NODES", "CPU_NGRAM_TOPK", "CPU_TREE", "DRAFT_CACHES", "DTYPES", "GPU_MAX_NODES", "GRAPH_ATTENTIONS",
    "HEADS_WORDS", "LOOKUP_NODES", "MAX_LOOKUP_NODES", "MAX_NGRAM_TOPK", "MAX_ROPE_FACTOR", "MAX_THREADS",
    "MIN_TEMPERATURE", "PAPER_NGRAM_TOPK", "PAPER_TREE", "PENALTY_RANGE", "READ_EVERY_CUDA", "ROPE_SCALINGS",
    "SEED_MAX", "SEED_MIN", "SUPPORTED_ARCHITECTURES", "WALKS", "GenerationConfig", "ModelConfig", "RuntimeConfig",
    "SamplingConfig", "SpecConfig", "changed_spec_fields", "check_types", "dtype_name", "flag_help", "flag_name",
    "parse_number_list", "parse_rope_scaling", "parse_tree", "same_rope_scaling", "seed_problem", "torch_seed",
    "unused_spec_fields", "validated",
]
