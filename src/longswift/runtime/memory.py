"""Memory and context planning: what a run needs, what the device has, a refusal that says what to
change, and the allocation of a run's full KV cache once its plan fits."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import MAX_ROPE_FACTOR, GenerationConfig, ModelConfig, flag_name, parse_rope_scaling
from ..errors import ConfigError, LongswiftError
from . import attention
from .attention import BY_SLOT_SPAN_BYTES, FUSED_FROM_TOKENS, cuda_flash_fits
from .cache import FullKVCache
from .cuda_graphs import BUCKET, padded_nodes
from .linear import float32_head_copy, float32_head_packed
from .model import Transformer

GiB = 1024**3


def size_text(n: int | float) -> str:
    """Bytes in a message: GiB to two decimals, or MiB (KiB) where that would read 0.00 GiB (a tiny model's plan,
    a machine with next to nothing free): only nothing reads 0.00 GiB."""
    if n == 0 or abs(n) >= 0.005 * GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 0.05 * 2**20 else f"{n / 1024:.1f} KiB"
# Transient bytes per logit when a block of rows [R, V] is transformed and drawn (sampling.transform,
# draw_rows), beyond the logits themselves: the float32 copy and masks, top-p's sorted values and
# int64 order, the draw's float64 softmax and cdf. Live bytes peak at about 20 on the CPU under the
# paper's sampling, top-p and eta alike (top-p sorts values only there; tests/test_walk_memory.py,
# measured 20.2 in session 21); the margin is for the GPU's full sort with its int64 order, its workspace
# and allocator rounding (tests/test_cuda.py checks the CUDA allocator's peak against it).
SAMPLING_BYTES_PER_LOGIT = 64


def sampling_bytes(vocab: int, rows: int, logit_elem: int) -> int:
    """Bytes of `rows` rows of logits (`logit_elem` bytes each) and of their transform and draw."""
    return rows * vocab * (logit_elem + SAMPLING_BYTES_PER_LOGIT)


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new allocations on `device`, or None if it cannot be read."""
    if device.type == "cuda":
        driver_free, _total = torch.cuda.mem_get_info(device)
        # torch's caching allocator keeps what a finished run freed reserved, which the driver counts as used: a
        # second run on the same engine (a bench grid's next cell) was refused memory this process already holds
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(driver_free) + max(0, int(cached))
    free: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    limited = cgroup_free()  # (a container's memory limit: the machine's free memory is not this process's)
    return limited if free is None else free if limited is None else min(free, limited)


NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as the largest page-aligned 63-bit number


def cgroup_free(root: Path = Path("/sys/fs/cgroup"), cgroups: Path = Path("/proc/self/cgroup")) -> int | None:
    """Bytes this process's memory cgroup, and each one above it, still lets it allocate: the limit less the usage,
    page cache the kernel can drop (inactive files) not counted as used; None where no limit is set or none can be
    read. cgroup v2 (memory.max) and v1 (memory.limit_in_bytes); a container's own cgroup is where it is mounted,
    at `root`, whatever /proc/self/cgroup names. A run that fit the machine's free memory but not a container's
    limit (docker --memory, a Kubernetes pod's) was killed for memory, the plan having let it start."""
    try:
        lines = cgroups.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one hierarchy
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        where = base / path.lstrip("/")
        for directory in dict.fromkeys([where, *where.parents, base]):  # (the process's cgroup up to the mount's)
            if directory.is_relative_to(base) and (room := _cgroup_room(directory, *files)) is not None:
                found.append(room)
    return min(found) if found else None


def _cgroup_room(directory: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit_text = (directory / limit_file).read_text().strip()
        if limit_text == "max" or int(limit_text) >= NO_LIMIT:
            return None
        used = int((directory / usage_file).read_text())
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines() if " " in line)
    except (OSError, ValueError):
        return None
    return max(0, int(limit_text) - used + int(stat.get(inactive_key, 0)))


def current_rss() -> int:
    """Resident set size of this process in bytes (Linux /proc; elsewhere the getrusage high-water mark)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource  # (Unix only)

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def return_freed_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim); False where there is
    none to call. Loading frees what it converted (GGUF blocks, the weights packing replaced) in
    pieces too small for the allocator to give back on its own: a run of the embedded model then holds
    40-95 MiB less resident memory (measured in session 34 by docs/scripts/rss_curve.py and with the
    API alone after a load)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: libc's, without looking for its file
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False
    trim(0)
    return True


# glibc's mallopt parameters (malloc.h) and what longswift sets them to: see keep_freed_buffers.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_FROM_BYTES = 32 << 20  # glibc's largest mmap threshold on 64 bits (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_FROM_BYTES = 128 << 20


def keep_freed_buffers() -> bool:
    """Have the C heap keep freed buffers up to 32 MiB for the next allocation, rather than map them
    from the system anew each time (glibc's mallopt; False where there is none to call).

    A CPU forward's temporaries are allocated and freed once a layer: a verify pass's attention
    scores and probabilities are [Hkv, G*T, S] floats, 9.4 MB each for 32 rows at 8K cached entries
    of the embedded model. glibc maps a block that large from the system (its mmap threshold had
    only grown to a few MB), and the system zeroes every page on first touch: 138K page faults a
    32-row pass at 8K, 270K at 16K, half of the pass's time (8K: 515 -> 294 ms; 16K: 956 -> 489 ms;
    session 47, docs/benchmarks.md). Blocks up to MMAP_FROM_BYTES now come from the heap, and
    freed memory at its top goes back to the system only past TRIM_FROM_BYTES, so a run holds up to
    that much more than it uses at a time. Blocks over 32 MiB are still mapped each time (glibc
    takes no larger threshold): attention's scores never grow that large (attention.EXPLICIT_SCORES_BYTES
    sends such a forward to the cascade, which copies keys a span at a time)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_FROM_BYTES))


def _api_name(field: str) -> str:
    """A setting as the Python API spells it (MemoryPlan.check's advice; flag_name spells it as the flags do)."""
    return field


@dataclass
class MemoryPlan:
    """Bytes a run needs: weights, the full KV cache, and the largest transient buffers."""

    weights: int
    packed_weights: int
    kv_cache: int
    workspace: int
    capacity_tokens: int
    device: str
    draft_cache: int = 0  # TokenSwift: the draft pass's partial KV cache
    draft_tokens: int = 0
    tree_nodes: int = 0  # TokenSwift: the largest verify pass
    prefill_chunk: int = 0  # a prefill chunk past the default whose forward the workspace is planned for (0: none)
    # What building the model holds beside its weights at the peak, before the caches exist (loading_bytes): a
    # packed copy made while its original lives, a concatenation while its parts do
    loading: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.packed_weights + self.kv_cache + self.draft_cache + self.workspace

    @property
    def after_weights(self) -> int:
        """The caches and the workspace: what a run allocates once its model is built."""
        return self.kv_cache + self.draft_cache + self.workspace

    def describe(self) -> str:
        draft = (f" + draft KV cache {size_text(self.draft_cache)} ({self.draft_tokens} tokens)"
                 if self.draft_tokens else "")
        return (
            f"weights {size_text(self.weights)} + weight copies {size_text(self.packed_weights)} "
            f"+ KV cache {size_text(self.kv_cache)} "
            f"({self.capacity_tokens} tokens){draft} + workspace {size_text(self.workspace)} "
            f"= {size_text(self.total)} on {self.device}"
            + (f", and building the model holds {size_text(self.loading)} beside its weights"
               if self.loading > self.after_weights else "")
        )

    def needed(self, weights_loaded: bool) -> int:
        """The bytes the run still has to allocate: weights already resident are not counted again; before they
        are, what building the model holds beside them where that exceeds the caches and workspace."""
        if weights_loaded:
            return self.after_weights
        return self.weights + self.packed_weights + max(self.loading, self.after_weights)

    def check(self, weights_loaded: bool, resumed: bool = False) -> None:
        """Refuse a plan that cannot fit (needed). `resumed`: a checkpoint's run, whose length alone can change
        (its prompt and settings are the checkpoint's: the other advice named flags --resume refuses)."""
        free = available_bytes(torch.device(self.device))
        if free is None:
            return
        need = self.needed(weights_loaded)
        if need > free:
            def advice(name: Callable[[str], str]) -> str:  # `name`: a setting as the API or the flags spell it
                said = f"not enough memory: this run needs {size_text(need)} more ({self.describe()}) but " \
                       f"{size_text(free)} is free; "
                if not weights_loaded and self.loading > self.after_weights:  # (fewer tokens would change nothing)
                    unpacked = "pack_weights=False" if name is _api_name else "--no-pack-weights"
                    return (said + f"use a smaller {name('dtype')}, or {unpacked} (a packed copy is made while its "
                            f"original lives), or drop {name('float32_logits')} if given, or free some memory")
                said += f"lower {name('max_new_tokens')}"
                if resumed:
                    return said + " (a resumed run keeps its checkpoint's prompt and settings), or free some memory"
                return (said + f" or the prompt length, or use a smaller {name('dtype')}" + self.drafting_advice(name)
                        + (f", or a smaller {name('prefill_chunk')} (now {self.prefill_chunk:,})"
                           if self.prefill_chunk else ""))

            raise LongswiftError(advice(_api_name), advice(flag_name))

    def drafting_advice(self, name: Callable[[str], str]) -> str:
        """What a refusal adds to its advice for TokenSwift's settings (`name`: a setting as the API or the flags
        spell it): the draft cache's budget where the plan holds one (AR's has none), the tree's where it verifies
        trees."""
        verified = f"a step verifies {self.tree_nodes} nodes"
        if torch.device(self.device).type == "cuda" and (rows := padded_nodes(self.tree_nodes)) != self.tree_nodes:
            verified += f", padded to {rows} rows on CUDA"  # (the step bodies' node budget, counted above)
        return ((f", a smaller {name('draft_kv_budget')}" if self.draft_cache else "")
                + (f", {name('tree')}, {name('ngram_topk')} or {name('lookup_nodes')}, or a smaller "
                   f"{name('max_nodes')} ({verified})" if self.tree_nodes else ""))


def cpu_flash_buffer_bytes(head_dim: int, threads: int | None = None) -> int:
    """What the CPU's flash kernel allocates for its blocks: per thread (`threads` the run will have; None: torch's
    now) at most a 256-query x 512-key block of scores with its row maxima, sums and output rows (float32), and as
    much again for a reduced-precision copy (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp)."""
    return (threads or torch.get_num_threads()) * (256 * 512 + 256 * (2 + head_dim)) * 4 * 2


def mask_bytes(group: int, t: int, elem: int) -> int:
    """Bytes of a forward's mask of `t` new entries (Attention.masks): the additive [G*T, T] mask in the model's
    dtype, its rows padded (attention.additive_mask), and the [T, T] bool mask the forward keeps, with its inverse
    while the additive one is filled."""
    padded = -(-t // attention.MASK_ALIGN) * attention.MASK_ALIGN
    return group * t * padded * elem + 2 * t * t


def explicit_score_bytes(elem: int) -> int:
    """Bytes live at once per score of the CPU's explicit attention (Attention._query_first), measured with the
    profiler's memory timeline: in float32 and float64 the scores and their softmax (8 and 16); in bfloat16 and
    float16 the scores, the softmax's float32 copy of them and its float32 output, and the probabilities rounded
    back (14). (Planned at 8 for every dtype, float64's and bfloat16's verify passes held 1.6-1.75 times that.)"""
    return 2 * elem if elem >= 4 else elem + 3 * 4


def masked_attention_bytes(cfg: ModelConfig, t: int, capacity: int, elem: int, cascade: bool = False,
                           tail: int = 0, flash: bool = True, threads: int | None = None) -> int:
    """Transient bytes of attention in one forward of `t` new tokens under a mask, against up to
    `capacity` cached entries. Every path holds the additive [G*T, T] mask of the new entries (model
    dtype), and the cascade's parts merged (float32 or better). The CPU's explicit products (below
    FUSED_FROM_TOKENS, while the scores fit attention.EXPLICIT_SCORES_BYTES): the scores and their softmax
    over every entry (all heads; explicit_score_bytes); from it, or past that size, the CPU's cascade runs flash
    kernels, which work on blocks, over a copy of a layer's keys taken by slot (the CPU's caches store them by
    dimension: cache.transposed_keys). The CUDA cascade
    (`cascade`): scores and softmax over the T new entries (and `tail` cached ones: the bucketed step
    bodies' masked part), which its fused kernels do not all hold, so this bounds them from above. Without
    a flash kernel for the dtype (CUDA in float32, float64) its cached part is explicit too: scores, their
    masked copy and softmax over every cached entry."""
    mask = mask_bytes(cfg.group_size, t, elem)
    merged = 4 * cfg.num_heads * t * cfg.head_dim * max(elem, 4)  # each part's output and log-sum-exp, the merge
    if cascade:
        if not flash:
            return mask + 3 * cfg.num_heads * t * capacity * max(elem, 4) + merged
        return mask + 2 * cfg.num_heads * t * (t + tail) * 4 + merged
    # the CPU's flash kernels work on blocks: no scores over the cache exist, but they take the keys slot by
    # slot where the cache stores them by dimension (by_slot), a span at a time
    keys = min(cfg.num_kv_heads * capacity * cfg.head_dim * elem, BY_SLOT_SPAN_BYTES)
    blocks = mask + merged + cpu_flash_buffer_bytes(cfg.head_dim, threads) + keys
    if t >= FUSED_FROM_TOKENS:
        return blocks
    # Explicit scores and their softmax while they fit (Attention._kernel), the cascade past it: a run's forwards
    # take the first, up to attention.EXPLICIT_SCORES_BYTES, while its cache is short, the second once it is long.
    per_score = explicit_score_bytes(elem)
    if attention.explicit_scores_fit(cfg.num_heads * t, capacity):
        return mask + cfg.num_heads * t * (capacity * per_score + cfg.head_dim * elem)  # (and the product's output)
    return max(mask + attention.EXPLICIT_SCORES_BYTES // 4 * per_score, blocks)


def plan_memory(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, capacity: int, chunk: int, packed: bool,
    draft_tokens: int = 0, tree_nodes: int = 0, float32_logits: bool = False, sampled_rows: int = 1,
    held_rows: int = 0, threads: int | None = None, copies: bool = True,
) -> MemoryPlan:
    """`capacity`: tokens of the full KV cache (prompt + new tokens + TokenSwift's tree nodes);
    `draft_tokens`: size of the partial KV cache of the draft pass (0: none); `tree_nodes`: the
    largest verify pass, whose hidden states and attention scores are transients; `float32_logits`:
    a bf16/fp16 model's LM head runs on a float32 copy of its weight off CUDA (linear.float32_head);
    `sampled_rows`: rows of logits transformed and drawn at once (the batched walk: the whole padded
    trie; otherwise one row, and the draft stage's depth rows, counted as at least 4); `held_rows`: rows of
    logits held besides those (the rows walk's, computed in one pass: spec.budget.held_logit_rows); `threads`: the
    CPU threads the run will have (None: torch's now), whose flash buffers are each its own; `copies`: whether the
    load holds its weights as copies in memory (loading.weights_copied), for `loading_bytes`."""
    elem = torch.empty((), dtype=dtype).element_size()
    weights = cfg.parameter_count() * elem
    # Packing replaces each weight by its packed copy (the model lets the original go), but for the
    # embedding table: a tied LM head's packed copy is the one extra.
    embed = cfg.vocab_size * cfg.hidden_size
    packed_weights = embed * elem if packed and cfg.tie_word_embeddings else 0
    if float32_head_copy(float32_logits, dtype, torch.device(device)):
        packed_weights = embed * 4  # the head's float32 copy, in place of its packed one; the original stays
    float32_logits = float32_logits and dtype in (torch.bfloat16, torch.float16)  # a no-op in float32/float64
    kv = capacity * cfg.kv_bytes_per_token(dtype)
    # Largest transients: the attention of one masked forward (a prefill chunk or the verify pass
    # of `tree_nodes`) against the whole cache, plus the logits with their transform and draw, and
    # the activations.
    cuda = torch.device(device).type == "cuda"  # runtime.attention picks the cascade there
    # CUDA runs the verify pass through the step bodies (runtime.cuda_graphs): padded to a node
    # budget, and (bucketed) with a masked part over up to a bucket of cached slots.
    verify_rows = padded_nodes(tree_nodes) if cuda and tree_nodes else tree_nodes
    chunk = min(chunk, capacity)  # no prefill reads more than the cache holds (a prefill_chunk of 10**6)
    rows = max(chunk, verify_rows)
    flash = cuda_flash_fits(torch.device(device), dtype, cfg.head_dim)  # the planned GPU's own (cuda:1's, not the current one's)
    prefill = masked_attention_bytes(cfg, chunk, capacity, elem, cuda, flash=flash, threads=threads)
    scores = max(prefill, masked_attention_bytes(cfg, verify_rows, capacity, elem, cuda, BUCKET if cuda else 0, flash,
                                                 threads))
    # a chunk past the default that the workspace is sized by is advised on: its [G*T, T] mask grows as its square
    # (a 60,000-token chunk's was 27 GiB, and the refusal named only the prompt and the new tokens)
    big_chunk = chunk if chunk > GenerationConfig.prefill_chunk and prefill == scores and chunk >= verify_rows else 0
    logit_elem = 4 if float32_logits else elem
    logits = sampling_bytes(cfg.vocab_size, max(4, sampled_rows), logit_elem) + held_rows * cfg.vocab_size * logit_elem
    activations = rows * (cfg.hidden_size * 4 + cfg.intermediate_size * 3) * elem
    # PartialKVCache holds the budget and one slot more: the root its draft pass feeds
    draft = (draft_tokens + 1) * cfg.kv_bytes_per_token(dtype) if draft_tokens else 0
    return MemoryPlan(weights, packed_weights, kv, scores + logits + activations, capacity, str(device), draft,
                      draft_tokens, tree_nodes, big_chunk,
                      loading_bytes(cfg, elem, packed, copies,
                                    float32_head_packed(float32_logits, dtype, torch.device(device))))


def loading_bytes(cfg: ModelConfig, elem: int, packed: bool, copies: bool, head32_packed: bool = False) -> int:
    """What building the model (runtime.model.Transformer) holds beside its weights at the peak, before any cache,
    `group` a layer's largest concatenation (q/k/v's or gate/up's). From weights held as copies (`copies`): packed,
    a group's concatenation and its packed copy while the parts live, and an untied LM head's packed copy beside its
    original (a 1B model's, in float32 from a bfloat16 file: 1,002 MiB more at the peak, measured); colocated, the
    concatenation while the parts live. From the files' pages (a checkpoint in the run's dtype), what replaces them
    is not counted beside them: packed, the concatenation the packed copy is made from; colocated, nothing
    (measured: the same 1B model in bfloat16, 7 MiB over its settled size). `head32_packed`: the LM head runs on a
    float32 copy (--float32-logits off CUDA) that is packed, made from a float32 copy of the weight, which lives
    while it is (V x hidden x 4 bytes, tied or untied; a review measured it: with --no-pack-weights none is made,
    which this counts as if one were)."""
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim * cfg.hidden_size
    group = max(qkv, 2 * cfg.intermediate_size * cfg.hidden_size)
    if not copies:
        held = group if packed else 0
    elif not packed:
        held = group
    else:
        held = max(2 * group, 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    return max(held * elem, cfg.vocab_size * cfg.hidden_size * 4 if head32_packed else 0)


def rope_extension(cfg: ModelConfig, total: int, applied: str | None = None) -> str | None:
    """The --rope-scaling setting ('yarn:4') that extends the context to `total` tokens; None where none can.
    `applied`: the scaling this run gave (--rope-scaling, load's rope_scaling), whose kind is advised with a
    factor large enough, counted from the trained context; a model's own scaling cannot be replaced (None), nor
    can any factor that --rope-scaling takes reach past MAX_ROPE_FACTOR times the trained context."""
    if cfg.scaled_rope is None:
        kind = "yarn"
    elif applied is not None:
        kind = parse_rope_scaling(applied)[0]
    else:
        return None
    factor = -(-total // cfg.trained_context)
    return f"{kind}:{factor}" if factor <= MAX_ROPE_FACTOR else None


def sliding_window_refusal(window: int, new_tokens: str) -> str:
    """A run longer than a sliding-window model's window refused (`new_tokens`: the setting as the API or the flags
    name it)."""
    return (f"this model uses sliding-window attention ({window:,} tokens), which longswift does not implement; keep "
            f"prompt + {new_tokens} <= {window:,}")


def check_context(cfg: ModelConfig, prompt_tokens: int | None, max_new_tokens: int, rescalable: bool = True,
                  applied: str | None = None) -> None:
    """Refuse a generation longer than the model's context (trained, or extended by rope scaling), in the
    API's words (cli_message: the flags'). `prompt_tokens` None: the prompt is not tokenized yet (the command
    line, before loading): one at least. `rescalable`: whether a rope scaling may be advised (not to a
    resumed run, which keeps its checkpoint's). `applied`: the rope scaling this run gave, if any, whose larger
    factor is advised (rope_extension)."""
    counted = 1 if prompt_tokens is None else prompt_tokens
    total, limit = counted + max_new_tokens, cfg.context_limit
    if cfg.sliding_window is not None and total > cfg.sliding_window:  # (said before loading, as the context is)
        raise ConfigError(sliding_window_refusal(cfg.sliding_window, "max_new_tokens"),
                          sliding_window_refusal(cfg.sliding_window, "--max-new-tokens"))
    if total <= limit:
        return
    full = counted >= limit  # the prompt alone: fewer new tokens would not help
    setting = rope_extension(cfg, total, applied) if rescalable else None

    def say(length: str, asked: str, rope: str) -> str:
        shorter = "shorten the prompt" if full else f"lower {length}"
        if setting is not None:
            advice = f"{shorter}, or extend the context on purpose with {rope}"
        elif cfg.scaled_rope is not None and not full:
            advice = f"lower {length} or shorten the prompt"
        else:  # no extension reaches that far (or none may be used)
            advice = shorter
        what = (f"{asked} and a prompt of at least one token" if prompt_tokens is None
                else f"prompt ({prompt_tokens} token{'' if prompt_tokens == 1 else 's'}) + {asked} = {total}")
        return f"{what} exceeds this model's context of {limit} tokens: {advice}"

    api = say("max_new_tokens", f"max_new_tokens={max_new_tokens}", f"load(..., rope_scaling='{setting}')")
    cli = say("--max-new-tokens", f"--max-new-tokens {max_new_tokens}", f"--rope-scaling {setting}")
    raise ConfigError(api, cli)


def new_cache(model: Transformer, capacity: int, chunk: int, draft_tokens: int = 0, tree_nodes: int = 0,
              sampled_rows: int = 1, context: int | None = None, held_rows: int = 0,
              resumed: bool = False) -> FullKVCache:
    """Plan the memory of a run (with TokenSwift's draft cache and tree, if any), refuse what
    cannot fit, then allocate its full KV cache. `context`: the run's prompt + new tokens where the
    capacity is larger (a tree's rows past the run's end are verified, never read by the walk);
    `resumed`: a checkpoint's run (MemoryPlan.check)."""
    cfg = model.cfg
    if cfg.sliding_window is not None and (capacity if context is None else context) > cfg.sliding_window:
        raise LongswiftError(sliding_window_refusal(cfg.sliding_window, "max_new_tokens"),
                             sliding_window_refusal(cfg.sliding_window, "--max-new-tokens"))
    plan = plan_memory(cfg, model.dtype, model.device, capacity, chunk, model.packed, draft_tokens,
                       tree_nodes, model.float32_logits, sampled_rows, held_rows)
    if model.tp is None:
        plan.check(weights_loaded=True, resumed=resumed)
    else:  # each rank reads its own free memory: all refuse together, or the others wait in the run's collectives
        model.tp.refuse_together(lambda: plan.check(weights_loaded=True, resumed=resumed))
    return FullKVCache(cfg, capacity, model.dtype, model.device)
