"""The TokenSwift loop: each step is draft -> tree -> verify -> accept -> commit.

State between steps: the full KV cache holds the committed context `history[:n-1]`; the root
`history[n-1]` (the last sampled token) is committed output but not yet in the cache."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..errors import ConfigError
from ..runtime.blocks import decode, sample_block
from ..runtime.cache import FullKVCache, PartialKVCache
from ..runtime.cuda_graphs import StepGraphs, padded_nodes, step_bodies
from ..runtime.memory import new_cache
from ..runtime.model import Transformer
from ..sampling import draw, penalty_window, token_history, transform
from ..stats import GenerationStats, StepTokens, finished
from .budget import (BATCHED_LOGITS_NODES, draft_cache_tokens, draft_levels, held_logit_rows, lookup_budget,
                     resolved, suffix_copies, tree_budget, unpruned_budget, walk_rows)
from .heads import DraftHeads
from .ngram import NGRAM_N, NGramTracker, path_scores
from .schedule import FULL, HALF, LOOKUP, NARROW, PLAIN, StepSchedule, step_kinds
from .suffix import REPEAT_HELD, SuffixIndex
from .tree import NGRAM, Trie
from .verify import Walk, batched_walk, lossless_walk

NARROW_NGRAM_TOPK = 1  # a NARROW step's n-gram paths per depth-1 token (schedule.NARROW)


@dataclass
class Draft:
    """Candidate tokens per tree depth (after the logits transform), and their log-probabilities
    where the trie may outgrow its node budget (they rank its nodes), else None."""

    levels: list[list[int]]
    logprobs: list[list[float]] | None = None


# The walk visits 1 + accepted rows of the trie, and each LM-head pass reads the whole head
# (SmolLM2 on this CPU: 1 row 4.7 ms, 8 rows 5.8 ms, 16 rows 7.4 ms, 40 rows 13 ms). So while steps
# have been emitting at least BATCH_FROM_TOKENS tokens on average (an EMA), one pass after the verify
# forward computes the rows the walk is likeliest to visit: a trie of at most BATCHED_LOGITS_NODES
# nodes, all of them; a larger one, its spine (Trie.spine: a lookup step's copy of up to 31 tokens,
# whose rows one at a time cost 14x the pass in session 46's greedy cell). Other rows, and every row
# where most steps emit one token (as under sampling on hard text), the walk computes as it visits
# them, one by one. The choice changes speed, not the method: both are the rows of the same product
# (up to float rounding between one-row and many-row kernels, as for the verify forward). The memory plan counts
# those rows (spec.budget.held_logit_rows, where BATCHED_LOGITS_NODES is set).
BATCH_FROM_TOKENS = 1.5


@dataclass
class Verified:
    """The verify pass: hidden states of every trie node; the logits of the rows the walk is likely to visit
    computed together (held_logits), the others on demand (the walk visits only the rows of one path)."""

    model: Transformer
    hidden: torch.Tensor  # [N, hidden]
    cached: dict[int, torch.Tensor]  # node -> its logits [V]
    logits: torch.Tensor | None = None  # [N, V], every row's (the batched walk), else None

    def row_logits(self, i: int) -> torch.Tensor:
        if i not in self.cached:
            self.cached[i] = self.model.logits(self.hidden[i : i + 1])[0]  # [V]
        return self.cached[i]


def spec_for_heads(spec: SpecConfig, device: torch.device, gamma: int) -> tuple[SpecConfig, tuple[int, ...]]:
    """`spec` as it runs on `device` with heads of `gamma` heads, and its draft pass's candidates per depth; refused
    where its tree is deeper than the heads draft, or a fused draft mode is left no depth to draft."""
    spec = spec.for_device(device, gamma + 1)
    levels = draft_levels(spec)
    if len(spec.levels) > gamma + 1:
        depths = f"has {len(spec.levels)} depths but the heads draft only {gamma + 1}: give at most that many"
        raise ConfigError(f"SpecConfig.tree='{spec.tree}' {depths}", f"--tree {spec.tree} {depths}")
    if not levels:
        raise ConfigError("draft_mode='fused' (--draft-mode fused) needs a tree (--tree) of at least two "
                          "depths (the first is skipped)")
    return spec, levels


class TokenSwiftState:
    """Everything one generation carries from step to step."""

    def __init__(self, model: Transformer, heads: DraftHeads, prompt: list[int], generated: list[int],
                 sampling: SamplingConfig, gen: GenerationConfig, spec: SpecConfig, stats: GenerationStats,
                 eos_ids: frozenset[int], generator: torch.Generator | None, cuda_graphs: bool = False,
                 read_every: int = 1, graph_attention: str = "bucketed", resumed: bool = False) -> None:
        spec, levels = spec_for_heads(spec, model.device, heads.gamma)
        ngram_topk, max_nodes = resolved(spec)
        self.model, self.heads, self.sampling, self.gen, self.spec = model, heads, sampling, gen, spec
        self.stats, self.generator = stats, generator
        self.pick = draw if model.tp is None else model.tp.draw  # tensor parallel: rank 0 draws for all
        self.batched = spec.walk == "batched" and model.tp is None  # (tensor parallel walks row by row)
        self.sync = model.device.type == "cuda"  # stage timers wait for the device (adaptive steps read them)
        self.read_every = read_every if model.tp is None else 1  # plain steps run as token blocks of up to this
        self.levels = levels
        # Tokens never drafted: the heads' candidates cannot be these (their logits are -inf), and the copies of
        # the text (n-gram paths, the suffix index's) end before one, which the walk would reject.
        self.banned = frozenset(sampling.banned_ids)
        # Whether a trie can outgrow the node budget: then its nodes are scored and the likeliest kept.
        self.pruning = 0 < max_nodes < unpruned_budget(spec)
        wide = any(k > 1 for k in levels) or ngram_topk > NARROW_NGRAM_TOPK  # then NARROW steps exist
        kinds = step_kinds(wide, max_nodes if self.pruning else 0)  # (and, on a large budget, HALF steps)
        self.schedule = StepSchedule(kinds, spec.adaptive)  # which kind of step runs next
        self.half = max_nodes // 2 if HALF in kinds else 0  # a HALF step's node budget
        self.stop_ids = frozenset() if gen.ignore_eos else eos_ids
        nodes = tree_budget(spec)
        total = len(prompt) + gen.max_new_tokens
        draft_tokens = draft_cache_tokens(spec, total)
        bodies = step_bodies(model)  # CUDA: fixed-shape steps (runtime.cuda_graphs), verify padded to a budget
        chunk = min(gen.prefill_chunk, len(prompt) + len(generated))  # (no prefill chunk is longer than what it reads)
        self.full = new_cache(model, total + (padded_nodes(nodes) if bodies else nodes), chunk,
                              draft_tokens, nodes, walk_rows(spec) if self.batched else 1, context=total,
                              held_rows=held_logit_rows(spec), resumed=resumed)
        self.partial = None
        if draft_tokens:
            self.partial = PartialKVCache(model.cfg, spec.draft_kv_budget, spec.attention_sinks, spec.draft_window,
                                          model.dtype, model.device,
                                          reduce_scores=model.tp.kv_score_reduce() if model.tp else None)
        self.graphs: dict[int, StepGraphs] = {}  # id(cache) -> its step bodies (full cache; partial cache)
        if bodies:  # the paper draft mode's pass captures the heads and LM head with the forward
            heads_out = partial(draft_logits, model, heads, len(levels)) if spec.draft_mode == "paper" else None
            self.graphs[id(self.full)] = StepGraphs(model, self.full, capture=cuda_graphs, attention=graph_attention,
                                                    draft=heads_out)
            if self.partial is not None:  # its length goes down at every refill: keep every bucket's graphs
                self.graphs[id(self.partial)] = StepGraphs(model, self.partial, capture=cuda_graphs, evict=False,
                                                           attention=graph_attention, draft=heads_out)
        self.tokens = list(prompt) + list(generated)  # prompt + output as a list, for the n-gram table
        self.n = len(self.tokens)  # committed length (the root, once drawn, is history[n-1])
        # Prompt + output on the CPU, and on the model's device, where the penalty windows are cut from.
        self.history, self.history_dev = token_history(self.tokens, total, model.device)
        self.produced = len(generated)
        exclude = sampling.penalized_window
        self.ngrams = NGramTracker(NGRAM_N, exclude) if ngram_topk > 0 else None
        # Lookup steps' copy of what followed the text's last tokens before (with n-gram reuse on)
        self.suffixes = SuffixIndex(exclude) if suffix_copies(spec) else None
        self.lookup_budget = lookup_budget(spec)  # the most nodes a lookup step's trie may have
        self.catch_up_tables()
        self.prev_hidden: torch.Tensor | None = None  # fused mode: hidden state that predicted the root
        self.one_off = False  # this step paid a one-off cost (a partial-cache refill): not timed for `rate`
        self.partial_from = 0  # first full-cache slot the partial cache's window has not seen

    def repeating(self) -> bool:
        """Whether the text is repeating an earlier passage: the suffix index's match has held for
        REPEAT_HELD tokens (adaptive steps then run a lookup step, whose copy is likely accepted, even
        where plain steps lead: a kind's probes come at doubling intervals, which would keep a loop that
        began after a stretch of plain steps on plain steps for hundreds of tokens). Checked before
        each step or token block: a block of plain steps (runtime.blocks) sees it only at its end."""
        if self.suffixes is None or not self.spec.adaptive:
            return False
        self.catch_up_tables()
        return self.suffixes.held(self.tokens, self.n, REPEAT_HELD) >= REPEAT_HELD

    def captures(self) -> int:
        """CUDA graphs captured so far by this generation's steps."""
        return sum(g.captures for g in self.graphs.values())

    def window(self) -> torch.Tensor:
        """The root's penalty window, on the model's device."""
        return penalty_window(self.history_dev, self.n, self.sampling.penalty_window)

    def emit(self, tokens: list[int], plain: bool = False) -> None:
        """Commit tokens to the output. `plain`: tokens of plain steps (plain_block), which
        sample_block has already written to the device copy of the history, and which leave the
        n-gram table and the partial cache behind (catch_up brings them up to date before a step
        that uses them)."""
        if not plain or self.history_dev is not self.history:
            self.history[self.n : self.n + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        if not plain and self.history_dev is not self.history:
            self.history_dev[self.n : self.n + len(tokens)].copy_(self.history[self.n : self.n + len(tokens)],
                                                                   non_blocking=True)
        self.tokens.extend(tokens)
        self.n += len(tokens)
        self.produced += len(tokens)
        if not plain:
            self.catch_up()

    def catch_up_tables(self) -> None:
        """Add the committed tokens to the n-gram table and the suffix index."""
        if self.ngrams is not None:
            self.ngrams.update(self.tokens, self.n)
        if self.suffixes is not None:
            self.suffixes.update(self.tokens, self.n)

    def catch_up(self) -> None:
        """Add the committed tokens' n-grams to the table and the full cache's new entries to the
        partial cache's recent window (as much as fits), as plain steps left them; the same state as
        updating after every step."""
        self.catch_up_tables()
        if self.partial is not None and self.partial.selected:
            self.partial_from = self.partial.append(self.full, self.partial_from, self.full.length)
        else:
            self.partial_from = self.full.length


def _stage_done(s: TokenSwiftState, stage: str, t0: float) -> float:
    """Add the time since t0 to `stage`; on a GPU after the device has finished the stage's work, so
    that stage times, and the step times adaptive steps choose by, are the device's and not the launches'."""
    if s.sync:
        torch.cuda.synchronize(s.model.device)
    stats = s.stats
    t1 = time.perf_counter()
    stats.stage_seconds[stage] = stats.stage_seconds.get(stage, 0.0) + t1 - t0
    return t1


def draft_logits(model: Transformer, heads: DraftHeads, depths: int, h: torch.Tensor,
                 base: bool = True) -> torch.Tensor:
    """The draft pass's logits [depths, V] (accumulation dtype) from the last layer's pre-norm state
    h [1, hidden] of the root: with `base` (paper mode) the base model's own next token first, then
    each head's, in one LM-head pass. A function of h alone, so the draft step body captures it."""
    states = heads(h)[:, 0]  # [gamma, hidden], already through each head's output norm
    if base:
        states = torch.cat([model.norm(h, model.final_norm), states])
    return model.lm_head(states[:depths]).to(model.acc_dtype)


def draft(s: TokenSwiftState) -> Draft:
    """Depth logits from the draft heads, transformed like the target, top-k per depth."""
    return candidates(s, depth_logits(s))


def pick_draft_cache(s: TokenSwiftState) -> tuple[FullKVCache, list[torch.Tensor] | None]:
    """The cache the draft pass reads: the full cache while the context is below the budget; from the
    budget on, the partial cache, or once per refill the full cache with a list to take the root's
    queries in (to select the partial cache's entries from). Marks a refill as a one-off step and slides
    a static cache's full window."""
    if s.partial is None or s.full.length < s.spec.draft_kv_budget:
        return s.full, None
    if not s.partial.selected or (s.partial.window_full and s.spec.draft_cache == "dynamic"):
        s.one_off = True  # a refill: not timed for the schedule's rates
        return s.full, []
    if s.partial.window_full:  # static: keep the first selection, slide the window on to the entries it missed
        s.partial_from = s.partial.slide_window(s.full, s.partial_from, s.full.length)
    return s.partial, None


def depth_logits(s: TokenSwiftState) -> torch.Tensor:
    """The draft pass: logits [depths, V] (accumulation dtype) for the positions after the root."""
    model, root = s.model, int(s.history[s.n - 1])
    if s.spec.draft_mode == "fused":  # the heads on the state that predicted the root: no forward
        assert s.prev_hidden is not None  # (the prefill, then each step, set it)
        return draft_logits(model, s.heads, len(s.levels), s.prev_hidden[None], base=False)
    cache, queries = pick_draft_cache(s)
    start = cache.length
    graphs = s.graphs.get(id(cache))
    if graphs is not None and queries is None:
        logits = graphs.draft(root, s.n - 1)[0]  # forward, heads and LM head in one replay
    else:
        tokens = torch.tensor([root], device=model.device)
        pos = torch.tensor([s.n - 1])  # on the host, as runtime.blocks.decode's
        h = model.forward(tokens, pos, cache, logits_rows=slice(0, 0), queries=queries)[1][-1]
        logits = draft_logits(model, s.heads, len(s.levels), h[None])
    cache.truncate(start)
    if queries is not None:
        assert s.partial is not None  # (queries are taken only to select the partial cache's entries)
        s.partial.select(s.full, queries)
        s.partial_from = s.full.length
    return logits


def candidates(s: TokenSwiftState, logits: torch.Tensor) -> Draft:
    """Each depth's top candidates (and their log-probabilities where the trie is pruned) after the
    target's transform under the root's penalty window, read to the host in one copy."""
    window = s.window()
    x = transform(logits, window.expand(logits.shape[0], -1), s.sampling)  # every depth sees the root's window
    top = torch.topk(x, min(max(s.levels), x.shape[-1]), dim=-1)  # [depths, k]: the widest depth's count
    # The candidates' log-probabilities rank the trie's nodes where it is pruned.
    scores = top.values - torch.logsumexp(x, dim=-1, keepdim=True) if s.pruning else top.values  # [depths, k]
    # One copy to the host for both: ids are exact in float32 below 2^24 (a larger vocabulary takes float64).
    if x.shape[-1] > 1 << 24:
        scores = scores.double()
    values, indices = torch.stack([scores, top.indices.to(scores.dtype)]).tolist()  # [depths, k] each
    neg = float("-inf")
    levels = [[int(t) for t, v in zip(ids[:k], vs[:k]) if v > neg] for k, ids, vs in zip(s.levels, indices, values)]
    logprobs = [[v for v in vs[:k] if v > neg] for k, vs in zip(s.levels, values)] if s.pruning else None
    return Draft(levels, logprobs)


def build_tree(s: TokenSwiftState, d: Draft, narrow: bool = False, half: bool = False) -> Trie:
    """The heads' cartesian tree plus n-gram paths for each depth-1 token, merged as a trie, then
    cut to the node budget (--max-nodes) by its nodes' scores, or to half of it (`half`: a HALF step);
    `narrow`: the first candidate of each depth and NARROW_NGRAM_TOPK n-gram paths (a NARROW step)."""
    levels = [level[:1] for level in d.levels] if narrow else d.levels
    ngram_topk, max_nodes = resolved(s.spec)
    topk = min(ngram_topk, NARROW_NGRAM_TOPK) if narrow else ngram_topk
    budget = s.half if half else max_nodes
    trie = Trie.with_root(int(s.history[s.n - 1]))
    trie.add_levels(levels, d.logprobs, keep=budget - 1 if s.pruning else None)
    if s.ngrams is not None and levels:
        for i, first in enumerate(levels[0]):
            add_ngram_paths(s, trie, first, topk, (first,), d.logprobs[0][i] if d.logprobs is not None else 0.0)
    return trie.pruned(budget) if s.pruning else trie


def lookup_tree(s: TokenSwiftState) -> Trie:
    """A draft-free trie within the lookup budget (--lookup-nodes): the root, the suffix index's copy
    of what followed the text's last tokens before, and the n-gram table's continuations of the root
    (prompt-lookup style) that still fit, or where pruning, the budget's likeliest nodes by their
    counts (the copy's nodes score as certain). It needs no draft pass; its verify pass costs what its
    rows do (on the CPU an 8-node trie about 1.5 AR steps, 32 nodes 2.8), and the walk accepts
    whatever of it the model draws."""
    root = int(s.history[s.n - 1])
    trie = Trie.with_root(root)
    if s.suffixes is not None:
        copy = until_banned(s.suffixes.propose(s.tokens, s.n, s.lookup_budget - 1), s.banned)
        trie.add_path(copy, NGRAM, [0.0] * len(copy))
    if s.ngrams is not None:
        add_ngram_paths(s, trie, root, resolved(s.spec)[0], room=None if s.pruning else s.lookup_budget)
    return trie.pruned(s.lookup_budget) if s.pruning else trie


def add_ngram_paths(s: TokenSwiftState, trie: Trie, token: int, topk: int, lead: tuple[int, ...] = (),
                    base: float = 0.0, room: int | None = None) -> None:
    """`token`'s `topk` most frequent n-gram continuations as trie paths after `lead` (the root's
    own: none; a depth-1 token's: that token, whose score from the heads is `base`). Where pruning,
    each node of a continuation scores `base` plus the log share of its prefix among `token`'s n-grams.
    `room` (not pruning): the most nodes the trie may reach; a path that would pass it is left out."""
    assert s.ngrams is not None  # (called only with n-gram reuse on)
    table = s.ngrams.table
    conts = table.top(token, topk)
    if not s.pruning:
        for cont, _count in conts:
            path = (*lead, *until_banned(cont, s.banned))
            if room is None or len(trie) + trie.missing(path) <= room:
                trie.add_path(path, NGRAM)
        return
    for (cont, _count), scores in zip(conts, path_scores(conts, table.total_of(token), base)):
        kept = until_banned(cont, s.banned)
        trie.add_path((*lead, *kept), NGRAM, [base] * len(lead) + scores[:len(kept)])


def until_banned(path: Sequence[int], banned: frozenset[int]) -> Sequence[int]:
    """`path` up to its first banned token (all of it where none is)."""
    if banned:
        for i, t in enumerate(path):
            if t in banned:
                return path[:i]
    return path


def verify(s: TokenSwiftState, trie: Trie) -> Verified:
    """One forward of the root and every trie node on the full cache, under the tree mask."""
    dev, graphs = s.model.device, s.graphs.get(id(s.full))
    n = len(trie)
    if n == 1 and graphs is not None:  # the root alone (a plain step): AR's decode graph, logits included
        logits, hidden = graphs.decode(trie.tokens[0], s.n - 1)
        return Verified(s.model, hidden[None], {0: logits}, logits[None])
    if graphs is not None:  # padded to a node budget; rows past the trie are padding
        out, hidden = graphs.forward(trie.tokens, trie.positions(s.n - 1), trie.mask(), logits=s.batched)
        if s.batched:
            return Verified(s.model, hidden[:n], {}, out[:n])
        return Verified(s.model, hidden[:n], held_logits(s, trie, hidden[:n]))
    # the root alone goes without a mask: a decoding step, same kernels as AR
    _, hidden = s.model.forward(trie.token_tensor(dev), trie.positions(s.n - 1, dev), s.full,
                                tree_mask=trie.mask(dev) if n > 1 else None, logits_rows=slice(0, 0))
    if s.batched:
        return Verified(s.model, hidden, {}, s.model.logits(hidden))
    return Verified(s.model, hidden, held_logits(s, trie, hidden))


def held_logits(s: TokenSwiftState, trie: Trie, hidden: torch.Tensor) -> dict[int, torch.Tensor]:
    """The logits the row walk is likely to need, computed together where steps emit several tokens: every row's
    of a small trie, the spine's of a large one; none otherwise (each visited row then on demand).
    hidden: [N, hidden] -> node -> its logits [V]."""
    if s.schedule.tokens_per_step < BATCH_FROM_TOKENS:
        return {}
    if len(trie) <= BATCHED_LOGITS_NODES:
        return dict(enumerate(s.model.logits(hidden)))  # [N, V] -> a row per node
    spine = trie.spine()
    return dict(zip(spine, s.model.logits(hidden[spine])))  # [spine, V] -> a row per node


def accept(s: TokenSwiftState, trie: Trie, v: Verified) -> Walk:
    if s.batched:
        assert v.logits is not None  # (verify computes every row's logits for the batched walk)
        return batched_walk(trie, v.logits, s.history_dev, s.n, s.sampling, s.generator, s.stop_ids,
                            max_tokens=s.gen.max_new_tokens - s.produced)
    return lossless_walk(trie, v.row_logits, s.history, s.n, s.sampling, s.generator, s.stop_ids,
                         max_tokens=s.gen.max_new_tokens - s.produced, pick=s.pick)


def commit(s: TokenSwiftState, trie: Trie, v: Verified, walk: Walk) -> list[int]:
    """Keep the KV entries of the root and the accepted path; record the emitted tokens."""
    base = s.n - 1  # the root's slot
    s.full.compact(base, [base] + [base + node for node in walk.nodes])
    s.prev_hidden = v.hidden[walk.nodes[-1] if walk.nodes else 0]
    emitted = StepTokens(walk.tokens + [walk.next_root], walk.ngram)
    s.emit(emitted)
    s.stats.accepted_tokens += len(walk.tokens)
    s.stats.ngram_accepted += walk.ngram_only
    s.stats.draft_positions += max(trie.depths)  # the deepest drafted position (heads or n-grams)
    return emitted


def plain_block(s: TokenSwiftState, k: int) -> list[int]:
    """k plain steps (the root alone) as one token block, through AR's own code (runtime/blocks.py):
    the root's forward, then k draws, each forwarded but the last (the new root), read back once.
    Emits what k single steps of AR emit, and leaves the cache, the generator and the fused heads'
    hidden state where they leave them. A single plain step is a block of one: no trie, walk or
    cache compaction, so that where no draft pays, a step costs what AR's does."""
    graphs = s.graphs.get(id(s.full))
    root = s.history_dev[s.n - 1 : s.n]  # [1] on the device: fed as AR feeds its drawn token, no host copy
    logits, hidden = decode(s.model, s.full, graphs, root, s.n - 1)
    block = sample_block(s.model, s.full, graphs, logits, s.history_dev, s.n, k, s.sampling, s.generator,
                         s.stop_ids, forward_last=False, pick=None if s.model.tp is None else s.pick)
    s.prev_hidden = block.hidden if block.hidden is not None else hidden  # the state that predicted the new root
    s.emit(block.tokens, plain=True)
    return block.tokens


def tokenswift_steps(model: Transformer, heads: DraftHeads, prompt: list[int], sampling: SamplingConfig,
                     gen: GenerationConfig, spec: SpecConfig, stats: GenerationStats, eos_ids: frozenset[int],
                     generator: torch.Generator | None, generated: list[int] | None = None,
                     cuda_graphs: bool = False, read_every: int = 1, graph_attention: str = "bucketed",
                     on_prefill: Callable[[int, int], None] | None = None,
                     resumed: bool = False) -> Iterator[list[int]]:
    """Self-speculative decoding; yields the tokens each step commits (its output is AR's). The call checks
    the tree against the heads, plans the run's memory and allocates its caches (a run that cannot be is
    refused here, not at the first token); the iterator it returns prefills and decodes. `generated`:
    tokens an earlier run already produced (resume): the cache is rebuilt by a prefill of everything
    before the last of them, which becomes the root (`resumed`: a checkpoint's run). `read_every`: plain
    steps run as token blocks of up to this many (see StepSchedule.plain_run), as AR's do. `graph_attention`:
    how the CUDA step bodies attend (runtime.cuda_graphs). `on_prefill(read, total)`: the prefill's progress
    (Transformer.prefill)."""
    generated = generated or []
    if (reason := finished(generated, gen, eos_ids)) is not None:
        stats.finish_reason = reason
        return iter(())
    s = TokenSwiftState(model, heads, prompt, generated, sampling, gen, spec, stats, eos_ids, generator, cuda_graphs,
                        read_every, graph_attention, resumed)

    def steps() -> Iterator[list[int]]:  # the checks and the caches above are made when the run is asked for
        if generated:
            _reread(s, len(prompt), on_prefill)
            last = generated[-1]
        else:
            last = _prefill(s, on_prefill)
            yield [last]
        while s.produced < gen.max_new_tokens and last not in s.stop_ids:
            t0 = time.perf_counter()
            captures, s.one_off = s.captures(), False
            kind, trie = _choose(s)
            if kind == PLAIN:
                emitted = _plain_steps(s, trie, t0, captures)
            else:
                emitted = _drafting_step(s, kind, trie, t0, captures)
            stats.new_tokens += len(emitted)
            stats.add_captures(s.graphs.values())
            last = emitted[-1]
            yield emitted
        stats.finish_reason = "eos" if last in s.stop_ids else "length"  # (a stop string closes it at a yield)

    return steps()


def _reread(s: TokenSwiftState, prompt_tokens: int, on_prefill: Callable[[int, int], None] | None) -> None:
    """A resumed run's prefill: the cache rebuilt from everything before its last token, which is the root."""
    t0 = time.perf_counter()
    _, s.prev_hidden = s.model.prefill(s.history[: s.n - 1], s.full, s.gen.prefill_chunk, decoded_from=prompt_tokens,
                                       progress=on_prefill)
    s.stats.prefill_seconds += time.perf_counter() - t0


def _prefill(s: TokenSwiftState, on_prefill: Callable[[int, int], None] | None) -> int:
    """A new run's prefill and its first token, drawn from the prompt's last logits as AR draws it."""
    t0 = time.perf_counter()
    logits, hidden = s.model.prefill(s.history[: s.n], s.full, s.gen.prefill_chunk, progress=on_prefill)
    s.stats.prefill_seconds += time.perf_counter() - t0
    t0 = time.perf_counter()
    window = s.window().to(logits.device)[None]
    first = s.pick(transform(logits[None], window, s.sampling)[0], s.sampling, s.generator)
    s.prev_hidden = hidden
    s.emit([first])
    s.stats.decode_seconds += time.perf_counter() - t0
    s.stats.new_tokens, s.stats.steps = 1, 1
    return first


def _choose(s: TokenSwiftState) -> tuple[str, Trie | None]:
    """The kind of step to run next (the schedule's, a lookup where the text repeats itself; under tensor
    parallelism rank 0's), and a lookup step's trie; a lookup whose root continues no n-gram is a plain step."""
    schedule = s.schedule
    kind = schedule.hinted(LOOKUP) if s.repeating() else schedule.choose()
    if s.model.tp is not None and s.spec.adaptive:  # timings differ per rank: all take rank 0's choice
        kind = schedule.kinds[s.model.tp.broadcast_int(schedule.kinds.index(kind))]
    trie = None
    if kind != PLAIN:
        s.catch_up()
        if kind == LOOKUP:
            trie = lookup_tree(s)
            if len(trie) == 1:  # no n-gram continues the root: a plain step, counted as one (timed:
                kind = PLAIN  # StepSchedule.record_empty_lookup)
    return kind, trie


def _plain_steps(s: TokenSwiftState, trie: Trie | None, t0: float, captures: int) -> list[int]:
    """AR's step through AR's code: one (a lookup step that found nothing, `trie`), or a token block of them where
    plain steps lead; timed as that many plain steps of the block's average cost."""
    schedule, stats = s.schedule, s.stats
    emitted = plain_block(s, 1 if trie is not None else
                          schedule.plain_run(s.read_every, s.gen.max_new_tokens - s.produced))
    schedule.skip(len(emitted) - 1)
    t = _stage_done(s, "plain", t0)
    stats.decode_seconds += t - t0
    seconds = None if s.captures() != captures else (t - t0) / len(emitted)
    for _ in emitted:
        if trie is None:
            schedule.record(PLAIN, 1, seconds)
        else:
            schedule.record_empty_lookup(seconds)
    stats.steps += len(emitted)
    stats.plain_steps += len(emitted)
    return emitted


def _drafting_step(s: TokenSwiftState, kind: str, trie: Trie | None, t0: float, captures: int) -> list[int]:
    """A step that drafts: draft -> tree (FULL, HALF, NARROW; a lookup step's trie is built) -> verify -> accept ->
    commit, each stage timed; the tokens it commits (AR's)."""
    schedule, stats = s.schedule, s.stats
    t = t0
    if kind in (FULL, HALF, NARROW):
        d = draft(s)
        t = _stage_done(s, "draft", t0)
        trie = build_tree(s, d, narrow=kind == NARROW, half=kind == HALF)
    assert trie is not None
    stats.lookup_steps += kind == LOOKUP
    stats.half_steps += kind == HALF
    stats.narrow_steps += kind == NARROW
    stats.verified_nodes += len(trie)
    stats.verify_steps += 1
    t = _stage_done(s, "tree", t)
    v = verify(s, trie)
    t = _stage_done(s, "verify", t)
    walk = accept(s, trie, v)
    t = _stage_done(s, "accept", t)
    emitted = commit(s, trie, v, walk)
    t = _stage_done(s, "commit", t)
    stats.decode_seconds += t - t0
    schedule.record(kind, len(emitted), None if s.one_off or s.captures() != captures else t - t0)
    if kind == FULL and s.half and schedule.adaptive:  # what the trie's likeliest half would have emitted
        schedule.would_emit(HALF, trie.held(walk.nodes, s.half) + 1)
    stats.steps += 1
    return emitted
