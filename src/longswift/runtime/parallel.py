"""Tensor parallelism over torch.distributed: which part of the checkpoint each rank holds, the
collectives the runner needs, and rank 0's decisions broadcast to every rank.

A rank holds a contiguous block of query heads with the KV heads they read (and so only those
heads' KV cache), a block of the MLP's intermediate columns, and a block of vocabulary rows of
the LM head; embeddings, norms and draft heads are replicated. Each decoder layer then needs two
all_reduce (after o_proj and after down_proj) and the LM head one all_gather. A single process
never builds a TensorParallel, so its hot path has no collectives and no extra branches."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..config import ModelConfig, RuntimeConfig, SamplingConfig
from ..errors import AgreedError, LongswiftError, LostContact
from ..sampling import draw
from .linear import LinearFn
from .torchrun_env import env_local_rank, env_rank, env_world_size


@dataclass(frozen=True)
class ShardPlan:
    """The part of a model one rank holds; ranges are [start, stop) in the full model's indices."""

    rank: int
    world: int
    heads: tuple[int, int]  # query heads
    kv_heads: tuple[int, int]  # the KV heads those queries read
    kv_replicas: int  # ranks holding the same KV heads: 1 when KV heads are split, >1 when replicated
    intermediate: tuple[int, int]  # MLP columns of gate/up = rows of down's input
    vocab: tuple[int, int]  # LM head rows
    vocab_per_rank: int  # every rank's LM head block is padded to this many rows (all_gather needs equal sizes)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside a world of {self.world}")


def collective(call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)`, a torch.distributed call that every rank makes; its failure (torch
    raises RuntimeError: another rank exited, or the ranks fell out of step and timed out) becomes
    a one-line LostContact instead of gloo's traceback."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as exc:
        text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip())  # gloo starts with "[file:line] "
        why = re.split(r"\.\s|\n", text)[0] or type(exc).__name__  # its first sentence
        raise LostContact(f"lost contact with the other processes of this run ({why}): one of them failed or "
                          "stopped (an error it printed, a stop, its output closed, or it was killed)") from exc


def _works(cfg: ModelConfig, world: int) -> bool:
    h, hkv = cfg.num_heads, cfg.num_kv_heads
    return h % world == 0 and cfg.intermediate_size % world == 0 and (hkv % world == 0 or world % hkv == 0)


def working_world_sizes(cfg: ModelConfig) -> list[int]:
    """Every world size this model can be split across (1 always works)."""
    return [w for w in range(1, cfg.num_heads + 1) if _works(cfg, w)]


def plan_shards(cfg: ModelConfig, rank: int, world: int) -> ShardPlan:
    """Split heads, KV heads, MLP columns and vocabulary across `world` ranks, or refuse in one line.

    KV heads are split when `world` divides them; when there are fewer KV heads than ranks and
    `world` is a multiple of them, each rank holds the one KV head its query block reads (copies
    of that head live on world / kv_heads ranks)."""
    h, hkv, i = cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    if not _works(cfg, world):
        if h % world:
            why = f"its {h} attention heads do not split into {world} equal parts"
        elif i % world:
            why = f"its intermediate size {i} does not split into {world} equal parts"
        else:
            why = f"its {hkv} KV heads neither split into {world} parts nor divide {world}"
        sizes = ", ".join(str(w) for w in working_world_sizes(cfg))
        raise LongswiftError(f"cannot run this model on {world} processes: {why}; world sizes that work: {sizes}")
    per_head = h // world
    heads = (rank * per_head, (rank + 1) * per_head)
    if hkv % world == 0:
        per_kv = hkv // world
        kv_heads, replicas = (rank * per_kv, (rank + 1) * per_kv), 1
    else:
        replicas = world // hkv
        kv = rank // replicas  # the query block [heads) lies inside this KV head's group
        kv_heads = (kv, kv + 1)
    per_i = i // world
    per_v = -(-cfg.vocab_size // world)
    v0 = min(rank * per_v, cfg.vocab_size)
    return ShardPlan(rank, world, heads, kv_heads, replicas, (rank * per_i, (rank + 1) * per_i),
                     (v0, min(v0 + per_v, cfg.vocab_size)), per_v)


def shard_config(cfg: ModelConfig, plan: ShardPlan) -> ModelConfig:
    """The config of one rank's shard: its heads, KV heads and MLP width (vocabulary unchanged:
    the LM head gathers full logits)."""
    return dataclasses.replace(cfg, num_heads=plan.heads[1] - plan.heads[0],
                               num_kv_heads=plan.kv_heads[1] - plan.kv_heads[0],
                               intermediate_size=plan.intermediate[1] - plan.intermediate[0])


def shard_state(cfg: ModelConfig, state: dict[str, torch.Tensor], plan: ShardPlan,
                device: torch.device, cut: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """One rank's state dict, on `device`, matching `shard_config`; an untied LM head becomes this
    rank's vocabulary block padded to `vocab_per_rank` rows. Sliced tensors are copies, so the full
    checkpoint can be freed. `cut`: tensors already this rank's part (ShardedRead cut them as they were read)."""
    out: dict[str, torch.Tensor] = {}
    for name, full in state.items():
        t = full if name in cut else shard_tensor(name, full, plan, cfg.head_dim)
        out[name] = t.to(device=device, memory_format=torch.contiguous_format, copy=t is not full)
    return out


# The projections split by rows (weight [out, in] or bias [out]: this rank's outputs), and those split by columns
# (this rank's inputs; their bias is added once, after the all_reduce).
ROW_SPLIT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
COLUMN_SPLIT = ("o_proj", "down_proj")


def shard_tensor(name: str, full: torch.Tensor, plan: ShardPlan, head_dim: int) -> torch.Tensor:
    """This rank's part of one tensor of the whole model's state: a view of it (q/k/v/gate/up rows, o/down
    columns, the LM head's padded vocabulary block), or `full` itself where every rank holds it whole."""
    proj, kind = name.split(".")[-2:]  # e.g. model.layers.N.self_attn.q_proj.weight
    d = head_dim
    if proj in ROW_SPLIT or (proj in COLUMN_SPLIT and kind == "weight"):
        part = {"q_proj": (plan.heads[0] * d, plan.heads[1] * d), "o_proj": (plan.heads[0] * d, plan.heads[1] * d),
                "k_proj": (plan.kv_heads[0] * d, plan.kv_heads[1] * d),
                "v_proj": (plan.kv_heads[0] * d, plan.kv_heads[1] * d)}.get(proj, plan.intermediate)
        return full[slice(*part)] if proj in ROW_SPLIT else full[:, slice(*part)]
    if name == "lm_head.weight":
        return vocab_block(full, plan)
    return full


# What is kept of a tensor ShardedRead cut as it was read: the whole tensor's shape and its tensor_digest.
Whole = tuple[tuple[int, ...], float]


class ShardedRead:
    """Cuts each weight of the decoder's layers to this rank's part as the loader reads it (loading.load_model's
    `shard`), so that a process holds its shard and one weights file at a time, not the whole model (a 70B model's
    140 GB in each of 8 processes). It keeps what the checks need of each whole tensor: its shape (the load's
    check_state_dict) and its digest (TensorParallel.agree compares the whole model's across ranks)."""

    def __init__(self, plan: ShardPlan, head_dim: int, dtype: torch.dtype) -> None:
        self.plan, self.head_dim, self.dtype = plan, head_dim, dtype
        self.whole: dict[str, Whole] = {}  # name -> what is kept of each cut tensor

    def __call__(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """`full`'s part, copied in the run's dtype (one copy: the whole tensor can be freed), or `full` where it is
        not cut here (the LM head, which the load compares with the embedding as stored, is cut by shard_state)."""
        if not name.startswith("model.layers."):
            return full
        part = shard_tensor(name, full, self.plan, self.head_dim)
        if part is full:
            return full
        self.whole[name] = (tuple(full.shape), tensor_digest(full, self.dtype))
        return part.to(dtype=self.dtype, memory_format=torch.contiguous_format, copy=True)


def vocab_block(weight: torch.Tensor, plan: ShardPlan) -> torch.Tensor:
    """Rows `plan.vocab` of an LM head [V, hidden], zero-padded to [vocab_per_rank, hidden]."""
    v0, v1 = plan.vocab
    block = weight[v0:v1]  # a view
    pad = plan.vocab_per_rank - (v1 - v0)
    return torch.cat([block, block.new_zeros(pad, block.shape[1])]) if pad else block


def require_process_group() -> None:
    """Refuse tensor parallelism outside a torch.distributed process group (torchrun's)."""
    if not dist.is_initialized():  # ("start with torchrun" alone misled a script that torchrun had started)
        raise LongswiftError("tensor parallelism needs torch.distributed's default process group: start the processes "
                             "with torchrun and call torch.distributed.init_process_group() in each before loading")


class TensorParallel:
    """This rank's shard of a model and the collectives over `group` (None: the default group).

    Creating it is collective when KV heads are replicated (a process group per KV head)."""

    def __init__(self, cfg: ModelConfig, device: torch.device, group: Any = None) -> None:
        require_process_group()
        self.group, self.device = group, device
        self.plan = plan_shards(cfg, dist.get_rank(group), dist.get_world_size(group))
        self.vocab_size = cfg.vocab_size
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        # Ranks holding copies of the same KV head pool their query groups' scores when the
        # partial cache selects entries, so every copy selects what one process would.
        self.kv_group = None
        if self.plan.kv_replicas > 1:
            ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.plan.world)]
            r = self.plan.kv_replicas
            for k in range(cfg.num_kv_heads):  # every rank creates every subgroup, in the same order
                sub = collective(dist.new_group, ranks[k * r : (k + 1) * r])
                if k == self.plan.kv_heads[0]:
                    self.kv_group = sub

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def world(self) -> int:
        return self.plan.world

    def row_parallel(self, local: LinearFn, bias: torch.Tensor | None) -> LinearFn:
        """A linear whose input features are split across ranks: `local` (this rank's product, no
        bias), all_reduce, bias once."""
        group = self.group

        def reduced(x: torch.Tensor) -> torch.Tensor:
            y = local(x)  # [T, out], this rank's partial sum
            collective(dist.all_reduce, y, group=group)
            return y if bias is None else y + bias

        return reduced

    def vocab_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """This rank's block [vocab_per_rank, hidden] of an LM head: `weight` is the whole head
        [V, hidden] (tied: the embedding) or already this rank's block (returned as it is)."""
        return vocab_block(weight, self.plan) if weight.shape[0] == self.vocab_size else weight

    def vocab_parallel(self, local: LinearFn) -> LinearFn:
        """The LM head from `local`, its product on this rank's vocabulary rows (vocab_rows); returns
        the gathered logits [T, V] on every rank."""
        group, world, vocab = self.group, self.world, self.vocab_size

        def gathered(x: torch.Tensor) -> torch.Tensor:
            y = local(x).contiguous()  # [T, V/world]
            parts = [torch.empty_like(y) for _ in range(world)]
            collective(dist.all_gather, parts, y, group=group)
            return torch.cat(parts, dim=-1)[..., :vocab]  # [T, V]

        return gathered

    def kv_score_reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """For PartialKVCache.select: sums importance scores over the copies of a replicated KV head."""
        if self.kv_group is None:
            return None
        group = self.kv_group

        def reduce(scores: torch.Tensor) -> torch.Tensor:
            collective(dist.all_reduce, scores, group=group)
            return scores

        return reduce

    def broadcast_int(self, value: int) -> int:
        """Rank 0's `value` on every rank (the others' argument is ignored)."""
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        collective(dist.broadcast, t, src=self.src, group=self.group)
        return int(t.item())

    def max_int(self, value: int) -> int:
        """The largest of the ranks' `value`s, on every rank."""
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        collective(dist.all_reduce, t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def agree(self, what: str, value: Any) -> None:
        """Refuse on every rank at once, in one line, a call given another `value` (compared by its
        repr) on some rank: such ranks would run collectives of other shapes (gloo aborts the
        process) or in another order (they wait for each other until the timeout)."""
        digest = int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "little", signed=True)
        mine = torch.tensor([digest], dtype=torch.long, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        collective(dist.all_gather, every, mine, group=self.group)
        other = next((r for r, t in enumerate(every) if not torch.equal(t, every[0])), None)  # the same on every rank
        if other is not None:
            raise AgreedError(f"the processes of this run were given different {what} (rank {other}'s differ from "
                                 "rank 0's): every rank must make the same calls with the same arguments")

    def refuse_together(self, check: Callable[[], None]) -> None:
        """`check()` on every rank, which may refuse (LongswiftError) on some of them only (a rank's own free memory):
        every rank then raises the refusal of the first rank that refused, named (one message on every rank)."""
        mine: tuple[str, str] | None = None
        try:
            check()
        except LongswiftError as exc:
            mine = (str(exc), exc.cli_message)
        first = self.world - self.max_int(self.world - self.rank if mine is not None else 0)  # world: none refused
        if first < self.world:
            said: list[tuple[str, str] | None] = [mine]  # (on this rank's device: NCCL sends from the GPU)
            src = dist.get_global_rank(self.group, first) if self.group is not None else first
            collective(dist.broadcast_object_list, said, src=src, group=self.group, device=self.device)
            refused = said[0]
            assert refused is not None  # (rank `first` refused: its message)
            api, cli = refused
            raise AgreedError(f"on rank {first} of this run's processes: {api}", f"on rank {first} of this run's "
                                 f"processes: {cli}")

    def draw(self, transformed: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
        """`sampling.draw` on rank 0 (its generator alone is consumed), broadcast to every rank."""
        return self.broadcast_int(draw(transformed, cfg, generator) if self.rank == 0 else 0)


def tensor_digest(t: torch.Tensor, dtype: torch.dtype | None = None, samples: int = 4096) -> float:
    """The float64 sum of up to `samples` of a tensor's values, evenly strided (state_digest), each first rounded
    to `dtype` (that of the run, for a tensor read in another: the digest of the tensor the run would hold)."""
    flat = t.detach().reshape(-1)
    picked = flat[:: max(1, flat.numel() // samples)]
    return float((picked if dtype is None else picked.to(dtype)).double().sum())


Digest = list[tuple[str, tuple[int, ...], float]]  # state_digest: (name, shape, tensor_digest) a tensor


def state_digest(state: dict[str, torch.Tensor], whole: dict[str, Whole] | None = None) -> Digest:
    """Each tensor's name, shape and tensor_digest: what ranks compare (TensorParallel.agree) to find another model
    loaded on one of them, reading a few thousand values a tensor rather than every weight. `whole`: those of the
    tensors cut to this rank's part as they were read (ShardedRead.whole), which are the whole model's."""
    whole = whole or {}
    return [(name, *whole[name]) if name in whole else (name, tuple(state[name].shape), tensor_digest(state[name]))
            for name in sorted(state)]


def init_from_env(runtime: RuntimeConfig) -> RuntimeConfig:
    """Join the process group torchrun describes (NCCL for CUDA, gloo for CPU) and return the
    runtime config with this rank's device (cuda:LOCAL_RANK on CUDA)."""
    device = runtime.torch_device()
    if device.type == "cuda":
        local = env_local_rank()
        if local >= torch.cuda.device_count():
            raise LongswiftError(f"rank {env_rank()} wants cuda:{local} but only {torch.cuda.device_count()} "
                                 "CUDA devices are visible: use --nproc-per-node <= the GPU count")
        torch.cuda.set_device(local)
        runtime = dataclasses.replace(runtime, device=f"cuda:{local}")
    if not dist.is_initialized():
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
        if missing:  # (torch's own message is a ValueError traceback)
            raise LongswiftError(f"WORLD_SIZE={env_world_size()} makes this one of several processes, but "
                                 f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: launch "
                                 "with torchrun (torchrun --nproc-per-node N -m longswift ...), which sets them")
        try:
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        except (RuntimeError, ValueError) as exc:
            raise LongswiftError(f"cannot join torchrun's process group: {str(exc).splitlines()[0]}") from None
    return runtime
