"""Tree / draft-mode / n-gram sweep with the shipped heads (2K-token prose prompt, 512 tokens), run from the repo root."""
import longswift
from longswift.config import GenerationConfig, SamplingConfig, SpecConfig

e = longswift.load()
text = open("docs/prompts/clockmaker.txt").read()
ids = e.encode(text)[:2048]
gen = GenerationConfig(max_new_tokens=512, ignore_eos=True)
grid = {"greedy": [(t, m, k) for t in ["1,1,1,1", "1,2,1,1", "1,1,1"] for m in ["paper", "fused"] for k in [1, 3]],
        "paper": [(t, m, k) for t in ["1,1,1,1", "1,2,1"] for m in ["paper", "fused"] for k in [0, 1]]}
for sname, samp in [("greedy", SamplingConfig(temperature=0, repetition_penalty=1.0)), ("paper", SamplingConfig(seed=0))]:
    r = e.generate(ids, method="ar", sampling=samp, generation=gen)
    ar = r.stats.tokens_per_second
    print(f"{sname} ar {ar:.1f} tok/s", flush=True)
    for tree, mode, k in grid[sname]:
            r2 = e.generate(ids, method="tokenswift", sampling=samp, generation=gen, spec=SpecConfig(tree=tree, draft_mode=mode, ngram_topk=k, adaptive=False))
            s = r2.stats
            assert r2.token_ids == r.token_ids
            print(f"{sname} {tree} {mode} ng{k}: {s.tokens_per_second:.1f} tok/s ({s.tokens_per_second/ar:.2f}x) alpha {s.alpha:.2f} tps {s.tokens_per_step:.2f} ngram {s.ngram_accepted}/{s.accepted_tokens} verify ms/step {1000*s.stage_seconds['verify']/s.steps:.1f} draft ms/step {1000*s.stage_seconds['draft']/s.steps:.1f}", flush=True)
