"""GGUF block types dequantized in torch, to the gguf package's float32 values bit for bit.

The same integer unpacking and the same float32 products and sums in the same order (most are
exact: a float16 scale times a 6-bit code times a 4-bit value fits float32's mantissa), run by
torch's kernels; tests/test_gguf_dequant.py compares every value with gguf-py on random blocks,
non-finite scales included. Only the types where this was faster than gguf-py's numpy (one
thread, session 47, `docs/scripts/dequant_speed.py`): rows of 576 values (the embedded model's)
Q4_0 and Q4_1 1.4-1.7x; rows of 4,096 (a 7-8B model's) Q4_0 and Q4_1 1.1-1.2x, Q4_K 1.3-1.4x,
Q5_K 1.0-1.3x (two runs on a noisy machine).
The embedded model's weights take 0.45 s instead of 0.8. Q8_0 ran at gguf-py's speed there with one thread, but a
load runs torch's threads while gguf-py's numpy runs one: on session 49's 2-core AMD EPYC the embedded model's Q8_0
token embeddings (28M values) took 0.06 s against gguf-py's 0.16, so Q8_0 is here too, and so is Q6_K (a Q4_K_M or
Q5_K_M file's output and some of its value and down projections): rows of 4,096, two threads 1.5-1.6x gguf-py, one
0.9-1.4x (`docs/scripts/dequant_speed.py 4096 THREADS`, three runs each). Q5_0 and Q5_1 were slower (0.7-0.9x, one
thread); they, and every other type, go through gguf-py. Each function takes a tensor's bytes ([..., bytes] uint8, a
view of the file) and returns [blocks, values] float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch

QK_K = 256  # values in a k-quant super-block


def _blocks(data: np.ndarray, block_bytes: int) -> torch.Tensor:
    """[blocks, block_bytes] uint8 over the file's read-only map (read, never written)."""
    with warnings.catch_warnings():  # torch warns that it cannot mark the read-only buffer read-only
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(data).view(np.uint8).reshape(-1)).view(-1, block_bytes)


def _halves(raw: torch.Tensor, at: int, size: int) -> torch.Tensor:
    """[blocks, size] float16 numbers stored at byte `at` of each block, as float32."""
    return raw[:, at: at + 2 * size].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor, run: int) -> torch.Tensor:
    """[blocks, n] uint8 -> [blocks, 2n] uint8: each run of `run` bytes gives its low nibbles, then its high ones
    (ggml's layout: a 32-value block's 16 bytes give values 0-15 then 16-31)."""
    chunks = packed.reshape(packed.shape[0], -1, 1, run)
    return torch.cat((chunks & 15, chunks >> 4), dim=2).reshape(packed.shape[0], -1)


def _bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """[blocks, n] uint8 -> [blocks, 8 / width, n] uint8: field k of every byte (bits k*width and up), in order."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8).view(1, -1, 1)
    return (packed.unsqueeze(1) >> shifts) & ((1 << width) - 1)


def q4_0(data: np.ndarray) -> torch.Tensor:  # float16 d, 16 bytes of nibbles: d * (q - 8)
    raw = _blocks(data, 18)
    return _nibbles(raw[:, 2:], 16).float().sub_(8).mul_(_halves(raw, 0, 1))


def q8_0(data: np.ndarray) -> torch.Tensor:  # float16 d, 32 signed bytes: d * q
    raw = _blocks(data, 34)
    return raw[:, 2:].view(torch.int8).float().mul_(_halves(raw, 0, 1))


def q4_1(data: np.ndarray) -> torch.Tensor:  # float16 d and m, 16 bytes of nibbles: d * q + m
    raw = _blocks(data, 20)
    scales = _halves(raw, 0, 2)
    return _nibbles(raw[:, 4:], 16).float().mul_(scales[:, :1]).add_(scales[:, 1:])


def _k_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: each of the 8 sub-blocks' scale and minimum, [blocks, 8, 1] float32 (d times its 6-bit scale,
    dmin times its 6-bit minimum), from float16 d, dmin and 12 bytes that pack the 6-bit numbers."""
    packed = raw[:, 4:16].reshape(-1, 3, 4)
    low, high, rest = packed[:, 0], packed[:, 1], packed[:, 2]
    scale = torch.cat((low & 63, (rest & 15) | ((low >> 2) & 48)), dim=1)
    minimum = torch.cat((high & 63, (rest >> 4) | ((high >> 2) & 48)), dim=1)
    d = _halves(raw, 0, 2)
    return (d[:, :1] * scale.float()).unsqueeze(2), (d[:, 1:] * minimum.float()).unsqueeze(2)


def q4_k(data: np.ndarray) -> torch.Tensor:  # d, dmin, 12 bytes of scales, 128 bytes of nibbles
    raw = _blocks(data, 144)
    scale, minimum = _k_scales(raw)
    q = _nibbles(raw[:, 16:], 32).view(-1, 8, 32).float()
    return q.mul_(scale).sub_(minimum).view(-1, QK_K)


def q5_k(data: np.ndarray) -> torch.Tensor:  # d, dmin, 12 bytes of scales, 32 bytes of high bits, 128 of nibbles
    raw = _blocks(data, 176)
    scale, minimum = _k_scales(raw)
    q = _nibbles(raw[:, 48:], 32).view(-1, 8, 32) | (_bits(raw[:, 16:48], 1) << 4)  # sub-block j: bit j
    return q.float().mul_(scale).sub_(minimum).view(-1, QK_K)


def q6_k(data: np.ndarray) -> torch.Tensor:  # 128 bytes of low nibbles, 64 of high bit pairs, 16 scales, d
    raw = _blocks(data, 210)
    low = _bits(raw[:, :128].reshape(-1, 64), 4).reshape(-1, 8, 32)  # each half's 64 bytes: low nibbles, then high
    high = _bits(raw[:, 128:192].reshape(-1, 32), 2).reshape(-1, 8, 32)  # each half's 32 bytes: four bit pairs
    q = (low | (high << 4)).view(torch.int8).sub_(32).view(-1, 16, 16).float()
    scale = _halves(raw, 208, 1) * raw[:, 192:208].view(torch.int8).float()  # [blocks, 16]: d times each scale
    return q.mul_(scale.unsqueeze(2)).view(-1, QK_K)


DEQUANTIZE: dict[str, Callable[[np.ndarray], torch.Tensor]] = {"Q4_0": q4_0, "Q4_1": q4_1, "Q8_0": q8_0, "Q4_K": q4_k,
                                                              "Q5_K": q5_k, "Q6_K": q6_k}
