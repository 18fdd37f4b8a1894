"""The decode step's draw in Triton kernels (--triton-kernels): what runtime.cuda_graphs' SAMPLED body runs
instead of sampling.transform and draw_rows, about 25 small kernels on a GPU (the penalty window's gather,
the ban, the penalty's scatter and choice, the temperature, min-p's softmax and threshold, the float64
softmax, its cumulative sum and the search), which took 0.24 ms of the H200's 4K AR step (session 51).

Here: 2 launches for a greedy draw, 3 for sampling, 4 with min-p. The row of V logits is cut into chunks
of SAMPLE_CHUNK tokens, one program a chunk: the first kernel writes the transformed logits and each chunk's
maximum, a second sums each chunk's softmax terms (min-p's, then the draw's float64 weights), and one
program picks the token (the first of the largest logit, or the first whose cumulative weight passes the
uniform times the total) and writes it to the history at its position.

It computes what the transform and the draw compute, as CUDA computes them: a tensor divided by a number
is a product with its reciprocal (the penalty, the temperature), softmax's terms are exp(x - max) over
their sum with an IEEE division, the draw's weights are float64. The sums run in another order than
torch's reductions, so a token whose probability bound (min-p's threshold) or cumulative weight lies
within rounding of the uniform's may differ: equal tokens in distribution, the same tokens but at such
boundaries (tests/test_triton_sampling.py; tests/test_cuda.py on a GPU). Top-k, top-p and eta keep the
torch transform (`sampling_fits`)."""

from __future__ import annotations

import torch

from ..config import SamplingConfig
from . import triton_kernels

# Tokens a program of the first two kernels takes; the picking program reads a chunk's worth at once.
SAMPLE_CHUNK = 1024
# Window ids (and banned ids) a program reads at once.
WINDOW_BLOCK = 256


def sampling_fits(sampling: SamplingConfig, dtype: torch.dtype) -> bool:
    """Whether `sample` draws for `sampling` from logits of `dtype`: float32 or float64 logits, and none of
    top-k, top-p and eta (the torch transform keeps those)."""
    return (dtype in (torch.float32, torch.float64) and sampling.top_k == 0 and sampling.top_p >= 1.0
            and sampling.eta == 0.0)


def sample_params(sampling: SamplingConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[4] in the logits' dtype on the device: the penalty, its reciprocal, the temperature's reciprocal and
    min-p, the numbers as CUDA's kernels take them (a number's reciprocal rounded in the tensor's dtype). Made
    once a binding, outside any capture."""
    one = torch.tensor(1.0, dtype=dtype)
    theta = torch.tensor(sampling.repetition_penalty, dtype=dtype)
    temperature = torch.tensor(sampling.temperature if not sampling.greedy else 1.0, dtype=dtype)
    return torch.stack([theta, one / theta, one / temperature, torch.tensor(sampling.min_p, dtype=dtype)]).to(device)


def sample(logits: torch.Tensor, history: torch.Tensor, position: torch.Tensor, sampling: SamplingConfig,
           params: torch.Tensor, banned: torch.Tensor | None, u: torch.Tensor | None,
           out: torch.Tensor) -> torch.Tensor:
    """Draw the token at `position` ([1] long on the device: its history index) from `logits` [V] (float32 or
    float64, contiguous) under `sampling` (where `sampling_fits`), with the penalty window read from `history`
    [C] long before the position and `u` ([1] float64, the uniform; None if greedy); write it to `out` [1] long
    and to history[position]. `params`: sample_params'; `banned`: the banned ids on the device (or None).
    -> out."""
    if logits.dim() != 1 or logits.stride(0) != 1 or not sampling_fits(sampling, logits.dtype):
        raise ValueError(f"sample: logits {tuple(logits.shape)} in {logits.dtype} must be one contiguous row of "
                         "float32 or float64, and the sampling without top-k, top-p and eta")
    if not sampling.greedy and u is None:
        raise ValueError("sample: a sampled draw needs its uniform u")
    vocab = logits.shape[0]
    parts = -(-vocab // SAMPLE_CHUNK)
    p_block = max(16, 1 << (parts - 1).bit_length())
    # A window past the history's capacity reaches nothing more: cut to it (the prepare kernel loops over the window,
    # 10**12 / WINDOW_BLOCK iterations a token for --penalty-window 10**12), as penalty_window's slice is.
    window = min(sampling.penalized_window, history.numel())
    n_banned = 0 if banned is None else banned.numel()
    scale = not sampling.greedy and sampling.temperature != 1.0
    prepared = bool(window or n_banned or scale)
    dev, acc = logits.device, logits.dtype
    scratch = torch.empty(vocab, dtype=acc, device=dev) if prepared else logits
    part_max = torch.empty(parts, dtype=acc, device=dev)
    part_arg = torch.empty(parts, dtype=torch.long, device=dev)
    part_sum = torch.empty(parts, dtype=acc, device=dev)
    part_weight = torch.empty(parts, dtype=torch.float64, device=dev)
    k = triton_kernels.kernels()
    accurate = triton_kernels.accurate(k)
    min_p = not sampling.greedy and sampling.min_p > 0.0
    common = {"CHUNK": SAMPLE_CHUNK, "num_warps": 4, "enable_fp_fusion": False}
    with triton_kernels.on(dev):
        k.sample_prepare_kernel[(parts,)](
            logits, history, position, banned if banned is not None else position, params, scratch, part_max,
            part_arg, vocab, window, n_banned, WBLOCK=WINDOW_BLOCK, PENALTY=window > 0, BAN=n_banned > 0,
            SCALE=scale, ACC=triton_kernels.acc(acc), **common)
        if not sampling.greedy:
            sums = {"P_BLOCK": p_block, "MIN_P": min_p, "ACCURATE": accurate, **common}
            if min_p:
                k.sample_sums_kernel[(parts,)](scratch, part_max, part_sum, part_weight, params, vocab, parts,
                                               WEIGHTS=False, **sums)
            k.sample_sums_kernel[(parts,)](scratch, part_max, part_sum, part_weight, params, vocab, parts,
                                           WEIGHTS=True, **sums)
        k.sample_pick_kernel[(1,)](
            scratch, part_max, part_arg, part_sum, part_weight, params, u if u is not None else params, history,
            position, out, vocab, parts, P_BLOCK=p_block, GREEDY=sampling.greedy, MIN_P=min_p, ACCURATE=accurate,
            **common)
    return out
