"""How many nodes the GPU's default trie really has per step (paper draft mode: tree 1,3,3,3 and 20
n-gram continuations, at most 121 nodes; fused: at most 280), so the verify pass's node budgets
(runtime.cuda_graphs.NODE_BUDGETS, the sizes a trie is padded to) can be chosen from the sizes that
occur. The embedded model with the shipped heads, a 2K-token prose prompt, full steps only
(adaptive off), run on the CPU: the trie's size depends on the text and the drafts, not the device.
Run from the repo root:

python docs/scripts/trie_sizes.py [new_tokens] [draft_mode]"""
import collections
import sys
from pathlib import Path

import longswift
import longswift.spec.tokenswift as ts
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.bench.grid import PRESETS
from longswift.runtime.cuda_graphs import NODE_BUDGETS

BEFORE = (1, 8, 32, 128, 512)  # the budgets before session 10


def padded(n: int, budgets: tuple[int, ...]) -> int:
    return next((b for b in budgets if b >= n), n)

new = int(sys.argv[1]) if len(sys.argv) > 1 else 128
mode = sys.argv[2] if len(sys.argv) > 2 else "paper"
e = longswift.load(heads="default")
ids = e.encode(Path("docs/prompts/clockmaker.txt").read_text())[:2048]
spec = SpecConfig(tree="1,3,3,3", ngram_topk=20, draft_mode=mode, adaptive=False)
sizes: list[int] = []
real_verify = ts.verify


def counting_verify(s, trie):
    sizes.append(len(trie))
    return real_verify(s, trie)


ts.verify = counting_verify
for preset in ("greedy", "paper"):
    sizes.clear()
    sampling = SamplingConfig(**{**PRESETS[preset].__dict__, "seed": 1})
    r = e.generate(ids, sampling=sampling, generation=GenerationConfig(max_new_tokens=new), method="tokenswift",
                   spec=spec)
    print(f"{mode} {preset}: {len(sizes)} steps, {r.stats.tokens_per_step:.2f} tokens/step, nodes min "
          f"{min(sizes)} median {sorted(sizes)[len(sizes) // 2]} max {max(sizes)}")
    for name, budgets in (("before", BEFORE), ("now", NODE_BUDGETS)):
        used = collections.Counter(padded(n, budgets) for n in sizes)
        rows = sum(padded(n, budgets) for n in sizes)
        print(f"  budgets {name} {budgets}: steps per budget {dict(sorted(used.items()))}; real rows {sum(sizes)} "
              f"of {rows} padded ({sum(sizes) / rows:.0%})")
    hist = collections.Counter(n // 10 * 10 for n in sizes)
    print("  nodes by tens:", dict(sorted(hist.items())), flush=True)
