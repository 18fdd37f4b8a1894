"""AR, then TokenSwift with a wide trie (the GPU default 1,3,3,3 with 20 n-gram paths, adaptive
steps on), on the embedded model with its shipped heads and the 2,048-token clockmaker prefix, one
torch thread: decode tok/s of each, how many steps of each kind TokenSwift ran, and whether the
tokens are AR's. Run from the repo root (PYTHONPATH=<other checkout>/src to compare versions):

python docs/scripts/wide_trie_ab.py greedy|paper [new_tokens]"""
import sys
from pathlib import Path

import torch

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.bench.grid import PRESETS

torch.set_num_threads(1)
preset, new = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 512
engine = longswift.load(heads="default")
ids = engine.encode(Path("docs/prompts/clockmaker.txt").read_text())[:2048]
sampling = PRESETS[preset]
if not sampling.greedy:
    sampling = SamplingConfig(**{**sampling.__dict__, "seed": 1})
gen = GenerationConfig(max_new_tokens=new)
ar = engine.generate(ids, sampling=sampling, generation=gen, method="ar")
print(f"{preset} ar: {ar.stats.tokens_per_second:.1f} tok/s", flush=True)
ts = engine.generate(ids, sampling=sampling, generation=gen, method="tokenswift",
                     spec=SpecConfig(tree="1,3,3,3", ngram_topk=20))
st = ts.stats
narrow = getattr(st, "narrow_steps", 0)  # (absent before narrow steps existed)
print(f"{preset} tokenswift: {st.tokens_per_second:.1f} tok/s ({st.tokens_per_second / ar.stats.tokens_per_second:.2f}x), "
      f"full {st.steps - st.plain_steps - st.lookup_steps - narrow} narrow {narrow} lookup {st.lookup_steps} "
      f"plain {st.plain_steps}, tokens/step {st.tokens_per_step:.2f}; same tokens: {ts.token_ids == ar.token_ids}")
