"""Torch calls per decoder layer of the CUDA decode body, run eagerly on the CPU (float16, so the
linears are colocated as on CUDA), with the fused kernels off and on (fused_norm, fused_residual):
the calls of a 3-layer model minus a 2-layer one. On CUDA each call that is not a view is a kernel
in the replayed graph. Run from the repo root:

python docs/scripts/layer_calls.py [length|bucketed]"""
import sys

import torch
from torch.overrides import TorchFunctionMode
from transformers import LlamaConfig, LlamaForCausalLM

import longswift
from longswift.runtime.cuda_graphs import StepGraphs
from longswift.runtime.memory import new_cache
from longswift.runtime.model import Transformer


class Calls(TorchFunctionMode):
    """Counts torch functions and tensor methods by name (attribute reads and dtype arithmetic, which
    launch nothing, left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in ("__get__", "promote_types"):
            self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def per_layer(fused: bool, attention: str) -> dict[str, int]:
    counts = {}
    for layers in (2, 3):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192)
        loaded = longswift.load(LlamaForCausalLM(cfg).eval(), device="cpu", dtype="float16", pack_weights=True).model
        model = Transformer(loaded.cfg, loaded.full_state(), pack=True, fused_norm=fused, fused_residual=fused,
                            fused_rope=fused)
        body = StepGraphs(model, new_cache(model, 4096, 512, 0, 8, 1), capture=False, attention=attention)
        body.decode(5, 0)
        with Calls() as calls:
            body.decode(6, 1)
        counts[layers] = calls.names
    return {k: counts[3].get(k, 0) - counts[2].get(k, 0) for k in counts[3]}


attention = sys.argv[1] if len(sys.argv) > 1 else "length"
off, on = per_layer(False, attention), per_layer(True, attention)
print(f"{attention}: calls per layer, fused kernels off {sum(off.values())}, on {sum(on.values())}")
print("changed (off, on):", {k: (off.get(k, 0), on.get(k, 0)) for k in sorted(set(off) | set(on))
                             if off.get(k, 0) != on.get(k, 0)})
