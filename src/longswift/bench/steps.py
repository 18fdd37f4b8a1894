"""`longswift bench-steps`: per-step costs of AR and TokenSwift on random weights of a real model's
shape, at long contexts, without a checkpoint or a prefill. The caches are filled with random keys
and values and their lengths set (the values do not change the cost); each step is the real stage
function (tokenswift.draft / verify, the lossless walk) timed as median of repetitions, and the
cache is cut back after each so every repetition sees the same context."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import GenerationConfig, ModelConfig, RuntimeConfig, SamplingConfig, SpecConfig, dtype_name, seed_problem
from ..errors import LongswiftError
from ..runtime.cuda_graphs import resolve_attention, use_graphs
from ..runtime.linear import float32_head_copy, float32_head_packed
from ..runtime.memory import GiB, MemoryPlan, available_bytes, loading_bytes, plan_memory, size_text
from ..runtime.model import Transformer, fused_kernels
from ..runtime.triton_kernels import triton_unavailable
from ..sampling import draw, penalty_window, transform, uniforms
from ..spec.budget import (draft_cache_tokens, draft_levels, held_logit_rows, step_budget, tree_budget, walk_rows,
                           will_pack)
from ..spec.heads import DraftHeads, new_heads
from ..spec.ngram import NGRAM_N
from ..spec.tokenswift import BATCH_FROM_TOKENS, BATCHED_LOGITS_NODES, TokenSwiftState, Verified, draft, verify
from ..spec.tree import Trie
from ..spec.verify import batched_walk, lossless_walk
from ..stats import GenerationStats
from .machine import processor_name
from .projection import Projection, StepCosts, check_alpha, floor_seconds, project, tokens_per_step
from .shapes import SHAPES, check_shape, random_state, shape_config, weight_bytes_read
from .step_defaults import CPU_CONTEXTS, GPU_CONTEXTS, GPU_NEW_TOKENS, PAPER_PREFIX, REPS, SEED, TREE_NODES, WARMUP
from .timing import last_level_cache_bytes, measure_bandwidth, median_seconds, synchronizer


@dataclass
class StepBenchConfig:
    """What to measure and what to project. Contexts count the entries in the KV cache when a step runs."""

    shape: str
    layers: int | None = None  # None: the shape's real depth
    contexts: tuple[int, ...] | None = None  # None: GPU_CONTEXTS on CUDA, CPU_CONTEXTS on CPU
    tree_nodes: tuple[int, ...] = TREE_NODES  # verify-pass sizes (root included)
    reps: int = REPS
    warmup: int = WARMUP
    alphas: tuple[float, ...] = ()  # acceptance rates to project with; empty: no projection
    prefix: int = PAPER_PREFIX
    new_tokens: int | None = None  # None: GPU_NEW_TOKENS on CUDA, up to the largest context on CPU
    spec: SpecConfig = field(default_factory=SpecConfig)
    bandwidth_mib: int | None = None  # read-bandwidth buffer; None: max(1 GiB, 4x the last-level cache)
    seed: int = SEED

    def __post_init__(self) -> None:
        if (problem := seed_problem(self.seed)) is not None:
            raise LongswiftError(problem)
        check_shape(self.shape, self.layers)
        if self.contexts is not None and (not self.contexts or min(self.contexts) <= 0):
            raise LongswiftError(f"--contexts must be positive token counts, got {list(self.contexts)}")
        if not self.tree_nodes or min(self.tree_nodes) <= 0:
            raise LongswiftError(f"--tree-nodes must be positive node counts, got {list(self.tree_nodes)}")
        if self.reps <= 0:
            raise LongswiftError(f"--reps must be positive, got {self.reps}")
        if self.warmup < 0:
            raise LongswiftError(f"--warmup must be >= 0, got {self.warmup}")
        for a in self.alphas:
            check_alpha(a)
        if self.prefix <= 0:
            raise LongswiftError(f"--prefix must be positive, got {self.prefix}")
        if self.new_tokens is not None and self.new_tokens <= 0:
            raise LongswiftError(f"--new-tokens must be positive, got {self.new_tokens}")
        if self.bandwidth_mib is not None and self.bandwidth_mib <= 0:
            raise LongswiftError("--bandwidth-mib must be positive")

    def for_device(self, device: torch.device) -> StepBenchConfig:
        """Fill in the per-device defaults (contexts, projected tokens, TokenSwift tree)."""
        cuda = device.type == "cuda"
        contexts = self.contexts or (GPU_CONTEXTS if cuda else CPU_CONTEXTS)
        new_tokens = self.new_tokens
        if new_tokens is None:
            new_tokens = GPU_NEW_TOKENS if cuda else max(contexts) - self.prefix
            if new_tokens <= 0 and self.alphas:
                default = " (the default: the paper's prompt)" if self.prefix == PAPER_PREFIX else ""
                raise LongswiftError(f"--prefix {self.prefix}{default} is not below the largest context {max(contexts)}, "
                                     "where a CPU projection ends: give a smaller --prefix, or --new-tokens (which "
                                     "also measures the contexts from --prefix to --prefix + --new-tokens)")
        return dataclasses.replace(self, contexts=tuple(contexts), new_tokens=max(new_tokens, 1),
                                   spec=self.spec.for_device(device))

    @property
    def projection_nodes(self) -> int:
        """Verify-pass size of the projected tree: a full step's trie budget of --tree and --ngram-topk,
        at most --max-nodes (an upper bound)."""
        return step_budget(self.spec)

    @property
    def depth(self) -> int:
        """Draft positions per step (alpha's denominator): the drafted tree's depth (the fused mode drops
        --tree's first), or an n-gram path's if deeper; at most what a trie cut to --max-nodes holds (its
        nodes below the root in one chain), as generation counts the deepest position of the trie it verifies."""
        deepest = max(len(draft_levels(self.spec)), NGRAM_N if self.spec.ngram_topk else 0)
        return min(deepest, self.projection_nodes - 1)

    @property
    def drafts_on_partial(self) -> bool:
        """Whether the projected run drafts on a partial cache: the paper draft mode, without --draft-cache
        full, on a run that outgrows the draft budget."""
        return bool(draft_cache_tokens(self.spec, self.prefix + (self.new_tokens or 0)))

    @property
    def refill_budget(self) -> int | None:
        """The context past which the projected run refills its partial cache every --draft-window
        tokens; None where it never does: the fused mode and --draft-cache full have no partial cache,
        a run that stays within the budget never drafts on one, and a static one is selected once (a
        one-off the projection leaves out) and after that only restarts its window."""
        dynamic = self.spec.draft_cache == "dynamic"
        return self.spec.draft_kv_budget if dynamic and self.drafts_on_partial else None

    def measured_contexts(self) -> tuple[int, ...]:
        """The contexts asked for, plus (when projecting) the projection's ends and the draft budget
        inside it, so that the projection interpolates between measurements and never extrapolates."""
        extra: set[int] = set()
        if self.alphas:
            lo, hi = self.prefix, self.prefix + self.new_tokens  # type: ignore[operator]
            budget = self.refill_budget
            extra = {lo, hi} | ({budget} if budget is not None and lo < budget < hi else set())
        return tuple(sorted(set(self.contexts or ()) | extra))

    @property
    def state_spec(self) -> SpecConfig:
        """The spec of the rig's TokenSwiftState: n-grams only shape the trie, which the rig builds itself."""
        return dataclasses.replace(self.spec, ngram_topk=0)

    def measured_nodes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.tree_nodes) | ({self.projection_nodes} if self.alphas else set())))


@dataclass
class ContextCosts:
    """Median seconds of each step at one context."""

    context: int
    ar: float  # the AR step as generation runs it here (where graphs are on, a replay of the draw and forward)
    draft: float
    draft_cache: int  # entries the draft pass attends to (the partial cache past the budget)
    reselect: float | None  # a draft step that refills the partial cache; None below the budget
    walk_row: float  # LM head on one row + transform + draw (a row the verify pass did not compute)
    walk_row_cached: float  # transform + draw of a row whose logits the verify pass computed
    verify: dict[int, float]  # tree nodes -> seconds of the verify forward (no LM head; with it for the batched walk)
    logits_rows: dict[int, float]  # rows (a trie of <= BATCHED_LOGITS_NODES nodes, a spine) -> their LM head at once
    ar_eager: float | None = None  # the same AR step run eagerly, where `ar` is a graph replay
    # tree nodes -> the batched walk (every row transformed and drawn, one device read), where the
    # spec walks batched (the GPU default); empty for the row walk
    walk_batched: dict[int, float] = field(default_factory=dict)
    spread: float = 1.0  # the largest of the costs' slowest repetition over its median (timing.median_seconds)


@dataclass
class StepBenchResult:
    identity: dict
    bandwidth: float  # bytes/s
    bandwidth_buffer: int  # bytes summed to measure it
    weight_bytes: int  # read by one decoding step
    kv_bytes_per_token: int
    costs: list[ContextCosts]
    projections: list[Projection]
    config: StepBenchConfig

    def floor(self, context: int) -> float:
        return floor_seconds(self.weight_bytes, context * self.kv_bytes_per_token, self.bandwidth)


def plan_steps(cfg: ModelConfig, bench: StepBenchConfig, dtype: torch.dtype, device: torch.device,
               packed: bool, gamma: int, float32_logits: bool = False) -> MemoryPlan:
    """Memory of the run as StepRig allocates it: weights (the untied LM head shares the embedding,
    so packed, its packed copy is an extra table, as a tied head's is), heads, the full cache at the
    largest context + the largest tree, the partial cache, transients."""
    max_ctx, max_nodes = max(bench.measured_contexts()), max(bench.measured_nodes())
    state_spec = bench.state_spec
    total = max_ctx + 1 + max_nodes  # TokenSwiftState's prompt + new tokens
    draft = draft_cache_tokens(state_spec, total)
    plan = plan_memory(cfg, dtype, device, total + tree_budget(state_spec), 1, packed,
                       draft + 1 if draft else 0, max_nodes, float32_logits,
                       walk_rows(state_spec, max_nodes),  # the rig builds its own tries
                       held_logit_rows(state_spec, max_nodes))
    elem = torch.empty((), dtype=dtype).element_size()
    shared = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size * elem
    heads = gamma * cfg.hidden_size * (cfg.hidden_size + 2) * elem
    # The float32 head off CUDA is already counted as a copy whose original stays; otherwise packing
    # the shared head cannot free its original (the embedding holds it).
    head_copy = shared if packed and not float32_head_copy(float32_logits, dtype, device) else 0
    # (and what building holds beside the weights, with no untied head to pack)
    loading = loading_bytes(dataclasses.replace(cfg, tie_word_embeddings=True), elem, packed, True,
                            float32_head_packed(float32_logits, dtype, device))
    return dataclasses.replace(plan, weights=plan.weights - shared + heads,
                               packed_weights=plan.packed_weights + head_copy, loading=loading)


def check_fits(plan: MemoryPlan, buffer_bytes: int, dtype: torch.dtype) -> None:
    free = available_bytes(torch.device(plan.device))
    if free is None:
        return
    if buffer_bytes > free:  # the bandwidth buffer is freed before the model is made
        raise LongswiftError(f"the read-bandwidth buffer of {buffer_bytes / 2**20:.0f} MiB does not fit in the "
                             f"{size_text(free)} free: give a smaller --bandwidth-mib")
    if plan.needed(weights_loaded=False) > free:
        narrower = ", or use --dtype bfloat16" if dtype.itemsize > 2 else ""  # (not where it is already that narrow)
        raise LongswiftError(f"not enough memory for these step costs: {plan.describe()}, but {size_text(free)} "
                             "is free; lower --contexts (or --prefix + --new-tokens), --tree-nodes or --layers"
                             + narrower)


def bandwidth_buffer_bytes(bench: StepBenchConfig, device: torch.device) -> int:
    if bench.bandwidth_mib is not None:
        return bench.bandwidth_mib * 2**20
    return max(GiB, 4 * last_level_cache_bytes(device))


def random_trie(nodes: int, depth: int, root: int, gen: torch.Generator) -> Trie:
    """A trie of exactly `nodes` nodes (root included) and at most `depth` levels below the root:
    each new node hangs under a random node that is not yet at the bottom."""
    trie = Trie.with_root(root)
    while len(trie) < nodes:
        open_nodes = [i for i, d in enumerate(trie.depths) if d < depth]
        parent = open_nodes[int(torch.randint(len(open_nodes), (), generator=gen))]
        path = [trie.tokens[i] for i in trie.path(parent)]
        trie.add_path([*path, len(trie.children[parent])], 0)  # a token no sibling has
    return trie


class StepRig:
    """A TokenSwift state over random caches; `at(context)` sets the cache lengths, and each step
    method runs one step there and leaves the caches as they were."""

    def __init__(self, model: Transformer, heads: DraftHeads, bench: StepBenchConfig, graphs: bool = False,
                 graph_attention: str = "bucketed") -> None:
        self.model, self.bench = model, bench
        self.gen = torch.Generator().manual_seed(bench.seed)
        self.sampling = SamplingConfig()  # the paper's sampling: min-p 0.1, penalty 1.2 over 1024 tokens
        max_ctx, max_nodes = max(bench.measured_contexts()), max(bench.measured_nodes())
        prompt = torch.randint(model.cfg.vocab_size, (max_ctx + 1,), generator=self.gen).tolist()
        gen_cfg = GenerationConfig(max_new_tokens=max_nodes, ignore_eos=True, prefill_chunk=1)  # no prefill
        self.s = TokenSwiftState(model, heads, prompt, [], self.sampling, gen_cfg, bench.state_spec,
                                 GenerationStats("tokenswift", len(prompt)), frozenset(), self.gen, graphs,
                                 graph_attention=graph_attention)
        caches = [self.s.full] + ([self.s.partial] if self.s.partial is not None else [])
        for cache in caches:  # [L, Hkv, C, D] random keys and values
            cache.k.normal_()
            cache.v.normal_()
        self.hidden = torch.randn(1, model.cfg.hidden_size, generator=self.gen).to(model.device, model.dtype)
        self.s.prev_hidden = self.hidden[0]  # the fused mode drafts from the state that predicted the root
        self.root = prompt[-1]
        self.context = 0
        self.graphs = self.s.graphs.get(id(self.s.full))  # CUDA: the state's step bodies on the full cache
        self.last_logits: torch.Tensor | None = None  # [V] what a replayed AR step draws from
        self.u: torch.Tensor | None = None

    def at(self, context: int) -> None:
        """The state of a step at `context`: that many entries cached, the root at position `context`."""
        self.context = context
        self.s.n = context + 1
        self.s.full.length = context  # capacity covers the largest context and tree

    @property
    def past_budget(self) -> bool:
        return self.s.partial is not None and self.context >= self.bench.spec.draft_kv_budget

    def average_window(self, window: int) -> int:
        """The recent window's average fill over the draft passes: a dynamic cache's fills from empty to full
        between refills (half full), a static one's slides from its newest half to full (three quarters)."""
        return window // 2 if self.bench.spec.draft_cache == "dynamic" else 3 * window // 4

    def ar_step(self, replay: bool = False) -> None:
        """What ar_steps does per token: with `replay`, as generation runs it on CUDA, one step body
        (a graph's replay) that draws the token from the last logits (transform, draw) and forwards it
        (runtime.blocks, StepGraphs.sample_decode); else the model's eager forward of the last token,
        then the transform and draw."""
        model, s = self.model, self.s
        if replay:
            graphs = self.graphs
            assert graphs is not None
            if self.last_logits is None:
                # The replay writes each drawn token into the history it is bound to: a scratch copy, so
                # the state's history (the other steps' penalty windows) stays as set up.
                graphs.bind_sampling(s.history_dev.clone(), self.sampling)
                self.last_logits = model.logits(self.hidden)[0]
                self.u = uniforms(self.gen, 1).to(model.device)  # one block's uniform (a block draws its own once)
            self.last_logits = graphs.sample_decode(self.last_logits, self.u, self.context)[0]
            s.full.truncate(self.context)
            return
        token = torch.tensor([self.root], device=model.device)
        logits, _ = model.forward(token, torch.tensor([self.context], device=model.device), s.full)
        s.full.truncate(self.context)
        window = penalty_window(s.history, s.n, self.sampling.penalty_window).to(logits.device)
        draw(transform(logits, window[None], self.sampling)[0], self.sampling, self.gen)

    def draft_step(self) -> None:
        draft(self.s)  # on the partial cache past the budget (selected by reselect_step), else the full cache

    def reselect_step(self) -> None:
        """A draft step whose window is full: draft on the full cache, then refill the partial cache."""
        self.s.partial.selected = False  # type: ignore[union-attr]
        draft(self.s)

    def verify_step(self, trie: Trie) -> None:
        verify(self.s, trie)
        self.s.full.truncate(self.context)

    def walk_row(self, logits: torch.Tensor | None = None) -> None:
        """One row of the lossless walk: the LM head on one hidden state (unless its `logits` [V] are
        given, as verify computes them for small tries), transform, draw."""
        v = Verified(self.model, self.hidden, {} if logits is None else {0: logits})
        lossless_walk(Trie.with_root(self.root), v.row_logits, self.s.history, self.s.n, self.sampling, self.gen)

    def walk_all(self, trie: Trie, logits: torch.Tensor) -> None:
        """The batched walk over a trie's rows, given their logits [N, V] (the verify pass computed them)."""
        batched_walk(trie, logits, self.s.history_dev, self.s.n, self.sampling, self.gen)

    def measure(self, context: int, tries: dict[int, Trie], sync: Callable[[], None]) -> ContextCosts:
        b = self.bench
        self.at(context)
        spreads: list[float] = []

        def timed(fn: Callable[..., object]) -> float:  # (called bare; `...`: mypy infers no lambda with defaults)
            return median_seconds(fn, b.reps, b.warmup, sync, spreads)

        ar = ar_eager = timed(self.ar_step)
        if self.graphs is not None:
            ar = timed(lambda: self.ar_step(replay=True))
        reselect, draft_cache = None, context
        if self.past_budget:
            partial = self.s.partial
            assert partial is not None  # (past_budget)
            reselect = timed(self.reselect_step)  # leaves the partial cache selected, its window empty
            partial.length = partial.window_start + self.average_window(partial.window)
            draft_cache = partial.length
        draft_s = timed(self.draft_step)
        verify_s = {n: timed(lambda t=t: self.verify_step(t)) for n, t in tries.items()}
        logits = self.model.logits(self.hidden)[0]
        rows = self.hidden.expand(max(tries), -1).contiguous()  # [N, hidden]
        # A small trie's rows, and a large one's spine (its heads' first candidates: depth + 1 rows), in one pass
        counts = {n for n in tries if n <= BATCHED_LOGITS_NODES}
        if max(tries) > BATCHED_LOGITS_NODES:
            counts.add(min(self.bench.depth + 1, max(tries)))
        logits_rows = {n: timed(lambda n=n: self.model.logits(rows[:n])) for n in sorted(counts)}
        walk_batched = {}
        if self.s.batched:
            every = self.model.logits(rows)  # [N, V]
            walk_batched = {n: timed(lambda n=n, t=t: self.walk_all(t, every[:n])) for n, t in tries.items()}
        walk_row, walk_row_cached = timed(self.walk_row), timed(lambda: self.walk_row(logits))
        return ContextCosts(context, ar, draft_s, draft_cache, reselect, walk_row, walk_row_cached, verify_s,
                            logits_rows, ar_eager if self.graphs is not None else None, walk_batched, max(spreads))


def identity(bench: StepBenchConfig, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
             linears: dict[str, bool], gamma: int, command: str | None, runtime: RuntimeConfig,
             graphs_replayed: bool = False) -> dict:
    """What was measured and how; `graphs_replayed`: whether the steps ran as CUDA graphs (--cuda-graphs auto says
    only that they would where they can)."""
    full_layers = SHAPES[bench.shape]["num_hidden_layers"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"shape": bench.shape, "layers": cfg.num_layers, "full_layers": full_layers,
            "model": f"random weights of the {bench.shape} shape ({cfg.num_layers} of {full_layers} layers)",
            "dtype": dtype_name(dtype), "device": str(device), "device_name": name,
            # (the report's machine line names the processor that ran the steps, a GPU's name on CUDA, as bench's
            # does; and a rope scaling, which can keep CUDA graphs off: neither was said; found by review)
            "processor": processor_name(device),
            **({"rope_scaling": runtime.rope_scaling} if runtime.rope_scaling else {}),
            **linears, "cuda_graphs": runtime.cuda_graphs, "graphs_replayed": graphs_replayed,
            "graph_attention": resolve_attention(runtime.graph_attention, device),
            "float32_logits": runtime.float32_logits, **({"triton_kernels": True} if runtime.triton_kernels else {}),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "heads": f"{gamma} random draft heads", "gamma": gamma, "context_limit": cfg.context_limit,
            "command": command or "longswift bench-steps (from the Python API)"}


def run_bench_steps(bench: StepBenchConfig, runtime: RuntimeConfig, command: str | None = None,
                    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> StepBenchResult:
    """Plan memory, measure bandwidth, build the random model, time every step at every context, project."""
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    device, dtype = runtime.torch_device(), runtime.torch_dtype()
    if runtime.triton_kernels and (why := triton_unavailable(device)) is not None:  # (before the weights are drawn)
        raise LongswiftError(f"triton_kernels (--triton-kernels): {why}")
    bench = bench.for_device(device)
    assert bench.new_tokens is not None  # (for_device resolved it)
    cfg = shape_config(bench.shape, bench.layers, runtime.rope_scaling)
    packed = will_pack(runtime)
    gamma = max(3, len(bench.spec.levels) - 1)
    buffer = bandwidth_buffer_bytes(bench, device)
    plan = plan_steps(cfg, bench, dtype, device, packed, gamma, runtime.float32_logits)
    check_fits(plan, buffer, dtype)
    log(f"memory plan: {plan.describe()}")
    sync = synchronizer(device)
    bandwidth = measure_bandwidth(device, buffer)
    log(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    with torch.no_grad():
        state = random_state(cfg, dtype, device, bench.seed)
        heads = new_heads(cfg, state, gamma).randomize(bench.seed)
    # pack: oneDNN-packed copies where they exist, else (CUDA) q/k/v and gate/up colocated, as for a loaded file
    model = Transformer(cfg, state, pack=runtime.pack_weights is not False, float32_logits=runtime.float32_logits,
                        triton_kernels=runtime.triton_kernels)
    linears = {"packed_linears": model.packed, "colocated_linears": model.colocated,
               **({"fused_kernels": True} if fused_kernels(model) else {})}
    costs = []
    with torch.inference_mode():
        rig = StepRig(model, heads, bench, graphs=use_graphs(runtime.cuda_graphs, model),
                      graph_attention=resolve_attention(runtime.graph_attention, device))
        gen = torch.Generator().manual_seed(bench.seed)
        tries = {n: random_trie(n, bench.depth, rig.root, gen) for n in bench.measured_nodes()}
        for c in bench.measured_contexts():
            t0 = time.perf_counter()
            costs.append(rig.measure(c, tries, sync))
            eager = "" if costs[-1].ar_eager is None else f" (eager {costs[-1].ar_eager * 1e3:.2f} ms)"
            log(f"context {c}: AR {costs[-1].ar * 1e3:.2f} ms{eager}, draft {costs[-1].draft * 1e3:.2f} ms "
                f"({time.perf_counter() - t0:.1f} s)")
    replayed = rig.graphs is not None and rig.graphs.capture  # (where --cuda-graphs auto found them supported)
    del rig, model, state, heads
    bandwidth = max(bandwidth, measure_bandwidth(device, buffer))
    projections = [project(step_costs(costs, bench.projection_nodes, tokens_per_step(a, bench.depth), bench.spec.walk,
                                      bench.depth + 1),
                           bench.prefix,
                           bench.new_tokens, a, bench.depth, bench.refill_budget, bench.spec.draft_window)
                   for a in bench.alphas]
    return StepBenchResult(identity(bench, cfg, dtype, device, linears, gamma, command, runtime, replayed), bandwidth,
                           buffer,
                           weight_bytes_read(cfg, dtype, float32_head_copy(runtime.float32_logits, dtype, device)),
                           cfg.kv_bytes_per_token(dtype), costs, projections, bench)


def step_costs(costs: list[ContextCosts], nodes: int, tokens_per_step: float, walk: str = "rows",
               spine: int | None = None) -> StepCosts:
    """The projection's inputs: every measured context, with the verify cost of `nodes` nodes. The
    batched walk (`walk`) costs its verify pass (LM head of every row included) plus one walk over all
    rows per step. The row walk: where generation computes the LM head of rows in the verify pass
    (steps emitting enough tokens: a small trie's every row, a larger one's `spine` rows, the heads'
    first candidates), that pass's cost is counted instead of one LM head per walk row (for a spine,
    as if the walk stayed on it)."""
    if walk == "batched":
        return StepCosts(tuple(c.context for c in costs), tuple(c.ar for c in costs), tuple(c.draft for c in costs),
                         tuple(c.verify[nodes] + c.walk_batched[nodes] for c in costs), tuple(0.0 for _ in costs),
                         tuple(c.reselect for c in costs))
    rows = nodes if nodes <= BATCHED_LOGITS_NODES else spine
    batched = tokens_per_step >= BATCH_FROM_TOKENS and rows is not None and all(rows in c.logits_rows for c in costs)
    return StepCosts(tuple(c.context for c in costs), tuple(c.ar for c in costs), tuple(c.draft for c in costs),
                     tuple(c.verify[nodes] + (c.logits_rows[rows] if batched and rows is not None else 0.0)
                           for c in costs),
                     tuple(c.walk_row_cached if batched else c.walk_row for c in costs),
                     tuple(c.reselect for c in costs))
