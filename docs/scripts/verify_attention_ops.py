"""Count the aten ops that launch work in one layer's attention over a verify pass's new entries and
its log-sum-exp merge (runtime.attention), as the code runs now and as it ran before session 29
(explicit products, the mask, logsumexp, softmax, and the exp-form merge).

On a GPU each such op is at least one kernel launch, per layer of every verify pass; views, reshapes
and dtype queries launch nothing and are not counted. The count is taken on the CPU, where the fused
call is the flash kernel with an additive mask; on CUDA the same call is the memory-efficient kernel
(one launch as well). It says nothing about time: that needs a GPU (bench-steps' verify costs).

    python docs/scripts/verify_attention_ops.py [nodes] [group]
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from longswift.runtime.attention import additive_mask, explicit_with_lse, flash_with_lse, masked_with_lse, merge

NO_WORK = ("view", "_unsafe_view", "unsqueeze", "slice", "expand", "transpose", "t", "select", "alias",
           "detach", "reshape", "as_strided", "squeeze", "promote_types")


class Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.removeprefix("aten::")
        if name not in NO_WORK:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def merge_before(out_a, lse_a, out_b, lse_b):
    """The merge as it was before session 29: exp(lse_x - logaddexp(lse_a, lse_b)) weights."""
    acc = torch.promote_types(torch.promote_types(out_a.dtype, out_b.dtype), torch.float32)
    lse_a, lse_b = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(lse_a, lse_b)
    return (torch.exp(lse_a - lse).unsqueeze(-1) * out_a.to(acc)
            + torch.exp(lse_b - lse).unsqueeze(-1) * out_b.to(acc))


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    group = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    hkv, d, cached, dt = 8, 128, 4096, torch.bfloat16  # Llama-3.1-8B's attention shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(hkv, group * nodes, d, generator=g).to(dt)
    keys, values = torch.randn(hkv, cached, d, generator=g).to(dt), torch.randn(hkv, cached, d, generator=g).to(dt)
    new_k, new_v = torch.randn(hkv, nodes, d, generator=g).to(dt), torch.randn(hkv, nodes, d, generator=g).to(dt)
    rows = torch.ones(nodes, nodes, dtype=torch.bool).tril_().repeat(group, 1)  # [G*T, T]
    bias = additive_mask(rows, dt)  # once per forward, not per layer: not counted
    out_p, lse_p = flash_with_lse(q, keys, values, d**-0.5)  # the cached prefix: one flash call either way
    with Ops() as now:
        out_t, lse_t = masked_with_lse(q, new_k, new_v, bias, d**-0.5)
        got = merge(out_p, lse_p, out_t, lse_t).to(dt)
    with Ops() as before:
        out_t, lse_t = explicit_with_lse(q, new_k, new_v, d**-0.5, rows)
        want = merge_before(out_p, lse_p, out_t, lse_t).to(dt)
    print(f"{nodes} nodes, group {group}, bf16, one layer: the new entries' attention and the merge")
    print(f"  now:    {len(now.names):2d} ops  {' '.join(now.names)}")
    print(f"  before: {len(before.names):2d} ops  {' '.join(before.names)}")
    print(f"  largest difference of the results: {(got.float() - want.float()).abs().max().item():.2e} (bf16 rounding)")


if __name__ == "__main__":
    main()
