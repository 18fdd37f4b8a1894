"""AR decode throughput of a real model shape with random weights (no download), without CUDA
graphs, with them reading each token back (--read-every 1), with them reading tokens back in
blocks (--read-every 0: auto, 16 on CUDA), in blocks with q/k/v and gate/up colocated (as a model
loaded from a file runs: pack_weights), colocated without the fused kernels (each reduced-dtype
RMSNorm as transformers' four ops instead of one, o_proj/down_proj as a product and an add instead of
one addmm, rope's sum of products as two products and an add instead of a product and an addcmul:
fused_norm, fused_residual and fused_rope off), in blocks with --graph-attention length
(where this torch's flash kernel takes seqused_k), and that with --triton-kernels (where triton is
installed: rope with the cache writes and SwiGLU as one Triton kernel each), through the public Engine:
`python docs/scripts/gpu_ar_throughput.py SHAPE PROMPT NEW [LAYERS [DTYPE]]` (e.g. smollm2-135m 2048
1024); with AR_MODES=targets, only the colocated, fused, token-block runs that issue16_targets.py reads
(bucketed, length and Triton: `gpu_session.sh first`, whose budget the full sweep's 16 runs strained).
Random weights make the text meaningless but not the speed of AR: every step does the same
work. Prints one line per run (each setting twice, interleaved) and where each run's tokens first differ
from the first run's (bucketed runs with separate weights should never; length sums attention in
another order, a colocated product may split its sums otherwise, and the fused kernels round once
where the separate ops round twice, so in bf16 they may, which is rounding, not an error)."""

from __future__ import annotations

import os
import sys

import torch

from longswift import GenerationConfig, RuntimeConfig, SamplingConfig
from longswift.bench.shapes import random_state, shape_config
from longswift.engine import Engine
from longswift.runtime.attention import length_unsupported
from longswift.runtime.loading import LoadedModel
from longswift.runtime.model import Transformer
from longswift.runtime.triton_kernels import triton_unavailable


def main() -> None:
    shape, prompt_len, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    layers = int(sys.argv[4]) if len(sys.argv) > 4 else None
    dtype = getattr(torch, sys.argv[5]) if len(sys.argv) > 5 else torch.bfloat16
    cfg = shape_config(shape, layers)
    state = random_state(cfg, dtype, torch.device("cuda"))
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    tokens = {}
    # (cuda graphs, read every, graph attention, colocated, fused kernels, Triton kernels)
    modes = [("off", 1, "bucketed", False, True, False), ("on", 1, "bucketed", False, True, False),
             ("on", 0, "bucketed", False, True, False), ("on", 0, "bucketed", True, True, False),
             ("on", 0, "bucketed", True, False, False)]
    cuda = torch.device("cuda")
    default = "length" if length_unsupported(cuda) is None else "bucketed"
    if default == "length":  # the second: what a loaded file runs by default
        modes += [("on", 0, "length", False, True, False), ("on", 0, "length", True, True, False)]
    else:
        print(length_unsupported(cuda), flush=True)
    if triton_unavailable(cuda) is None:
        modes.append(("on", 0, default, True, True, True))
    else:
        print(triton_unavailable(cuda), flush=True)
    if os.environ.get("AR_MODES") == "targets":
        modes = [m for m in modes if m[1] == 0 and m[3] and m[4]]
    settings = modes * 2
    for graphs, every, attention, colocated, fused, triton in settings:
        runtime = RuntimeConfig(device="cuda", dtype=str(dtype).removeprefix("torch."), cuda_graphs=graphs,
                                read_every=every, graph_attention=attention, triton_kernels=triton)
        # colocating rewrites the state's entries: on a copy of the dict, so the other runs keep separate weights
        weights = dict(state) if colocated else state
        engine = Engine(LoadedModel(cfg, weights, None, f"<random {shape}>"), pack_weights=colocated, runtime=runtime)
        if not fused:
            engine.model = Transformer(cfg, engine.model.state, pack=colocated, fused_norm=False, fused_residual=False,
                                       fused_rope=False)
        result = engine.generate(prompt, method="ar", sampling=SamplingConfig(temperature=0, repetition_penalty=1.0),
                                 generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
        s = result.stats
        print(f"{shape} layers={cfg.num_layers} {runtime.dtype} prompt={prompt_len} new={new} cuda_graphs={graphs} "
              f"read_every={runtime.token_block(torch.device('cuda'))} graph_attention={attention} "
              f"colocated={engine.model.colocated} fused_norm={engine.model.fused_norm} "
              f"fused_residual={engine.model.fused_residual} fused_rope={engine.model.fused_rope} "
              f"triton_kernels={engine.model.triton_kernels}: "
              f"decode {s.tokens_per_second:.1f} tok/s ({1e3 * s.decode_seconds / (s.new_tokens - 1):.2f} ms/token), "
              f"prefill {s.prefill_seconds:.2f} s, {s.graph_captures} graphs captured in "
              f"{s.graph_capture_seconds:.2f} s", flush=True)
        tokens.setdefault((graphs, every, attention, colocated, fused, triton), result.token_ids)
    base = tokens[settings[0]]
    for key, ids in tokens.items():
        first = next((i for i, (a, b) in enumerate(zip(ids, base)) if a != b), None)
        print(f"{key} == {settings[0]}: {ids == base}" + ("" if ids == base else f" (first difference at {first})"))


if __name__ == "__main__":
    main()
