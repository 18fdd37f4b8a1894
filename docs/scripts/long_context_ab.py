"""The loops' speed at a longer context, for an A/B of two checkouts: `PYTHONPATH=CHECKOUT/src python
docs/scripts/long_context_ab.py LABEL CONTEXT [NEW]` (run alternately with each checkout). The embedded model, one
thread, docs/prompts/clockmaker.txt's tokens (no chat template) repeated to CONTEXT tokens, NEW (default 256)
greedy tokens with EOS ignored, AR then TokenSwift (default heads): prints ms per token, the prefill's seconds
and a hash of the tokens (each method's must match across checkouts)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import longswift
from longswift import GenerationConfig, SamplingConfig

label, context = sys.argv[1], int(sys.argv[2])
new = int(sys.argv[3]) if len(sys.argv) > 3 else 256
engine = longswift.load(threads=1)
text = (Path(__file__).resolve().parents[1] / "prompts" / "clockmaker.txt").read_text()
ids = engine.encode(text, chat=False)
ids = (ids * (context // len(ids) + 1))[:context]
for method in ("ar", "tokenswift"):
    r = engine.generate(ids, method=method, sampling=SamplingConfig(temperature=0),
                        generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
    s = r.stats
    digest = hashlib.sha256(str(r.token_ids).encode()).hexdigest()[:12]
    print(f"{label} {method} context {context}: {1e3 * s.decode_seconds / (s.new_tokens - 1):.1f} ms/token, "
          f"prefill {s.prefill_seconds:.1f} s, tokens {digest}", flush=True)
