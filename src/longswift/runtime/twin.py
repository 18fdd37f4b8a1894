"""A transformers model built on a loaded engine's weights: the benchmark's "hf" baseline and the
batched sampler of self-distillation. It shares the tensors the engine's state dict holds; the ones
only a packed linear holds (on CPU, every linear weight) it gets as unpacked copies."""

from __future__ import annotations

from typing import Any


def hf_twin(engine: Any) -> Any:
    """A transformers causal LM built from the engine's config around its weight tensors (no copy, but
    of the weights that only a packed linear holds)."""
    from transformers import AutoModelForCausalLM

    # Built on the real device (not meta) so that non-persistent buffers such as rope
    # frequencies are computed; the random initial weights are then replaced by ours.
    model = AutoModelForCausalLM.from_config(engine.cfg.hf_config, dtype=engine.model.dtype).to(engine.model.device)
    state = engine.model.full_state()  # packed weights come back as plain copies (runtime.linear)
    if engine.cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    if engine.cfg.rope_freq_factors is not None:  # a GGUF's rope_freqs, which no transformers config can state
        import torch

        rotary = model.model.rotary_emb
        factors = torch.tensor(engine.cfg.rope_freq_factors, dtype=rotary.inv_freq.dtype, device=rotary.inv_freq.device)
        rotary.inv_freq = rotary.inv_freq / factors
        if hasattr(rotary, "original_inv_freq"):
            rotary.original_inv_freq = rotary.original_inv_freq / factors
    return model.eval()
