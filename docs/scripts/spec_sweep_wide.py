"""Tree / draft-mode / n-gram sweep with the shipped heads (2K-token prose prompt, 512 tokens), run from the repo root."""
import longswift
from longswift.config import GenerationConfig, SamplingConfig, SpecConfig

e = longswift.load()
text = open("docs/prompts/clockmaker.txt").read()
ids = e.encode(text)[:2048]
gen = GenerationConfig(max_new_tokens=512, ignore_eos=True)
for sname, samp in [("greedy", SamplingConfig(temperature=0, repetition_penalty=1.0)), ("paper", SamplingConfig(seed=0))]:
    r = e.generate(ids, method="ar", sampling=samp, generation=gen)
    ar = r.stats.tokens_per_second
    print(f"{sname} ar {ar:.1f} tok/s", flush=True)
    for tree in ["1,3,3,3", "1,2,2,1", "1,1,1,1", "1,3,1"]:
        for mode in ["paper", "fused"]:
            r2 = e.generate(ids, method="tokenswift", sampling=samp, generation=gen, spec=SpecConfig(tree=tree, draft_mode=mode, ngram_topk=20, adaptive=False))
            s = r2.stats
            assert r2.token_ids == r.token_ids
            print(f"{sname} {tree} {mode}: {s.tokens_per_second:.1f} tok/s ({s.tokens_per_second/ar:.2f}x) alpha {s.alpha:.2f} tps {s.tokens_per_step:.2f} ngram {s.ngram_accepted}/{s.accepted_tokens} stages " + " ".join(f"{k}={v:.1f}" for k,v in s.stage_seconds.items()), flush=True)
