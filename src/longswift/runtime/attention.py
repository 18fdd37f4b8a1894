"""Attention over the KV cache: one seam for decoding, prefill chunks and tree verification.

A forward writes its T new keys/values at cache slots [start, start + T) and then asks for
attention of the T queries over slots [0, start + T): every cached slot is visible, and among
the new tokens the [T, T] mask decides (causal for prefill chunks, the trie's ancestor mask for
verification). Backends are picked per device and shape:

- CPU: the kernels measured fastest on a 2-core CPU (grouped bmm; oneDNN per KV head beyond ~3K
  cached entries on the packed path; the cascade below, through the CPU's flash kernels, for masked
  forwards of 64+ tokens).
- CUDA: flash attention for decoding (the grouped-query bmm sends cuBLAS to a slow non-tensor-core
  kernel at long contexts), and the *cascade* for masked forwards: flash attention of all T*G
  query rows over the cached prefix (no mask), returning its log-sum-exp, plus attention over the T
  new entries under the [T, T] mask (the memory-efficient kernel with an additive [G*T, T] mask and
  its log-sum-exp; the CPU runs the same call through its flash kernel), merged by their
  log-sum-exps. No [G*T, S] mask is ever built.

Queries come grouped by KV head, `qg: [Hkv, G*T, D]` with row g*T + t (head g of the group,
token t), so each KV head's keys are read once and the query rows are independent."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# New tokens per masked forward from which the CPU path goes to the cascade (flash kernels with their
# log-sum-exp, the CPU's own), which never materialises the [G*T, S] scores: prefill chunks. Measured on a
# 2-core CPU, embedded model, a forward's best of 6 (docs/scripts/masked_forward_ab.py verify, session 36, each
# path twice): at 2K cached entries the cascade and the explicit products cost the same up to 32 tokens
# (100-113 ms at 32), the explicit less at 48 (151 against 175 ms), the cascade less from 64 (170-179 against
# 184-192 ms; 128 tokens 307-312 against 514-553); at 6K, against oneDNN, the same up to 16 tokens, the cascade
# slower at 32 (190-205 against 174 ms), mixed at 48, no worse at 64 (312-363 against 345-550 ms) and better at
# 128 (580-595 ms against 1,225-1,287 explicit). Tree verification (a few nodes on the CPU) keeps the explicit
# or oneDNN products. A 4,096-token prompt in chunks of 256: the cascade 9.30-9.36 s, SDPA with the [G*T, S]
# mask it replaced 9.57-9.58 s (session 35). The memory plan counts by this rule.
FUSED_FROM_TOKENS = 64

# The largest [Hkv, G*T, S] float32 scores a CPU forward under a mask computes explicitly; past it the cascade
# (flash kernels on blocks, no scores over the cache). A block over 32 MiB is mapped from the system and its
# pages faulted in anew at every allocation, every layer (glibc takes no larger mmap threshold; see
# runtime.memory.keep_freed_buffers): for the embedded model 32 rows past ~29K cached entries. At 32K a
# 32-row verify pass took 1,361 ms explicitly (277K page faults) and 1,134 ms through the cascade (session 47).
EXPLICIT_SCORES_BYTES = 32 << 20


def explicit_scores_fit(query_rows: int, entries: int) -> bool:
    """Whether a masked CPU forward's explicit [Hkv, G*T, S] float32 scores (`query_rows` = Hkv * G*T over `entries`
    cached entries) stay within EXPLICIT_SCORES_BYTES; past it Attention._kernel takes the cascade."""
    return query_rows * entries * 4 <= EXPLICIT_SCORES_BYTES


# The largest copy of a span of keys the cascade takes slot by slot (by_slot) at once; see prefix_in_spans.
BY_SLOT_SPAN_BYTES = 16 << 20

# Cached entries from which the packed CPU path leaves the grouped bmm for per-KV-head oneDNN
# products; measured on a 2-core CPU, the grouped bmm is faster below about 3K cached entries.
ONEDNN_FROM_ENTRIES = 3072
# The oneDNN path hands the cached keys and values to a linear as its "weight", so every key count is a
# new primitive shape (and, in a verify pass, every row count), and oneDNN's primitive cache and ideep's
# LRU cache (1024 entries each) kept ~0.43-0.6 MiB a shape: a decode run grew by ~440 MiB (and allocator
# holes) over 1K steps. The span it reads is rounded up (onednn_span) within the cache's rows, the slots
# past the end masked out: to a multiple of ONEDNN_SPAN up to 8K entries (at most 8% more keys read, at
# the 3K threshold), then of a step that doubles with the context, ONEDNN_SPANS_PER_DOUBLING spans from
# one power of two to the next (at most 1/16 more keys): ~80 shapes per row count to 100K entries, not ~380.
ONEDNN_SPAN = 256
ONEDNN_SPANS_PER_DOUBLING = 16


# ... and the CPU's bfloat16 and float16 products read the whole cache where the rounded span falls short of its
# rows by at most this many (and an eighth of the span): their bmm copies an operand whose batch stride is not its
# dense one (a span of a longer cache) before it multiplies, 1.5-1.9x the product's time (one layer of the
# embedded model, 3,072 keys: 105 us over the whole cache, 173 us over the same span of a cache of 3,079 rows;
# docs/benchmarks.md, session 44). A generation's last span then reads a contiguous operand whatever the cache's
# few rows past the run (TokenSwift's tree slots, the partial cache's root slot); float32's bmm reads either at
# full speed.
WHOLE_CACHE_SLACK = 128


def onednn_span(end: int) -> int:
    """The keys the oneDNN path reads for `end` cached entries (see ONEDNN_SPAN)."""
    step = max(ONEDNN_SPAN, (1 << (end.bit_length() - 1)) // ONEDNN_SPANS_PER_DOUBLING)
    return -(-end // step) * step

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def cuda_flash_fits(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether CUDA's flash kernels take queries of this device, dtype and head size: float16/bfloat16,
    head_dim a multiple of 8 up to 256. aten's flash forward (mha_fwd, mha_varlen_fwd in flash_api.cpp)
    refuses other head sizes with "head_size must be a multiple of 8, this is ensured by padding!": only
    the public F.scaled_dot_product_attention pads, and these paths call the ops directly."""
    return (device.type == "cuda" and dtype in FLASH_DTYPES and head_dim <= 256 and head_dim % 8 == 0
            and _flash_capable(device.index))


@functools.cache
def _flash_capable(index: int | None) -> bool:
    """Whether the CUDA device (None: the current one) runs torch's flash kernels, which need compute
    capability 8.0 (Ampere) or newer: on a V100 or T4 they raise "FlashAttention only supports Ampere GPUs
    or newer", and these paths then use explicit attention. True where CUDA is not available: a memory plan
    made elsewhere for a CUDA device (runtime.memory) assumes a current GPU."""
    if not torch.cuda.is_available():
        return True
    return torch.cuda.get_device_capability(index) >= (8, 0)


def by_slot(keys: torch.Tensor) -> torch.Tensor:
    """Keys as the flash kernels take them, slot by slot: a copy of keys stored slot-innermost
    (runtime.cache.transposed_keys: the CPU's caches, and CUDA step bodies run on them in the tests). The CPU's
    flash kernel misreads such a view rather than refusing it (off by 0.2 in a float64 check)."""
    return keys if keys.stride(-1) == 1 else keys.contiguous()


def flash_with_lse(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of every row over every key, with each row's log-sum-exp of the scaled
    scores. qg: [Hkv, R, D], keys/values: [Hkv, S, D] -> out [Hkv, R, D] (q's dtype), lse [Hkv, R] (float32,
    float64 for float64).
    Flash kernels where the device has one for the dtype (CUDA: float16/bfloat16; CPU: any), else
    explicit products in float32 or better."""
    keys = by_slot(keys)
    if qg.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qg[None], keys[None], values[None], 0.0, False, scale=scale)[:2]
        return out[0], lse[0]
    if cuda_flash_fits(qg.device, qg.dtype, qg.shape[-1]):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            qg[None], keys[None], values[None], 0.0, False, False, scale=scale)[:2]
        return out[0], lse[0]
    return explicit_with_lse(qg, keys, values, scale, None)


def explicit_with_lse(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                      allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit attention in float32 (float64 for float64 inputs) with an optional bool mask.
    qg: [Hkv, R, D], keys/values: [Hkv, S, D], allowed: [R, S] or [Hkv, R, S] bool ->
    out [Hkv, R, D] in the accumulation dtype, lse [Hkv, R]. A fully masked row gets lse -inf and out 0."""
    acc = torch.promote_types(qg.dtype, torch.float32)
    scores = torch.bmm(qg.to(acc), keys.to(acc).transpose(1, 2)).mul_(scale)  # [Hkv, R, S]
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [Hkv, R]
    probs = torch.exp(scores - lse.unsqueeze(-1).clamp_min(torch.finfo(acc).min))  # a masked row: exp(-inf) = 0
    return torch.bmm(probs, values.to(acc)), lse


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each part's output and log-sum-exp.
    out_*: [Hkv, R, D], lse_*: [Hkv, R] -> [Hkv, R, D] in the accumulation dtype.
    Part a's share of the softmax mass, exp(lse_a) / (exp(lse_a) + exp(lse_b)), is sigmoid(lse_a - lse_b),
    and the result out_b + share * (out_a - out_b) is one lerp: three kernels where the exp form takes eleven
    (on CUDA each is a launch, per layer of every verify pass). A part with lse -inf gets no weight."""
    acc = torch.promote_types(torch.promote_types(out_a.dtype, out_b.dtype), torch.float32)
    share = torch.sigmoid(lse_a.to(acc) - lse_b.to(acc)).unsqueeze(-1)  # [Hkv, R, 1]
    return torch.lerp(out_b.to(acc), out_a.to(acc), share)


# Elements each row of an additive mask is padded to in memory: CUDA's memory-efficient kernel reads the
# bias in aligned vectors and refuses a row stride that is not a multiple of its alignment (8 elements
# for 16-bit types; the torch.nn.functional entry point pads the same way before calling it).
MASK_ALIGN = 16


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, group: int = 1) -> torch.Tensor:
    """bool [T, S] (True: visible) -> the additive mask [G*T, S] in `dtype`, the rows repeated for each of the
    `group` query heads of a key head (row g*T + t): 0 where visible, -inf elsewhere, in storage whose rows are
    padded to a multiple of MASK_ALIGN elements. Built once per forward, not per layer, and without [G*T, S]
    temporaries (a repeated bool mask and its inverse, two of them at once, held a 10,000-token prefill chunk's
    mask 1.5 times what the memory plan counts)."""
    rows, width = allowed.shape
    padded = -(-width // MASK_ALIGN) * MASK_ALIGN
    bias = torch.zeros(group * rows, padded, dtype=dtype, device=allowed.device)[:, :width]
    bias.view(group, rows, width).masked_fill_(~allowed, float("-inf"))  # [T, S] broadcast over the group
    return bias


def masked_with_lse(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of every row over the keys under an additive mask, with each row's log-sum-exp, in
    one fused kernel where the device has one for the dtype. Every row must see at least one key (a
    tree node sees itself, a padded row too): for a fully masked row the fused kernels do not give
    explicit attention's lse -inf and zero output (the CPU's gives lse 0), which the merge needs.
    qg: [Hkv, R, D], keys/values: [Hkv, S, D], bias: [R, S] (additive_mask; None: every key visible, a decoding
    token's, which a forced cascade passes) -> out [Hkv, R, D] (q's dtype, or the accumulation dtype where
    explicit), lse [Hkv, R] (float32, float64 for float64).
    CPU: the flash kernel with attn_mask. CUDA, float16/bfloat16: the memory-efficient kernel with the
    bias broadcast over the KV heads (compute_log_sumexp; one launch where explicit products, the mask,
    the log-sum-exp and the softmax took about fifteen). Elsewhere: explicit products."""
    hkv, rows, d = qg.shape
    keys = by_slot(keys)
    if qg.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qg[None], keys[None], values[None], 0.0, False, attn_mask=bias, scale=scale)[:2]
        return out[0], lse[0]
    if cuda_flash_fits(qg.device, qg.dtype, d):
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            qg[None], keys[None], values[None], None if bias is None else bias.expand(1, hkv, rows, bias.shape[-1]),
            True, 0.0, False, scale=scale)[:2]
        return out[0], lse[0, :, :rows]  # the kernel pads its lse rows to a multiple of 32
    return explicit_with_lse(qg, keys, values, scale, None if bias is None else bias == 0)


def cascade(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, bias: torch.Tensor | None,
            scale: float) -> torch.Tensor:
    """Masked attention split at `start`: slots [0, start) are visible to every row (flash with
    log-sum-exp), slots [start, S) under the additive mask `bias` [R, S - start] (additive_mask;
    masked_with_lse; None: every slot visible); merged. qg: [Hkv, R, D], keys/values: [Hkv, S, D] -> [Hkv, R, D]
    in q's dtype."""
    out_t, lse_t = masked_with_lse(qg, keys[:, start:], values[:, start:], bias, scale)
    if start == 0:
        return out_t.to(qg.dtype)
    out_p, lse_p = prefix_in_spans(qg, keys[:, :start], values[:, :start], scale)
    return merge(out_p, lse_p, out_t, lse_t).to(qg.dtype)


def prefix_in_spans(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_with_lse over every key, where keys stored by dimension (the CPU's caches) are copied slot by
    slot (by_slot) a span at a time, each copy at most BY_SLOT_SPAN_BYTES, the spans merged by log-sum-exp:
    a layer's whole copy (77 MB at 100K cached entries of the embedded model) was mapped from the system and
    faulted in at every layer (runtime.memory.keep_freed_buffers). -> out [Hkv, R, D], lse [Hkv, R]."""
    per_slot = keys.shape[0] * keys.shape[2] * keys.element_size()
    span = max(1, BY_SLOT_SPAN_BYTES // per_slot)
    if keys.stride(-1) == 1 or keys.shape[1] <= span:
        return flash_with_lse(qg, keys, values, scale)
    out, lse = flash_with_lse(qg, keys[:, :span], values[:, :span], scale)
    for a in range(span, keys.shape[1], span):
        out_b, lse_b = flash_with_lse(qg, keys[:, a: a + span], values[:, a: a + span], scale)
        out, lse = merge(out, lse, out_b, lse_b), torch.logaddexp(lse, lse_b)
    return out, lse


def bucketed(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, end: int,
             visible: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention in shapes fixed per bucket, so that a CUDA graph can replay it while the cache
    grows: flash over the whole buckets [0, start), masked attention over the slots [start, end) that
    the additive mask `visible` [R, end - start] allows (it is computed on the device); merged.
    qg: [Hkv, R, D], keys/values: the cache's rows [Hkv, C, D] -> [Hkv, R, D] in q's dtype."""
    return cascade(qg, keys[:, :end], values[:, :end], start, visible, scale)


@functools.cache
def varlen_features() -> frozenset[str]:
    """Which of flash's variable-length options this torch's `aten._flash_attention_forward` takes that
    the length path needs: `seqused_k` (the cached length read from device memory), read from the op's
    schema once per process (the lent GPU machine has had an older torch than the CPU one here)."""
    schema = torch.ops.aten._flash_attention_forward.default._schema
    return frozenset(a.name for a in schema.arguments) & {"seqused_k"}


def length_unsupported(device: torch.device) -> str | None:
    """Why --graph-attention length cannot run on this device with this torch, or None if it can."""
    if device.type == "cuda" and "seqused_k" not in varlen_features():
        return (f"--graph-attention length needs flash attention's seqused_k, which torch {torch.__version__} "
                "lacks: use --graph-attention bucketed, or --triton-kernels (its attention reads the length itself, "
                "for heads up to 128 wide and not in float64)")
    return None


@dataclass
class KeySpan:
    """The cached keys a step attends over when their count lives in device memory: slots [0, used)
    of a fixed span of the cache (`used` [1] int32 on the device; the span is the keys passed), with
    the index tensors flash's variable-length kernel reads, built once per forward rather than per layer."""

    used: torch.Tensor  # [1] int32
    cu_q: torch.Tensor  # [2] int32: [0, 1], one query token (see prefix_with_lse)
    cu_k: torch.Tensor  # [2] int32: [0, span]


def key_span(used: torch.Tensor, span: int) -> KeySpan:
    """used: [1] long or int32 on the device, the cache slots to read (the step's first slot; for a
    single token, whose key is written first, one more)."""
    steps = torch.arange(2, dtype=torch.int32, device=used.device)
    return KeySpan(used.to(torch.int32), steps, steps * span)


def prefix_with_lse(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ks: KeySpan,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of every row over the first `ks.used` keys, a count read from device
    memory, so that one CUDA graph serves every cached length up to the span.
    qg: [Hkv, R, D], keys/values: the cache's first span slots [Hkv, S, D] -> out [Hkv, R, D],
    lse [Hkv, R] (-inf with out 0 for none used).
    CUDA, float16/bfloat16: flash attention's variable-length kernel (`aten._flash_attention_forward`,
    what torch.nn.attention.varlen wraps), which stops at `seqused_k`. Elsewhere: explicit products
    over the span, the slots from `used` on masked out (how the CPU tests run the same bodies)."""
    flash = cuda_flash_fits(qg.device, qg.dtype, qg.shape[-1])
    out, lse = _used_prefix(qg, keys, values, ks, scale, flash)
    if flash:
        # A row with no keys (nothing cached) gets lse +inf from flash (softmax.h), which would take all
        # the merge's weight; explicit attention's convention is -inf (no weight). One kernel, not two.
        lse = torch.nan_to_num(lse, nan=float("nan"), posinf=float("-inf"), neginf=float("-inf"))
    return out, lse


def prefix_attention(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ks: KeySpan,
                     scale: float) -> torch.Tensor:
    """prefix_with_lse's output alone, for a single decoding token: its own key is among the used
    slots, so no row is empty, and nothing is merged, so the log-sum-exp needs no fixing (a kernel
    fewer a layer of every decode step). -> [Hkv, R, D] in q's dtype."""
    return _used_prefix(qg, keys, values, ks, scale, cuda_flash_fits(qg.device, qg.dtype, qg.shape[-1]))[0].to(qg.dtype)


def _used_prefix(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ks: KeySpan,
                 scale: float, flash: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """prefix_with_lse before the empty rows' lse is fixed (flash gives them +inf); `flash`: the
    caller's cuda_flash_fits for qg."""
    span = keys.shape[1]
    if flash:
        hkv, rows, d = qg.shape
        # The R rows go as ONE query token of Hkv*R heads (head h reads KV head h // R). For a single query
        # token with more heads than KV heads, mha_varlen_fwd swaps the groups back into R query rows per KV
        # head ("seqlenq_ngroups_swapped": each KV head's keys read once for all its rows) and plans a split
        # of the keys across thread blocks; R query tokens of Hkv heads, as before, ran one thread block per
        # KV head over the whole span (H100, 8B shape, 100K context: 89 ms of attention a step against 4.8 ms).
        # The swap needs at least two rows: a lone row (one decoding token without GQA) goes twice.
        q = (qg if rows > 1 else qg.expand(hkv, 2, d)).reshape(1, -1, d)  # [1, Hkv*R', D]
        out, lse = torch.ops.aten._flash_attention_forward(
            q, keys.transpose(0, 1), values.transpose(0, 1), ks.cu_q, ks.cu_k, 1, span, 0.0, False, False,
            scale=scale, seqused_k=ks.used)[:2]  # keys/values: [S, Hkv, D] views of the cache
        out = out.reshape(hkv, -1, d)[:, :rows]  # [1, Hkv*R', D], heads kv-major -> [Hkv, R, D]
        return out, lse.reshape(hkv, -1)[:, :rows]  # [Hkv*R', 1], kv-major -> [Hkv, R]
    allowed = torch.arange(span, device=qg.device) < ks.used  # [S]: the slots in use
    return explicit_with_lse(qg, keys, values, scale, allowed[None])


def by_length(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ks: KeySpan,
              new_keys: torch.Tensor, new_values: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """The cascade with the cached length read from device memory: every row over the cache's first
    `ks.used` slots (prefix_with_lse), and over the step's T new keys/values [Hkv, T, D] under the
    additive mask `bias` [R, T] (additive_mask; masked_with_lse); merged. keys/values: the cache's
    first span slots [Hkv, S, D]. -> [Hkv, R, D] in q's dtype."""
    out_p, lse_p = prefix_with_lse(qg, keys, values, ks, scale)
    out_t, lse_t = masked_with_lse(qg, new_keys, new_values, bias, scale)
    return merge(out_p, lse_p, out_t, lse_t).to(qg.dtype)


@dataclass
class Masks:
    """What one forward's attention needs besides the cache: T new tokens at slots [start, start + T) and
    their [T, T] visibility (None for a single decoding token), as the additive [G*T, T] mask of query row
    g*T + t over the new entries (additive_mask), built once per forward. Every cached slot before `start`
    is visible to every row, so no backend needs a [G*T, S] mask."""

    t: int
    start: int
    new: torch.Tensor | None  # [T, T] bool
    rows: torch.Tensor | None = None  # [G*T, T] additive, rows g*T + t

    @property
    def end(self) -> int:
        return self.start + self.t


class Attention:
    """attend(qg, keys, values, masks) -> [Hkv, R, D]: the backend for one model (device, dtype,
    packed weights). `kernel` forces one path ("explicit", "onednn", "flash", "cascade")
    for tests; None picks by device and shape. (The generation loops' CUDA steps go through
    runtime.cuda_graphs, whose bodies use `bucketed` or `by_length`.)"""

    def __init__(self, device: torch.device, dtype: torch.dtype, scale: float, packed: bool,
                 kernel: str | None = None) -> None:
        self.device, self.dtype, self.scale, self.packed = device, dtype, scale, packed
        self.acc_dtype = torch.promote_types(dtype, torch.float32)
        self.kernel = kernel
        self.fused_from_tokens = FUSED_FROM_TOKENS
        self.onednn_from = ONEDNN_FROM_ENTRIES
        # The CPU's bfloat16 bmm copies a transposed operand before it multiplies: q @ keys^T copied the whole
        # [Hkv, D, S] key span every layer of every step (a 2K-context decode step of the embedded model: 10 of
        # its 42 ms). keys @ q^T reads the cache as it lies, and its [Hkv, S, R] scores are read transposed
        # (docs/scripts/cpu_attention_layouts.py, one layer of 3 KV heads: 429 -> 224 us at 2K entries, 1,754 ->
        # 710 at 8K for a decoding token, 664 -> 519 for 21 rows at 2K; float32 is faster the other way round,
        # float16 the same either way; a decode step at 2K context 42 -> 35 ms: docs/benchmarks.md, session 37).
        # Since session 41 the CPU's bfloat16 caches store keys by dimension (runtime.cache.transposed_keys), where
        # q @ K^T copies nothing and is faster still; keys @ q^T serves keys stored by slot (float16's too, since
        # session 42). The CPU's bfloat16 and float16 bmm run on oneDNN, which keeps a primitive per shape
        # (float16: 260-320 MiB over 400 key counts of one layer's product), so their products read a rounded
        # span (onednn_span), a shape per span, or the whole cache near its end (_rounded_span).
        self.rounded_spans = device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)

    def _kernel(self, m: Masks, query_rows: int) -> str:
        """The path for this forward of `query_rows` (Hkv * G*T) query rows: the forced one, else by device and
        shape (thresholds measured; on the CPU the cascade also where explicit scores would pass
        EXPLICIT_SCORES_BYTES: such a block is mapped from the system and faulted in every layer)."""
        if self.kernel is not None:
            return self.kernel
        if self.device.type == "cuda":
            return "flash" if m.new is None else "cascade"
        if m.new is not None and (m.t >= self.fused_from_tokens or not explicit_scores_fit(query_rows, m.end)):
            return "cascade"
        return "onednn" if self.packed and m.end >= self.onednn_from else "explicit"

    def masks(self, t: int, start: int, group: int, tree_mask: torch.Tensor | None) -> Masks:
        """Per-forward mask state for T tokens written at slots [start, start + T): causal among
        them unless `tree_mask` [T, T] is given."""
        if t == 1 and tree_mask is None:
            return Masks(1, start, None)
        if tree_mask is None:
            new = torch.ones(t, t, dtype=torch.bool, device=self.device).tril_()  # [T, T] causal
        else:
            if tree_mask.shape != (t, t):
                raise ValueError(f"tree_mask must be [{t}, {t}], got {list(tree_mask.shape)}")
            new = tree_mask.to(device=self.device, dtype=torch.bool)
        return Masks(t, start, new, additive_mask(new, self.dtype, group))  # once per forward

    def attend(self, qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, m: Masks) -> torch.Tensor:
        """qg: [Hkv, R, D] with R = G*T; keys/values: the cache rows [Hkv, C, D] with the T new entries
        written at [start, start + T) (C >= start + T) -> [Hkv, R, D]."""
        kernel = self._kernel(m, qg.shape[0] * qg.shape[1])
        if kernel in ("cascade", "flash"):
            keys, values = keys[:, : m.end], values[:, : m.end]  # [Hkv, S, D]
            if kernel == "flash" and m.new is None:
                return flash_with_lse(qg, keys, values, self.scale)[0].to(qg.dtype)
            return cascade(qg, keys, values, m.start, m.rows, self.scale)
        # oneDNN keeps a primitive per shape (the CPU's bfloat16 and float16 bmm run on it too: rounded_spans), so
        # its products read a span rounded up (onednn_span; bfloat16 and float16 the whole cache near its end:
        # _rounded_span), the slots past the end (zeros or stale entries: finite) masked out, a shape per span.
        rounded = kernel == "onednn" or self.rounded_spans
        if keys.stride(-1) != 1 or not rounded:  # keys stored by dimension (cache.transposed_keys), or plain bmm
            return self._query_first(qg, keys, values, m, rounded, kernel == "onednn")
        span = self._rounded_span(m.end, keys.shape[1])  # keys stored by slot, read by oneDNN
        keys, values = keys[:, :span], values[:, :span]  # [Hkv, S', D], S' >= S
        if kernel == "onednn":
            return self._onednn(qg, keys, values, m)
        scores = self._keys_first_scores(qg, keys, m.end)  # [Hkv, R, S']
        if m.rows is not None:
            scores[:, :, m.start : m.end] += m.rows  # the new entries' [G*T, T] mask; cached slots all visible
        probs = torch.softmax(scores, dim=-1, dtype=self.acc_dtype).to(self.dtype)
        return torch.bmm(probs, values)  # [Hkv, R, D]

    def _query_first(self, qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, m: Masks,
                     rounded: bool, onednn: bool) -> torch.Tensor:
        """Attention with the scores as q @ K^T. Over keys stored by dimension (keys [Hkv, C, D] a view of
        [Hkv, D, C]) K^T is a row-major [D, S] operand whose rows the GEMM streams near memory speed (q @ K^T
        over [S, D] rows, or K @ q^T, ran at 1/2-2/3 of it on the CPU: docs/benchmarks.md, session 41); over keys
        stored by slot it is float32's grouped bmm below the oneDNN threshold. `rounded`: both products read a
        span rounded up (_rounded_span), the slots past the end masked to weigh exactly 0, so that oneDNN (the
        packed path's products; the CPU's bfloat16 and float16 bmm) sees a shape per span, not per length.
        `onednn`: past ONEDNN_FROM_ENTRIES, P @ V as oneDNN's per-KV-head products."""
        end = m.end
        span = self._rounded_span(end, keys.shape[1]) if rounded else end
        scores = torch.bmm(qg, keys[:, :span].transpose(1, 2)).mul_(self.scale)  # [Hkv, R, S']
        if m.rows is not None:
            scores[:, :, m.start : end] += m.rows  # the new entries' [G*T, T] mask; cached slots all visible
        if span > end:
            scores[:, :, end:] = float("-inf")
        probs = torch.softmax(scores, dim=-1, dtype=self.acc_dtype).to(self.dtype)
        if onednn:
            op = torch.ops.mkldnn._linear_pointwise
            return torch.stack([op(probs[i], values[i, :span].t(), None, "none", [], "") for i in range(qg.shape[0])])
        return torch.bmm(probs, values[:, :span])  # [Hkv, R, D]

    def _rounded_span(self, end: int, rows: int) -> int:
        """The keys a rounded product reads for `end` cached entries of a cache of `rows` rows: onednn_span, or all
        the rows where that falls short of them by at most WHOLE_CACHE_SLACK and an eighth of itself (bfloat16
        and float16)."""
        span = min(rows, onednn_span(end))
        return rows if self.rounded_spans and rows - span <= min(WHOLE_CACHE_SLACK, span // 8) else span

    def _keys_first_scores(self, qg: torch.Tensor, keys: torch.Tensor, end: int) -> torch.Tensor:
        """Scaled scores [Hkv, R, S'] as keys @ q^T read transposed (the cache rows as the product's M), the
        slots from `end` on (past the cache's length) -inf. qg: [Hkv, R, D], keys: [Hkv, S', D]."""
        scores = torch.bmm(keys, qg.transpose(1, 2)).transpose(1, 2).mul_(self.scale)  # [Hkv, R, S'] (strided)
        scores[:, :, end:] = float("-inf")
        return scores

    def _onednn(self, qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, m: Masks) -> torch.Tensor:
        """keys/values: [Hkv, S', D] whose slots [m.end, S') lie past the cache's length (zeros or stale
        entries: finite), masked to -inf, so that they weigh exactly 0."""
        op = torch.ops.mkldnn._linear_pointwise
        end = m.end
        if m.rows is None:
            # Decoding: MKL's GEMM with the cache rows as M streams K near bandwidth, and
            # oneDNN reads V for the few-row P @ V product faster than batched GEMM (2-core
            # CPU, embedded model at 6.6K context: a decode step 30.7 -> 29.1 ms against
            # oneDNN for both products; with a tree mask the transposed scores cost more).
            probs = torch.softmax(self._keys_first_scores(qg, keys, end), dim=-1, dtype=self.acc_dtype).to(self.dtype)
            return torch.stack([op(probs[i], values[i].t(), None, "none", [], "") for i in range(qg.shape[0])])
        # oneDNN matmuls per KV head read a long (strided) cache faster than MKL's batched
        # GEMM for these few-row products (30 layers at 6.6K context: 13 ms vs 17 ms).
        outs = []
        for i in range(qg.shape[0]):
            scores = op(qg[i] * self.scale, keys[i], None, "none", [], "")  # [R, S']
            scores[:, m.start:end] += m.rows  # [G*T, T]: the new entries' mask
            scores[:, end:] = float("-inf")
            probs = torch.softmax(scores, dim=-1, dtype=self.acc_dtype).to(self.dtype)
            outs.append(op(probs, values[i].t(), None, "none", [], ""))  # [R, D]
        return torch.stack(outs)
