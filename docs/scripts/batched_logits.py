"""Verify's LM head: all rows of a small trie in one pass vs one pass per visited row, interleaved
in one process (the shipped heads, 2K-token prose prompt, CPU defaults). Run from the repo root:
python docs/scripts/batched_logits.py [new_tokens] [rounds]"""
import sys

import longswift
import longswift.spec.tokenswift as ts
from longswift.config import GenerationConfig, SamplingConfig

new, rounds = (int(a) for a in (sys.argv[1:] + ["1024", "2"])[:2])
e = longswift.load(threads=int(__import__("os").environ.get("LONGSWIFT_THREADS", "0")) or None)
ids = e.encode(open("docs/prompts/clockmaker.txt").read())[:2048]
gen = GenerationConfig(max_new_tokens=new, ignore_eos=True)
batched = ts.BATCHED_LOGITS_NODES
for name, samp in [("greedy", SamplingConfig(temperature=0, repetition_penalty=1.0)), ("paper", SamplingConfig(seed=0))]:
    ar = e.generate(ids, method="ar", sampling=samp, generation=gen)
    print(f"{name} ar {ar.stats.tokens_per_second:.1f} tok/s", flush=True)
    for r in range(rounds):
        for label, limit in (("per-row", 0), ("batched", batched)):
            ts.BATCHED_LOGITS_NODES = limit
            out = e.generate(ids, method="tokenswift", sampling=samp, generation=gen)
            assert out.token_ids == ar.token_ids
            s = out.stats
            print(f"{name} round {r} {label}: {s.tokens_per_second:.1f} tok/s ({s.tokens_per_second / ar.stats.tokens_per_second:.2f}x ar) "
                  f"tokens/step {s.tokens_per_step:.2f} lookup steps {s.lookup_steps}/{s.steps} "
                  f"verify+accept ms/step {1000 * (s.stage_seconds['verify'] + s.stage_seconds['accept']) / (s.steps - 1):.1f}",
                  flush=True)
ts.BATCHED_LOGITS_NODES = batched
