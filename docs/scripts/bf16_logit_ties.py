"""Would float32 logits keep bfloat16 greedy decoding on one path? A CPU stand-in for the GPU's
bf16 divergence (where the verify pass's kernels round differently from the decode step's).

Greedy AR on the embedded model in bfloat16 from a prose prompt, run three ways that compute the
same thing in a different order (attention by explicit `bmm` + softmax or by the CPU flash op;
linears on oneDNN-packed weights or by `F.linear`), and reports the first new token where each
variant differs from the first. It does so with the LM head's
logits rounded to bfloat16 (what a bf16 model computes today, cast to float32 afterwards) and with
float32 logits (float32 products of the same bf16 inputs). If float32 logits moved the first
difference much later, kernel-order differences would be hiding in the head's rounding; if not,
they come from the layers below and a float32 head would not keep the paths together. It also
counts exact top-2 ties among the bf16 logits. Run from the repo root:

python docs/scripts/bf16_logit_ties.py [new_tokens] [prompt_tokens]"""
import sys
from pathlib import Path

import torch

import longswift
from longswift.runtime.memory import new_cache

new, prompt_len = (int(a) for a in (sys.argv[1:] + ["300", "1024"][len(sys.argv) - 1 :])[:2])
models = {pack: longswift.load(dtype="bfloat16", heads=None, pack_weights=pack) for pack in (True, False)}
ids = models[True].encode(Path("docs/prompts/clockmaker.txt").read_text())[:prompt_len]
VARIANTS = {"explicit attention, packed linears": ("explicit", True),
            "flash attention, packed linears": ("flash", True),
            "explicit attention, F.linear": ("explicit", False)}


def greedy(kernel: str, pack: bool, head: str) -> tuple[list[int], int]:
    m = models[pack].model
    m.attention.kernel = kernel
    weight = m.embed if m.cfg.tie_word_embeddings else m.state_tensor("lm_head.weight")  # [V, hidden] bf16
    if head == "float32":
        w32 = weight.float()
        m.logits = lambda h: m.norm(h, m.final_norm).float() @ w32.T  # [T, V] float32
    else:
        m.__dict__.pop("logits", None)  # the model's own: bf16 product, cast to float32
    cache = new_cache(m, prompt_len + new, 512)
    out, ties = [], 0
    with torch.inference_mode():
        logits, _ = m.prefill(torch.tensor(ids), cache, 512)
        for step in range(new):
            top = logits.topk(2).values
            ties += int(top[0] == top[1])
            out.append(int(logits.argmax()))
            logits = m.forward(torch.tensor([out[-1]]), torch.tensor([prompt_len + step]), cache)[0][0]
    return out, ties


for head in ("bf16", "float32"):
    runs = {name: greedy(*how, head) for name, how in VARIANTS.items()}
    base_name, (base, _) = next(iter(runs.items()))
    for name, (out, ties) in runs.items():
        first = next((i for i, (x, y) in enumerate(zip(base, out)) if x != y), None)
        where = f"first differs at new token {first}" if first is not None else f"identical for {new} tokens"
        print(f"{head} logits, {name}: {where} (vs {base_name}); exact top-2 ties in {ties} of {new} steps",
              flush=True)
