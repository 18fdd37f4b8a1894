"""CPU trie defaults, timed: today's narrow default (1,1,1 with one n-gram path) against the paper's
wide trie cut to a small node budget, adaptive steps on, the embedded model and its shipped heads
after the 2,048-token clockmaker prefix, one thread. AR and each configuration run in one process,
the order rotated every round; decode tok/s per run, ratios to that round's AR run, and every run
checked token-identical to AR. Run from the repo root:
python docs/scripts/node_budget_ab.py [greedy|paper] [new tokens] [rounds] [budgets, e.g. 8,6]"""
import statistics
import sys

import longswift
from longswift.config import GenerationConfig, SamplingConfig, SpecConfig

preset = sys.argv[1] if len(sys.argv) > 1 else "greedy"
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
budgets = [int(b) for b in sys.argv[4].split(",")] if len(sys.argv) > 4 else [8, 6]
sampling = SamplingConfig(temperature=0, repetition_penalty=1.0) if preset == "greedy" else SamplingConfig(seed=0)

e = longswift.load(threads=1)
ids = e.encode(open("docs/prompts/clockmaker.txt").read())[:2048]
gen = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
configs = {"ar": None, "default 1,1,1/1": SpecConfig()}
configs |= {f"1,3,3,3/20 max {b}": SpecConfig(tree="1,3,3,3", ngram_topk=20, max_nodes=b) for b in budgets}
names = list(configs)
rates: dict[str, list[float]] = {n: [] for n in names}
ratios: dict[str, list[float]] = {n: [] for n in names}
reference = None
for r in range(rounds):
    order = names[r % len(names):] + names[: r % len(names)]
    got = {}
    for name in order:
        spec = configs[name]
        out = e.generate(ids, method="ar" if spec is None else "tokenswift", sampling=sampling, generation=gen, spec=spec)
        reference = reference or out.token_ids
        s = out.stats
        got[name] = s.tokens_per_second
        kinds = "" if spec is None else (
            f", full {s.steps - 1 - s.plain_steps - s.lookup_steps - s.narrow_steps - s.half_steps} / half "
            f"{s.half_steps} / narrow {s.narrow_steps} / lookup {s.lookup_steps} / plain {s.plain_steps} steps")
        print(f"round {r} {name}: {s.tokens_per_second:.2f} tok/s, {s.tokens_per_step:.2f} tokens/step{kinds}, "
              f"same as AR: {out.token_ids == reference}", flush=True)
    for name in names:
        rates[name].append(got[name])
        ratios[name].append(got[name] / got["ar"])
print(f"\n{preset}, {new_tokens} new tokens, {rounds} rounds: median tok/s, median of per-round ratios to AR")
for name in names:
    print(f"{name}: {statistics.median(rates[name]):.2f} tok/s, {statistics.median(ratios[name]):.3f}x AR "
          f"(rounds {' / '.join(f'{x:.3f}' for x in ratios[name])})")
