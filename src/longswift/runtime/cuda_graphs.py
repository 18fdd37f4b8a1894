"""A model's CUDA steps with fixed shapes, replayed as CUDA graphs: decoding, the draft pass and
the tree-verify pass.

A graph replays fixed shapes, but the cache grows every step. So a step of N new tokens (N padded
to a fixed node budget) writes its keys/values at a slot read from device memory, and attends in
one of two ways (--graph-attention):

- bucketed (auto's choice where torch's flash lacks seqused_k): attention is split at a bucket
  boundary P = slot - slot % bucket: flash attention over the whole buckets [0, P), a shape fixed
  for the bucket, and masked attention over the slots [P, P + bucket + N) under a visibility
  computed on the device (cached slots before the step's slot; among the N new ones, the tree
  mask), merged by their log-sum-exps (runtime.attention.bucketed). One graph per (bucket, N,
  output): a 100K-token run captures about 100 per node budget in use.
- length (auto's choice where torch can; the faster on an H100, docs/benchmarks.md): flash
  attention's variable-length kernel reads the cached length itself from device memory
  (seqused_k) over a span of the cache that doubles from one bucket, plus masked
  attention over the N new entries under the tree mask, merged (runtime.attention.by_length); a
  single token (decoding, a draft pass), whose key is written before it attends, is one flash call
  over the slots up to its own, with no masked part or merge. One graph per (span, N, output):
  five per node budget for 100K tokens after a 4K prompt (a step's span covers its first slot + 1),
  and no [N, bucket] tail.
  The span bounds the kernel's split of the keys, which it plans from the span on the host: a
  single span of the whole cache would plan every short-context step as a 100K one.

Graphs are captured the first time they are needed and share one memory pool (one per StepGraphs: the full
cache's and the partial cache's each have theirs). A graph's output may lie in memory another graph of the pool
writes when it replays, so every output is read (sampled, walked, copied to the host or to a buffer of its own)
before the next replay of its StepGraphs: a loop that held one graph's output across another's replay would read
what that replay left there (a review found none that does; keep it so). Token ids,
positions, the tree mask and the slot are copied into device buffers before a replay, and nothing
inside a step reads the host. A body returns the last layer's hidden states and one output: every
row's logits (decoding, a verify pass whose walk draws from all rows), none (a verify pass whose
walk computes the rows it visits), or the draft pass's depth logits (the draft heads and the LM
head, captured with the forward: 52 of a draft pass's aten ops on the tiny test model, views
included, that ran eagerly after the replay).

On CUDA the generation loops always run these bodies, captured (--cuda-graphs on/auto) or
eagerly (off): a graph never changes results, replay equals the eager body exactly. The two ways of
attending compute the same attention in different float sums (equal tokens in float32)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..config import GRAPH_ATTENTIONS, ModelConfig, SamplingConfig
from ..errors import LongswiftError
from ..sampling import banned_index, draw_rows, transform
from .attention import additive_mask, bucketed, by_length, key_span, length_unsupported, prefix_attention
from .cache import FullKVCache
from .model import Transformer
from .triton_kernels import attention as triton_attention
from .triton_kernels import attention_fits, attention_parts, default_tiles, rope_store
from .triton_sampling import sample as triton_sample
from .triton_sampling import sample_params, sampling_fits

# Slots of a bucket: the masked tail costs one [Hkv, G*N, bucket + N] product per layer; a
# growing cache captures one graph per bucket (100K tokens: about 100 captures per node budget).
BUCKET = 1024
# Tree-verify passes are padded up to one of these node counts, so that a few graphs serve every
# trie. At short contexts the weight-bound forward costs about the same for 8 or 128 rows, but at
# 100K the attention over the cache is compute-bound and every padded row costs (H100, 8B shape,
# session 6: about 0.2 ms a row past 32). The GPU's default tries are mostly 40-49 nodes (heads
# only) or 80-100 (with n-grams), and fused mode's up to 280 (docs/scripts/trie_sizes.py), so the
# budgets double from 8: a larger trie is padded by less than 2x, one graph per budget in use per bucket.
NODE_BUDGETS = (1, 8, 16, 32, 64, 128, 256, 512)
# What a step body returns besides the last layer's hidden states: every row's logits, nothing, or the
# draft pass's output (StepGraphs' `draft` function of the hidden state: the heads' depth logits).
# SAMPLED is a decoding body that first draws its own token (StepGraphs.sample_decode), then returns
# its logits.
LOGITS, HIDDEN, DRAFT, SAMPLED = "logits", "hidden", "draft", "sampled"


def padded_nodes(nodes: int) -> int:
    """The node budget a trie of `nodes` nodes is padded to: past the last of NODE_BUDGETS the budgets go on
    doubling (left unpadded, every trie size past it had a graph, a warm-up and static outputs of its own: a few
    hundred MB each for an 8B model's logits, kept until the span moved on; found by review)."""
    return next((b for b in NODE_BUDGETS if b >= nodes), 1 << (nodes - 1).bit_length())


def span_for(slot: int, bucket: int, capacity: int) -> int:
    """--graph-attention length: the cache slots a step at `slot` attends over, `bucket` doubled
    until it covers the slot, at most the cache's capacity."""
    span = bucket
    while span < slot:
        span *= 2
    return min(span, capacity)


def resolve_attention(setting: str, device: torch.device) -> str:
    """--graph-attention auto: length on CUDA where this torch's flash kernel takes seqused_k, else
    bucketed (also on the CPU, where the loops run no step bodies and the setting means nothing)."""
    if setting != "auto":
        return setting
    return "length" if device.type == "cuda" and length_unsupported(device) is None else "bucketed"


def use_graphs(setting: str, model: Transformer) -> bool:
    """--cuda-graphs: auto = wherever supported, on = required (refused with the reason where not), off."""
    why = graphs_supported(model)
    if setting == "on" and why is not None:
        raise LongswiftError(f"cuda_graphs='on' (--cuda-graphs on): {why}; use auto or off")
    return setting != "off" and why is None


def step_bodies(model: Transformer) -> bool:
    """Whether the loops run their steps through StepGraphs on this model (captured or not)."""
    return model.device.type == "cuda" and graphs_supported(model) is None


def graphs_supported(model: Transformer) -> str | None:
    """Why graphs cannot run for this model, or None if they can."""
    return graphs_blocker(model.device, model.cfg, model.tp is not None)


def graphs_blocker(device: torch.device, cfg: ModelConfig, tensor_parallel: bool) -> str | None:
    """graphs_supported before a model is loaded (the memory plan): why graphs cannot run for a model of `cfg` on
    `device`, or None if they can."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (this model runs on {device})"
    if tensor_parallel:
        return "CUDA graphs are not supported with tensor parallelism yet"
    if cfg.rope_type == "dynamic":
        return "dynamic NTK rope recomputes its frequencies from the host's positions, which a graph cannot replay"
    return None


class StepGraphs:
    """Fixed-shape forwards at a cache's end: decode(token, position) -> (logits [V], hidden),
    forward(tokens, positions, mask, logits) for N tokens under a [N, N] mask, and draft(token,
    position) -> (draft(hidden [1, hidden]), hidden): the draft pass, heads and LM head captured
    with the forward. The returned tensors are the graph's static outputs: read them before the
    next call. `capture=False` runs the same bodies eagerly (any device: how the CPU tests check
    them). `evict`: a cache that only grows (the full cache) frees the graphs of buckets (spans) it
    has left. `attention`: bucketed or length (see the module's docstring). `sample_in_body`: token
    blocks (runtime.blocks) draw inside the decode body (sample_decode); False draws with eager ops
    between the bodies, as before (the reference the tests compare with)."""

    def __init__(self, model: Transformer, cache: FullKVCache, capture: bool = True, bucket: int = BUCKET,
                 evict: bool = True, attention: str = "bucketed",
                 draft: Callable[[torch.Tensor], torch.Tensor] | None = None, sample_in_body: bool = True) -> None:
        why = graphs_supported(model)
        if capture and why is not None:
            raise LongswiftError(why + "; use cuda_graphs='off' (--cuda-graphs off)")
        if attention not in GRAPH_ATTENTIONS:
            raise LongswiftError(f"graph_attention must be one of {', '.join(GRAPH_ATTENTIONS)}; got '{attention}'")
        # --triton-kernels, length: attention by runtime.triton_kernels.attention rather than flash's kernel and the
        # masked part's, with their merge (not in float64 on CUDA, which stays on the explicit products). It reads
        # the cached length from device memory itself, so it needs no flash kernel that takes seqused_k.
        self.triton_attention = model.triton_kernels and attention_fits(model.device, model.dtype, model.cfg.head_dim)
        if attention == "length" and not self.triton_attention and (why := length_unsupported(model.device)):
            raise LongswiftError(why)
        self.model, self.cache, self.capture, self.bucket, self.evict = model, cache, capture, bucket, evict
        self.attention, self.draft_out, self.sample_in_body = attention, draft, sample_in_body
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # N -> [tokens; positions], mask
        self.slot = torch.zeros(1, dtype=torch.long, device=model.device)
        self.graphs: dict[tuple[int, int, str], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.capture_stream: torch.cuda.Stream | None = None  # made at the first capture, on the model's device
        self.captures = 0
        self.capture_seconds = 0.0  # wall time of the captures (warm-up run included), a one-off cost per graph
        self.warmed: set[tuple[int, str, bool]] = set()  # bodies run once eagerly before a capture (_warm_key)
        self._taken = (0, 0.0)
        # What a SAMPLED body reads (bind_sampling): the device history and the transform, the logits it
        # draws from and the draw's uniform, in buffers whose addresses the graphs keep.
        self.history: torch.Tensor | None = None
        self.sampling: SamplingConfig | None = None
        self.banned: torch.Tensor | None = None  # the ban's index tensor the SAMPLED graphs read
        self.drawn_from: torch.Tensor | None = None  # [V]
        self.sample_params: torch.Tensor | None = None  # the Triton draw's (triton_sampling.sample_params), if it draws
        self.u = torch.zeros(1, dtype=torch.float64, device=model.device)

    def take_captures(self) -> tuple[int, float]:
        """Graphs captured, and their seconds, since the last call (for a generation's stats)."""
        taken, self._taken = self._taken, (self.captures, self.capture_seconds)
        return self.captures - taken[0], self.capture_seconds - taken[1]

    def _buffers(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[2, N] long (token ids; positions) and [N, N] bool (the tree mask): what a step of N reads."""
        if n not in self.buffers:
            dev = self.model.device
            self.buffers[n] = (torch.zeros(2, n, dtype=torch.long, device=dev), torch.eye(n, dtype=torch.bool, device=dev))
        return self.buffers[n]

    def body(self, first: int, n: int, out: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward of the N buffered tokens written from the buffered slot on, which lies in the
        bucket starting at `first` (bucketed) or within the span of `first` slots (length), and its
        `out` (LOGITS [N, V], HIDDEN: [0, hidden], DRAFT: the draft function's); reads only device
        buffers."""
        m, cache, g = self.model, self.cache, self.model.cfg.group_size
        (tokens, positions), mask = self._buffers(n)
        if out == SAMPLED:  # the token is drawn here, into the buffer the forward reads
            self._draw(positions, tokens)
        cos, sin = m.rope.cos_sin(positions, 0, m.dtype)  # [N, 1, D]
        where = self.slot + torch.arange(n, device=m.device)  # [N] cache slots of the new tokens
        if self.attention == "length" and self.triton_attention:  # the slots in use and the new ones, two kernels
            used = self.slot + 1 if n == 1 else self.slot  # (a single token's key is among the used slots)
            tree = None if n == 1 else mask.to(torch.int8)  # (once, not a layer)
            parts = attention_parts(m.device, m.cfg.num_kv_heads, g * n, first, default_tiles(m.dtype).max_block_m)

            def attention(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor) -> torch.Tensor:
                return triton_attention(qg, keys, values, used, m.scale, tree, parts)
        elif self.attention == "length" and n == 1:  # one token (decoding, a draft pass): its key is in the
            ks = key_span(self.slot + 1, first)  # cache before it attends: one flash call, no merge

            def attention(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor) -> torch.Tensor:
                return prefix_attention(qg, keys[:, :first], values[:, :first], ks, m.scale)
        elif self.attention == "length":
            ks = key_span(self.slot, first)  # the cached slots before the step's, counted on the device
            allowed = additive_mask(mask, m.dtype, g)  # [G*N, N], rows g*N + t

            def attention(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor) -> torch.Tensor:
                return by_length(qg, keys[:, :first], values[:, :first], ks, k.transpose(0, 1), v.transpose(0, 1),
                                 allowed, m.scale)
        else:
            end = min(first + self.bucket + n, cache.capacity)
            rel = torch.arange(first, end, device=m.device) - self.slot  # [tail]: slot offset from the step's first
            new = (rel >= 0) & (rel < n)
            visible = (rel < 0) | (new & mask[:, rel.clamp(0, n - 1)])  # [N, tail]
            visible = additive_mask(visible, m.dtype, g)  # [G*N, tail], rows g*N + t

            def attention(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor) -> torch.Tensor:
                return bucketed(qg, keys, values, first, end, visible, m.scale)

        rotate = None
        if m.triton_kernels and not m.cfg.qk_norm:  # rope and the two cache writes: one kernel a layer
            h, hkv = m.cfg.num_heads, m.cfg.num_kv_heads

            def rotate(layer: int, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                return rope_store(qkv, cos, sin, where, cache.k[layer], cache.v[layer], h, hkv, m.fused_rope)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = cache.k[layer], cache.v[layer]  # [Hkv, C, D]
            if rotate is None:  # (else rope_store wrote them)
                keys.index_copy_(1, where, k.transpose(0, 1))  # [Hkv, N, D] at the step's slots
                values.index_copy_(1, where, v.transpose(0, 1))
            return m.grouped(q, lambda qg: attention(qg, keys, values, k, v))

        x = m.layers_forward(F.embedding(tokens, m.embed), cos, sin, attend, rotate=rotate)  # [N, hidden]
        if out == DRAFT:
            assert self.draft_out is not None
            return self.draft_out(x), x
        return (m.logits(x) if out in (LOGITS, SAMPLED) else x[:0]), x

    def _draw(self, positions: torch.Tensor, tokens: torch.Tensor) -> None:
        """A SAMPLED body's draw (device_draw) from `drawn_from` under the bound transform."""
        assert self.history is not None and self.sampling is not None and self.drawn_from is not None
        device_draw(self.drawn_from, self.history, positions, self.sampling, None if self.sampling.greedy else self.u,
                    tokens, self.sample_params)

    def _capture(self, key: tuple[int, int, str]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        # torch.cuda.graph captures on a stream of the *current* device (its shared default capture stream,
        # made on whichever device was current first) and synchronises that device: with the model on
        # cuda:1 and cuda:0 current, the body's kernels would go to a stream that is not capturing. So the
        # capture runs with the model's device current, on a capture stream of that device. (A replay
        # launches on its capture device by itself.)
        with torch.cuda.device(self.model.device):
            return self._capture_here(key)

    def _capture_here(self, key: tuple[int, int, str]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        # Warm-up (lazy inits, workspaces) off the capture, the first time a body of this shape is captured; the
        # same body for a later bucket or span runs the same ops on other lengths, so it needs none (on an H100 the
        # embedded model's 11 captures, each with a warm-up, took 0.37 s of a 9 s, 4,096-token run).
        if self._warm_key(key) not in self.warmed:
            side = torch.cuda.Stream(self.model.device)
            side.wait_stream(torch.cuda.current_stream(self.model.device))
            with torch.cuda.stream(side):  # same writes as the replay
                self.body(*key)
            torch.cuda.current_stream(self.model.device).wait_stream(side)
            self.warmed.add(self._warm_key(key))
        graph = torch.cuda.CUDAGraph()
        if self.capture_stream is None:
            self.capture_stream = torch.cuda.Stream(self.model.device)
        with torch.cuda.graph(graph, pool=self.pool, stream=self.capture_stream):
            out = self.body(*key)
        self.captures += 1
        torch.cuda.synchronize(self.model.device)
        self.capture_seconds += time.perf_counter() - t0
        # Buckets (spans) a growing cache has left are never replayed again: free their graphs, now that the
        # new one holds the shared pool (a pool whose last graph is freed is released with it).
        if self.evict:
            for old in [k for k in self.graphs if k[0] < key[0]]:
                del self.graphs[old]
        self.graphs[key] = (graph, *out)
        return self.graphs[key]

    def _warm_key(self, key: tuple[int, int, str]) -> tuple[int, str, bool]:
        """Which warm-up serves the body of `key`: one per (N, output), and, bucketed, per whether the body
        attends over whole buckets before its own. The first bucket's body has no flash part (runtime.attention
        cascade's start 0), so a later bucket's body would otherwise launch flash for the first time inside its
        capture (a prompt within the first bucket, one prefill chunk, never ran it)."""
        return key[1], key[2], self.attention == "bucketed" and key[0] > 0

    def forward(self, tokens: list[int], positions: torch.Tensor, mask: torch.Tensor | None, logits: bool,
                budget: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n], positions [n] long, mask [n, n] bool (None: one token) -> (logits [n', V], or
        [0, hidden] when not `logits`; hidden [n', hidden]) with n' = the padded budget (rows past n are
        padding); the cache advances by n, the padding's entries lie past its end."""
        n = len(tokens)
        budget = budget or padded_nodes(n)
        slot = self.cache.reserve(budget)
        ids, buf_mask = self._buffers(budget)
        # Padded on the host (rows past n repeat the last token, each seeing only itself): one copy
        # to the device for the ids and positions, one for the mask.
        pad = budget - n
        where = positions.tolist()
        ids.copy_(torch.tensor([list(tokens) + tokens[-1:] * pad, where + where[-1:] * pad]), non_blocking=True)
        if mask is not None:
            padded = torch.eye(budget, dtype=torch.bool)
            padded[:n, :n] = mask
            buf_mask.copy_(padded, non_blocking=True)
        return self._run(slot, budget, n, LOGITS if logits else HIDDEN)

    def _run(self, slot: int, budget: int, n: int, out: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay (or run eagerly) the step of `budget` buffered rows written from `slot`, `n` of them real."""
        self.slot.fill_(slot)
        if self.attention == "length":
            # Past the step's first slot: a single token's span must cover its own key, and a verify pass that
            # starts on a span's last slot (the first step after a 2,048-token prompt) takes the span the steps
            # after it use, rather than a graph of its own for that one step.
            first = span_for(slot + 1, self.bucket, self.cache.capacity)
        else:
            first = slot - slot % self.bucket
        key = (first, budget, out)
        if self.capture:
            graph, out_logits, hidden = self.graphs.get(key) or self._capture(key)
            graph.replay()
        else:
            out_logits, hidden = self.body(*key)
        self.cache.length = slot + n
        return out_logits, hidden

    def decode(self, token: int | torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One token at the cache's end -> (logits [V], hidden [hidden]). `token`: an id, or a [1]
        long tensor on the device (copied there, never read by the host)."""
        out, hidden = self._one(token, position, LOGITS)
        return out[0], hidden

    def bind_sampling(self, history: torch.Tensor, sampling: SamplingConfig) -> None:
        """What sample_decode draws with: the generation's device history (prompt and drawn tokens, its
        capacity fixed) and its transform. Binding others drops the SAMPLED graphs, which hold these."""
        if history is self.history and sampling == self.sampling:
            return
        # A copy: the SAMPLED graphs bake in these settings, so a caller's later change to its own config
        # object must compare unequal here (and drop them), not change the stored one along with it.
        self.history, self.sampling = history, dataclasses.replace(sampling)
        # Made here, never during a capture, and held while the graphs that read it may be replayed
        # (sampling.banned_index keeps a list's tensor only while something holds it, or recently used)
        self.banned = banned_index(sampling.banned_ids, history.device) if sampling.banned_ids else None
        # The Triton draw's numbers, likewise made here (the logits are in the model's acc_dtype)
        dtype = self.model.acc_dtype
        self.sample_params = (sample_params(sampling, dtype, history.device)
                              if self.model.triton_kernels and sampling_fits(sampling, dtype) else None)
        for key in [k for k in self.graphs if k[2] == SAMPLED]:
            del self.graphs[key]
        self.warmed = {w for w in self.warmed if w[1] != SAMPLED}

    def sample_decode(self, logits: torch.Tensor, u: torch.Tensor | None, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw the token at `position` (its history index) from `logits` [V] with the uniform `u` ([1]
        float64 on the device; None if greedy), write it to the bound history, and forward it at the
        cache's end -> (logits [V], hidden [hidden]): the draw and the forward in one step body, so a
        graph replays both (runtime.blocks' per-token draw, about 25 small kernels, launched eagerly
        otherwise). Outside the body: two device copies (the logits, the uniform) and the position."""
        if self.history is None:
            raise ValueError("StepGraphs.sample_decode needs bind_sampling first")
        if self.drawn_from is None:
            self.drawn_from = torch.empty_like(logits)
        self.drawn_from.copy_(logits)
        if u is not None:
            self.u.copy_(u)
        result, hidden = self._one(None, position, SAMPLED)
        return result[0], hidden

    def draft(self, token: int | torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft pass of one token at the cache's end -> (the draft function's output for its
        hidden state, hidden [hidden]); the caller truncates the cache back."""
        if self.draft_out is None:
            raise ValueError("StepGraphs.draft needs a draft function (StepGraphs(..., draft=...))")
        return self._one(token, position, DRAFT)

    def _one(self, token: int | torch.Tensor | None, position: int, out: str) -> tuple[torch.Tensor, torch.Tensor]:
        """One token at the cache's end through the `out` body; `token` None: the body draws it (SAMPLED)."""
        slot = self.cache.reserve(1)
        (buf_token, buf_position), _ = self._buffers(1)
        if isinstance(token, torch.Tensor):
            buf_token.copy_(token)
        elif token is not None:
            buf_token.fill_(token)
        buf_position.fill_(position)  # a kernel argument: no host-to-device copy
        result, hidden = self._run(slot, 1, 1, out)
        return result, hidden[0]


def device_draw(logits: torch.Tensor, history: torch.Tensor, positions: torch.Tensor, sampling: SamplingConfig,
                u: torch.Tensor | None, tokens: torch.Tensor, triton_params: torch.Tensor | None = None) -> None:
    """A SAMPLED body's draw: the token at `positions` [1] (its index in the history, which is its position)
    from `logits` [V] under `sampling` with the uniform `u` ([1] float64 on the device; None if greedy), the
    penalty window gathered from the device `history` before that index (-1: before the history's start),
    written to the history there and to `tokens` [1]. What runtime.blocks does per token on the host's
    launches, here in device ops only (about 25 on a GPU); with `triton_params` (triton_sampling.sample_params:
    --triton-kernels, where they take the transform) in 2-4 Triton kernels."""
    if triton_params is not None:
        banned = banned_index(sampling.banned_ids, history.device) if sampling.banned_ids else None
        triton_sample(logits, history, positions[:1], sampling, triton_params, banned, u, tokens)
        return
    # A window past the history's capacity reaches nothing more (its entries before slot 0 are padding): cut to it,
    # as penalty_window's slice is, not an index of the window's size (10**12 entries for 'all the text').
    w = min(sampling.penalized_window, history.numel())
    at = positions[:1] - w + torch.arange(w, device=history.device)  # [W] the window's history indices
    window = torch.where(at >= 0, history[at.clamp(min=0)], -1)  # [W]
    x = transform(logits[None], window[None], sampling)  # [1, V]
    token = draw_rows(x, sampling, u)  # [1]
    history.index_copy_(0, positions[:1], token)
    tokens.copy_(token)
