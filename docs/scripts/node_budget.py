"""What a node budget (--max-nodes) keeps of the GPU's default wide trie: tokens per step, alpha and
verified rows per full step, for budgets from none to 8, with the embedded model and its shipped
heads after the 2,048-token clockmaker prefix (full steps only, so every step verifies a trie).
Acceptance does not depend on the device (in float32, up to rounding), so the CPU measures it;
what a verify row costs is the GPU's own measurement. Every run is checked token-identical to AR.
Run from the repo root: python docs/scripts/node_budget.py [greedy|paper] [paper|fused] [new tokens] [budgets]"""
import sys

import longswift
from longswift.config import GenerationConfig, SamplingConfig, SpecConfig

preset = sys.argv[1] if len(sys.argv) > 1 else "greedy"
mode = sys.argv[2] if len(sys.argv) > 2 else "paper"
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 512
budgets = [int(b) for b in sys.argv[4].split(",")] if len(sys.argv) > 4 else [0, 64, 32, 16, 8]
sampling = SamplingConfig(temperature=0, repetition_penalty=1.0) if preset == "greedy" else SamplingConfig(seed=0)

e = longswift.load(threads=1)
ids = e.encode(open("docs/prompts/clockmaker.txt").read())[:2048]
gen = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
ar = e.generate(ids, method="ar", sampling=sampling, generation=gen)
print(f"{preset} {mode}: ar {ar.stats.tokens_per_second:.1f} tok/s", flush=True)
print("| budget | tokens/step | alpha | rows/step | n-gram accepted | CPU verify ms/step | same as AR |")
print("|---|---|---|---|---|---|---|")
for budget in budgets:
    spec = SpecConfig(tree="1,3,3,3", ngram_topk=20, draft_mode=mode, max_nodes=budget, adaptive=False)
    r = e.generate(ids, method="tokenswift", sampling=sampling, generation=gen, spec=spec)
    s = r.stats
    steps = s.steps - 1  # the first token comes from the prefill
    print(f"| {budget or 'none'} | {s.tokens_per_step:.2f} | {s.alpha:.2f} | {s.verified_nodes / steps:.1f} | "
          f"{s.ngram_accepted}/{s.accepted_tokens} | {1000 * s.stage_seconds['verify'] / steps:.0f} | "
          f"{r.token_ids == ar.token_ids} |", flush=True)
