"""An upper bound on speculative speedup under the paper's sampling, for the embedded model on
this machine: what would tree verification gain if the draft were an oracle?

1. AR-generates N tokens after the 2,048-token prose prompt with the paper's sampling (seed 0).
2. Recomputes the exact AR distribution (penalty window, min-p) at every generated position and
   the rank of the token AR drew there.
3. An oracle draft proposes, at every node, the k most likely tokens of the exact distribution
   (the best any heads can do with k candidates): the lossless walk accepts depth d exactly when
   the drawn token's rank is < k. Steps are simulated along the AR sequence (each step emits the
   accepted tokens plus one), giving tokens per step for depth D and width k.
4. Times one forward of the trie's nodes against one AR forward at the run's mid context
   (interleaved, medians): the verify pass alone, with no draft pass and free drafts.

bound = tokens per step / (verify forward time / AR forward time). Run from the repo root:
python docs/scripts/sampling_bound.py [new_tokens]"""
import dataclasses
import statistics
import sys
import time

import torch

import longswift
from longswift.bench.grid import PRESETS
from longswift.bench.timing import median_seconds
from longswift.config import GenerationConfig
from longswift.runtime.cache import FullKVCache
from longswift.sampling import penalty_window, transform

new = int((sys.argv[1:] + ["2048"])[0])
e = longswift.load()
model = e.model
samp = dataclasses.replace(PRESETS["paper"], seed=0)
prompt = e.encode(open("docs/prompts/clockmaker.txt").read())[:2048]
t0 = time.perf_counter()
out = e.generate(prompt, method="ar", sampling=samp, generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
print(f"AR: {len(out.token_ids)} tokens, {out.stats.tokens_per_second:.1f} tok/s ({time.perf_counter() - t0:.0f} s)", flush=True)

history = torch.tensor(prompt + out.token_ids)
n0, n = len(prompt), len(prompt) + len(out.token_ids)
ranks, support = [], []
with torch.inference_mode():
    cache = FullKVCache(e.cfg, n, model.dtype, model.device)
    model.prefill(history[: n0 - 1], cache, 256)
    for lo in range(n0 - 1, n - 1, 256):  # rows predicting tokens lo + 1 .. hi
        hi = min(lo + 256, n - 1)
        logits, _ = model.forward(history[lo:hi], torch.arange(lo, hi), cache)  # [R, V]
        w = samp.penalty_window
        windows = torch.full((hi - lo, w), -1, dtype=torch.long)
        for r, length in enumerate(range(lo + 1, hi + 1)):  # the history AR had when drawing index `length`
            ids = penalty_window(history, length, w)
            windows[r, : ids.numel()] = ids
        x = transform(logits, windows, samp)  # [R, V]
        drawn = x.gather(1, history[lo + 1 : hi + 1, None])  # [R, 1]
        assert bool(torch.isfinite(drawn).all()), "AR drew a token the transform filters out"
        ranks += (x > drawn).sum(dim=1).tolist()
        support += torch.isfinite(x).sum(dim=1).tolist()
ranks_t = torch.tensor(ranks)
print(f"positions {len(ranks)}; min-p support size: median {statistics.median(support)}, mean {statistics.mean(support):.2f}")
print("share of drawn tokens with rank < k: " + ", ".join(f"k={k} {float((ranks_t < k).float().mean()):.3f}" for k in (1, 2, 3, 5)))


def tokens_per_step(k: int, depth: int) -> float:
    pos = steps = 0
    while pos < len(ranks):
        accepted = 0
        while accepted < depth and pos + accepted < len(ranks) and ranks[pos + accepted] < k:
            accepted += 1
        pos += accepted + 1  # the accepted tokens and the walk's own draw after them
        steps += 1
    return len(ranks) / steps


def forward_ms(nodes: int, context: int, reps: int = 5) -> float:
    """Median ms of one forward of `nodes` tokens (a chain: any tree of that size costs the same
    products) after `context` cached entries."""
    cache = FullKVCache(e.cfg, context + nodes, model.dtype, model.device)
    cache.k.normal_(generator=torch.Generator().manual_seed(0))
    cache.v.normal_(generator=torch.Generator().manual_seed(1))
    toks = history[:nodes]
    mask = torch.ones(nodes, nodes, dtype=torch.bool).tril_() if nodes > 1 else None
    positions = torch.arange(context, context + nodes)

    def one_forward() -> None:
        cache.length = context
        model.forward(toks, positions, cache, tree_mask=mask)

    with torch.inference_mode():
        return 1000 * median_seconds(one_forward, reps, warmup=1, sync=lambda: None)


mid = (n0 + n) // 2
configs = [(1, d) for d in (1, 2, 3, 4, 6)] + [(2, 2), (2, 3), (3, 2), (3, 3)]
sizes = sorted({1} | {1 + sum(k**i for i in range(1, d + 1)) for k, d in configs})
cost = {s: [] for s in sizes}
for _ in range(3):  # interleaved rounds
    for s in sizes:
        cost[s].append(forward_ms(s, mid))
cost_ms = {s: statistics.median(v) for s, v in cost.items()}
print(f"forward at context {mid}: " + ", ".join(f"{s} tokens {cost_ms[s]:.1f} ms" for s in sizes))
print("| width k | depth D | trie nodes | oracle tokens/step | verify / AR forward | bound vs AR |")
print("|---|---|---|---|---|---|")
for k, d in configs:
    nodes = 1 + sum(k**i for i in range(1, d + 1))
    tps = tokens_per_step(k, d)
    ratio = cost_ms[nodes] / cost_ms[1]
    print(f"| {k} | {d} | {nodes} | {tps:.2f} | {ratio:.2f} | {tps / ratio:.2f}x |")
