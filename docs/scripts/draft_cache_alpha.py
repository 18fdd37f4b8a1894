"""Draft acceptance of each --draft-cache mode past a small draft budget: the embedded model and its shipped
heads, greedy, every step a full step with no n-gram paths (so alpha measures the heads' drafts alone), the clockmaker
prompt's first PREFIX tokens, a draft budget of 1,024 with a 256-token window (so the window fills every
few dozen steps). Prints alpha (accepted drafted tokens / drafted positions) and tokens per step per mode,
and checks each mode's tokens equal AR's. Run from the repo root:
python docs/scripts/draft_cache_alpha.py [prefix] [new tokens] [modes, e.g. dynamic,static,full]"""
import sys

import longswift
from longswift.config import GenerationConfig, SamplingConfig, SpecConfig

prefix = int(sys.argv[1]) if len(sys.argv) > 1 else 1536
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 768
modes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["dynamic", "static", "full"]

e = longswift.load()
ids = e.encode(open("docs/prompts/clockmaker.txt").read())[:prefix]
sampling = SamplingConfig(temperature=0, repetition_penalty=1.0)
gen = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
ar = e.generate(ids, method="ar", sampling=sampling, generation=gen).token_ids
for mode in modes:
    spec = SpecConfig(draft_cache=mode, draft_kv_budget=1024, draft_window=256, ngram_topk=0, adaptive=False,
                      suffix_lookup=False)
    out = e.generate(ids, method="tokenswift", sampling=sampling, generation=gen, spec=spec)
    s = out.stats
    print(f"{mode}: alpha {s.accepted_tokens / s.draft_positions:.3f} ({s.accepted_tokens} of {s.draft_positions}), "
          f"{s.tokens_per_step:.2f} tokens/step over {s.steps} steps, identical to AR: {out.token_ids == ar}",
          flush=True)
