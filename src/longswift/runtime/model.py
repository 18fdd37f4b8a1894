"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a transformers-named state dict."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..errors import LongswiftError
from .attention import Attention
from .cache import FullKVCache
from .linear import (
    LinearFn,
    PackedWeights,
    ResidualFn,
    add_to_residual,
    colocate,
    float32_head,
    make_linear,
    packed_linear,
    packing_supported,
)
from .rope import Rope, apply_rope
from .triton_kernels import rms_norm as triton_rms_norm
from .triton_kernels import norm_fits, silu_mul, triton_unavailable

if TYPE_CHECKING:
    from .parallel import TensorParallel

FLOAT32_LOGITS_TP = "--float32-logits is not supported with tensor parallelism: leave it off"
# attend(layer, q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]) -> [T, H*D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# rotate(layer, qkv [T, (H + 2 Hkv) D]) -> q [T, H, D], k, v [T, Hkv, D]: rope applied, and the keys and values
# stored in the layer's cache (triton_kernels.rope_store); attend then stores nothing
RotateFn = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def check_state_dict(cfg: ModelConfig, state: dict[str, torch.Tensor], lm_head_rows: int | None = None) -> None:
    """Raise a LongswiftError naming the first tensor that does not match the config."""
    shapes = cfg.state_shapes(lm_head_rows)
    for name, shape in shapes.items():
        if name not in state:
            raise LongswiftError(f"checkpoint does not match its config: tensor '{name}' is missing")
        if tuple(state[name].shape) != shape:
            raise LongswiftError(
                f"checkpoint does not match its config: '{name}' has shape {tuple(state[name].shape)}, "
                f"the config implies {shape}"
            )
    extra = sorted(set(state) - set(shapes) - {"lm_head.weight"})
    if extra:
        raise LongswiftError(f"checkpoint does not match its config: unexpected tensor '{extra[0]}'")


def fused_rms_norm_available() -> bool:
    """Whether this torch has aten's fused RMSNorm (one kernel on CUDA that scales by the weight in
    float32 and rounds once); older ones compose F.rms_norm from several ops, rounding as transformers."""
    return hasattr(torch.ops.aten, "_fused_rms_norm")


def fused_norm_default(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether RMSNorm runs as one op by default (rms_norm's `fused`): in a reduced dtype on CUDA,
    where each op is a kernel, and only where aten has its fused kernel."""
    return device.type == "cuda" and dtype not in (torch.float32, torch.float64) and fused_rms_norm_available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused: bool, triton: bool = False) -> torch.Tensor:
    """RMSNorm of x [..., hidden], normalised in (at least) float32. In float32 and float64 one op,
    the same products as transformers'. In a reduced dtype transformers rounds the normalised x to
    it and then scales by the weight there: four ops (up-cast, norm, down-cast, scale), each a kernel
    on CUDA. `fused` makes it one op, aten's fused RMSNorm, which scales in float32 and rounds once:
    at most a last-bit difference per element from transformers' double rounding. The one op takes
    a weight of x's dtype only; another weight dtype gets the two steps, promoting as they do. `triton`
    (--triton-kernels where triton_kernels.norm_fits): rows [T, hidden] with a weight of their dtype in one Triton
    kernel that rounds where these ops round (q/k norms, over heads, stay these ops)."""
    wide = x.dtype in (torch.float32, torch.float64)  # (torch.promote_types(x.dtype, float32) == x.dtype, without
    # a dtype computation per norm on the hot path)
    if triton and x.dim() == 2 and x.stride(1) == 1 and weight.dtype == x.dtype:
        return triton_rms_norm(x, weight, eps, one_rounding=wide or fused)
    if weight.dtype == x.dtype and (wide or fused):
        return F.rms_norm(x, (x.shape[-1],), weight, eps=eps)
    return weight * F.rms_norm(x.to(x.dtype if wide else torch.float32), (x.shape[-1],), eps=eps).to(x.dtype)


def fused_kernels(model: Transformer) -> bool:
    """Whether any of the model's fused kernels (fused_norm, fused_residual, fused_rope) is on, which
    changes its rounding (bench identities record it)."""
    return model.fused_norm or model.fused_residual or model.fused_rope


@dataclass
class Layer:
    """One decoder layer: its norms (views into the state dict) and its linear maps."""

    attn_norm: torch.Tensor
    qkv: LinearFn  # [T, hidden] -> [T, (H + 2 Hkv) D]
    o: ResidualFn  # (attention [T, H*D], residual [T, hidden]) -> residual + o_proj(attention)
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    mlp_norm: torch.Tensor
    gate_up: LinearFn  # [T, hidden] -> [T, 2 I]
    down: ResidualFn  # (activation [T, I], residual [T, hidden]) -> residual + down_proj(activation)


class Transformer:
    """forward(tokens, positions, cache, tree_mask) -> (logits, hidden); one sequence at a time.

    `pack=True` runs the linears on oneDNN-packed copies of the weights (CPU, float32/bfloat16)
    and takes the originals out of the state dict (`unpacked`: the copy holds the same values, so a
    model takes no more memory than its weights; full_state() gives them back), all but the
    embedding, which a tied LM head shares; where packing does not exist (CUDA, other dtypes) it
    instead colocates each layer's q/k/v and gate/up weights in the state dict (runtime.linear:
    one product each, no extra memory). Otherwise the linears read the state dict's tensors in place.
    With `tp`, cfg and state are this rank's shard (parallel.shard_config/shard_state): o_proj and
    down_proj all_reduce their partial sums and the LM head gathers the vocabulary; the forward
    itself is the same code."""

    def __init__(self, cfg: ModelConfig, state: dict[str, torch.Tensor], pack: bool = False,
                 tp: TensorParallel | None = None, float32_logits: bool = False,
                 fused_norm: bool | None = None, fused_residual: bool | None = None,
                 fused_rope: bool | None = None, triton_kernels: bool = False) -> None:
        check_state_dict(cfg, state, tp.plan.vocab_per_rank if tp is not None else None)
        self.cfg = cfg
        self.state = state
        self.tp = tp
        embed = state["model.embed_tokens.weight"]
        self.dtype, self.device = embed.dtype, embed.device
        self.acc_dtype = torch.promote_types(self.dtype, torch.float32)  # norms, softmax, logits
        # Fused kernels that round once where transformers' ops round twice: by default in a reduced dtype
        # on CUDA, where each op is a kernel (float32 there stays the CPU's ops, token-identical to it).
        reduced = self.dtype != self.acc_dtype
        fusing = self.device.type == "cuda" and reduced
        # RMSNorm in one op (norm), by default only where aten has its fused kernel
        self.fused_norm = (fused_norm_default(self.device, self.dtype) if fused_norm is None else fused_norm) and reduced
        self.packed = pack and packing_supported(self.dtype, self.device)
        # o_proj and down_proj add their residual in the product's epilogue (see add_to_residual); never
        # packed (oneDNN) or tensor parallel (the add follows the all_reduce).
        self.fused_residual = (fusing if fused_residual is None else fused_residual) and tp is None and not self.packed
        self.fused_rope = fusing if fused_rope is None else fused_rope  # rope's second product in its add (apply_rope)
        # SwiGLU, and in the CUDA step bodies rope with the cache writes, as Triton kernels (runtime.triton_kernels)
        if triton_kernels and (why := triton_unavailable(self.device)) is not None:
            raise LongswiftError(f"triton_kernels (--triton-kernels): {why}")
        self.triton_kernels = triton_kernels
        self.triton_norm = triton_kernels and norm_fits(self.device, self.dtype)
        self.embed = embed
        self.packed_copies: list[PackedWeights] = []  # every packed copy the linears read
        # Weights taken out of the state dict because a packed copy holds them: name -> (copy, part)
        self.unpacked: dict[str, tuple[PackedWeights, int]] = {}
        head_name = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        lm_head = state[head_name]
        # Logits kept in float32 rather than rounded to a reduced dtype (a no-op for float32/float64 models).
        self.float32_logits = float32_logits and self.dtype in (torch.bfloat16, torch.float16)
        if tp is not None and self.float32_logits:
            raise LongswiftError(FLOAT32_LOGITS_TP)
        # The embedding stays (the tied head's packed copy is the one extra copy of a weight).
        head_names = () if cfg.tie_word_embeddings else (head_name,)
        if self.float32_logits:
            self.lm_head = float32_head(lm_head, pack)  # [T, hidden] -> [T, V] float32
        elif tp is None:
            self.lm_head = self._linear(head_names, [lm_head], [None])
        else:  # an untied head is already this rank's block; a tied one is the whole embedding
            self.lm_head = tp.vocab_parallel(self._linear(head_names, [tp.vocab_rows(lm_head)], [None]))
            # [T, hidden] -> gathered [T, V]
        del lm_head  # packed, an untied head's original is freed here, not after the layers are built
        self.final_norm = state["model.norm.weight"]
        self.colocated = pack and not self.packed  # q/k/v and gate/up as one matrix each (runtime.linear)
        self.layers = [self._layer(n) for n in range(cfg.num_layers)]
        self.rope = Rope(cfg, self.device)
        self.scale = cfg.head_dim**-0.5
        self.attention = Attention(self.device, self.dtype, self.scale, self.packed)

    def _layer(self, n: int) -> Layer:
        p, s = f"model.layers.{n}.", self.state
        a, m = p + "self_attn.", p + "mlp."
        return Layer(
            attn_norm=s[p + "input_layernorm.weight"],
            qkv=self._column_linear(a, ("q", "k", "v")),
            o=self._row_linear(a + "o_proj.weight", s.get(a + "o_proj.bias")),
            q_norm=s.get(a + "q_norm.weight"), k_norm=s.get(a + "k_norm.weight"),
            mlp_norm=s[p + "post_attention_layernorm.weight"],
            gate_up=self._column_linear(m, ("gate", "up")),
            down=self._row_linear(m + "down_proj.weight", s.get(m + "down_proj.bias")),
        )

    def _column_linear(self, prefix: str, projections: tuple[str, ...]) -> LinearFn:
        """q/k/v or gate/up as one map, their outputs concatenated; the weights colocated into one
        matrix first where asked (self.colocated)."""
        names = [f"{prefix}{x}_proj.weight" for x in projections]
        if self.colocated:
            colocate(self.state, names)
        s = self.state
        return self._linear(names, [s[name] for name in names], [s.get(f"{prefix}{x}_proj.bias") for x in projections])

    def _row_linear(self, name: str, bias: torch.Tensor | None) -> ResidualFn:
        """o_proj / down_proj (the state's `name`) added to the residual: plain, or (tensor parallel)
        this rank's input slice + all_reduce."""
        weight = self.state[name]
        if self.tp is None:
            linear = self._linear([name], [weight], [bias])
        else:
            linear = self.tp.row_parallel(self._linear([name], [weight], [None]), bias)
        return add_to_residual(linear, weight, bias, self.fused_residual)

    def _linear(self, names: Sequence[str], weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> LinearFn:
        """make_linear over `weights`; packed, the state's tensors `names` (those weights) leave the
        state dict for `unpacked`, freed once nothing else holds them."""
        if not self.packed:
            return make_linear(weights, biases, False)
        linear, packed = packed_linear(weights, biases)
        self.packed_copies.append(packed)
        for part, name in enumerate(names):
            del self.state[name]
            self.unpacked[name] = (packed, part)
        return linear

    def state_tensor(self, name: str) -> torch.Tensor:
        """One tensor of the whole state dict: the state's own, or a packed weight unpacked into a new one."""
        if name in self.state:
            return self.state[name]
        packed, part = self.unpacked[name]
        return packed.unpacked()[part]

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole state dict: the state's own tensors, and the packed weights unpacked into new
        plain tensors (bit for bit the loaded values; a copy of each while it is held)."""
        state = dict(self.state)
        parts: dict[int, tuple[torch.Tensor, ...]] = {}
        for name, (packed, part) in self.unpacked.items():
            if id(packed) not in parts:
                parts[id(packed)] = packed.unpacked()
            state[name] = parts[id(packed)][part]
        return state

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm (see rms_norm): in one op where `fused_norm` (the default in a reduced dtype on
        CUDA: 6 kernels fewer per layer); in a Triton kernel where `triton_norm`."""
        return rms_norm(x, weight, self.cfg.rms_norm_eps, self.fused_norm, self.triton_norm)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: FullKVCache | None,
        tree_mask: torch.Tensor | None = None,
        logits_rows: torch.Tensor | slice | None = None,
        queries: list[torch.Tensor] | None = None,
        decoded: bool = False,
        prompt_last: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions: [T] long (positions on the host or the device; dynamic NTK rope reads their
        maximum, a wait for the device where they live there). Writes T KV entries at the cache's end (advancing it) and
        returns logits [T', V] (float32, float64 for float64 models) for `logits_rows` (default all T) and the last layer's
        pre-norm hidden states [T, hidden]. Without a cache, attention is causal among the tokens.
        If `queries` is a list, each layer appends the last token's query [H, D] (after rope).
        `decoded` (implied by a tree mask): rows that AR decodes one at a time, which dynamic NTK
        rope then rotates as AR's decode step at each row's position does (runtime/rope.py).
        `prompt_last`: the last position of the prompt this forward is a chunk of; dynamic NTK rope rotates
        every row with that prompt's frequencies, as one forward of the whole prompt (transformers') does."""
        cfg = self.cfg
        t = int(tokens.shape[0])
        start = cache.reserve(t) if cache is not None else 0
        s = start + t
        max_position: int | None = 0
        if cfg.rope_type == "dynamic":
            max_position = None if decoded or tree_mask is not None else (
                prompt_last if prompt_last is not None else int(positions.max()))
        cos, sin = self.rope.cos_sin(positions.to(self.device), max_position, self.dtype)  # [T, 1, D]
        masks = self.attention.masks(t, start, cfg.group_size, tree_mask)

        def attend(n: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if cache is not None:
                cache.k[n, :, start:s] = k.transpose(0, 1)  # [Hkv, T, D]
                cache.v[n, :, start:s] = v.transpose(0, 1)
                keys, values = cache.k[n], cache.v[n]  # [Hkv, C, D]; attention reads [0, S)
            else:
                keys, values = k.transpose(0, 1), v.transpose(0, 1)
            return self.grouped(q, lambda qg: self.attention.attend(qg, keys, values, masks))

        x = self.layers_forward(F.embedding(tokens.to(self.device), self.embed), cos, sin, attend, queries)
        if cache is not None:
            cache.length = s
        return self.logits(x if logits_rows is None else x[logits_rows]), x

    def grouped(self, q: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Group query heads by their KV head so K/V are read once: q [T, H, D] -> qg [Hkv, G*T, D]
        (row g*T + t), attend(qg) -> [Hkv, G*T, D], back to [T, H*D]."""
        cfg = self.cfg
        t, h, hkv, g, d = q.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.group_size, cfg.head_dim
        if t == 1:  # decoding: grouping is a view, and so is the way back
            return attend(q.view(hkv, g, d)).reshape(1, h * d)
        qg = q.reshape(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d)
        o = attend(qg)  # [Hkv, G*T, D]
        return o.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, h * d)  # [T, H*D]

    def layers_forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn,
                       queries: list[torch.Tensor] | None = None, rotate: RotateFn | None = None) -> torch.Tensor:
        """The decoder layers on embeddings x [T, hidden]; attend(layer, q [T, H, D], k, v [T, Hkv, D])
        stores the new keys/values wherever its cache lives and returns attention [T, H*D]. `rotate`
        (a model without q/k norms): rope and the cache writes in one, instead of apply_rope here and
        the writes in attend."""
        cfg = self.cfg
        t = x.shape[0]
        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        for n, w in enumerate(self.layers):
            a = self.norm(x, w.attn_norm)
            qkv = w.qkv(a)  # [T, (H + 2 Hkv) D]
            if rotate is not None:
                q, k, v = rotate(n, qkv)
            else:
                qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)  # [T, H + Hkv, D]
                v = qkv[:, (h + hkv) * d :].view(t, hkv, d)  # [T, Hkv, D]
                if w.q_norm is not None:
                    assert w.k_norm is not None  # (check_state_dict: a qk_norm model has both, others neither)
                    qk = torch.cat([self.norm(qk[:, :h], w.q_norm), self.norm(qk[:, h:], w.k_norm)], dim=1)
                qk = apply_rope(qk, cos, sin, self.fused_rope)  # queries and keys rotated together
                q, k = qk[:, :h], qk[:, h:]  # [T, H, D], [T, Hkv, D]
            if queries is not None:
                queries.append(q[-1])
            x = w.o(attend(n, q, k, v), x)  # (x is this forward's own tensor: a fused add writes into it)
            x = w.down(self.swiglu(w.gate_up(self.norm(x, w.mlp_norm))), x)
        return x

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2 I] (gate, up) -> silu(gate) * up [T, I]: two ops, or one Triton kernel (triton_kernels)."""
        if self.triton_kernels:
            return silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
        return F.silu(gate) * up

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden states [T, hidden] -> logits [T, V] (float32, float64 for float64 models)."""
        return self.lm_head(self.norm(hidden, self.final_norm)).to(self.acc_dtype)

    def prefill(self, tokens: torch.Tensor, cache: FullKVCache, chunk: int, decoded_from: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed a prompt in chunks (no [S, S] mask is ever built); return the last token's
        logits [V] and hidden state [hidden]. `decoded_from`: where generated tokens begin (a
        resumed run), which are fed in chunks of their own as `decoded` rows (see forward).
        `progress(read, total)`: called after each chunk (a long context takes minutes on a CPU)."""
        if tokens.numel() == 0:
            raise LongswiftError("the prompt is empty: give at least one token of prompt text")
        logits = hidden = None
        n = int(tokens.numel())
        cut = n if decoded_from is None else min(decoded_from, n)
        spans = [(lo, min(lo + chunk, cut), False) for lo in range(0, cut, chunk)]
        spans += [(lo, min(lo + chunk, n), True) for lo in range(cut, n, chunk)]
        prompt_last = cache.length + cut - 1  # each prompt chunk is rotated as a part of the whole prompt
        for lo, hi, decoded in spans:
            pos = torch.arange(cache.length, cache.length + hi - lo, device=self.device)
            logits, hidden = self.forward(tokens[lo:hi], pos, cache, logits_rows=slice(-1, None), decoded=decoded,
                                          prompt_last=prompt_last)
            if progress is not None:
                progress(hi, n)
        assert logits is not None and hidden is not None  # (a prompt of at least one token: one chunk or more)
        return logits[0], hidden[-1]
