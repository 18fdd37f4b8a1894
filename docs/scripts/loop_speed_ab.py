"""The generation loops' own speed, for an A/B of two checkouts: `PYTHONPATH=CHECKOUT/src python
docs/scripts/loop_speed_ab.py LABEL` (run alternately with each checkout). The embedded model, one thread,
the first 2,048 tokens of docs/prompts/clockmaker.txt (no chat template), 300 greedy tokens with EOS
ignored, AR then TokenSwift (default heads), each twice: prints ms per token and the last tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import longswift
from longswift import GenerationConfig, SamplingConfig

engine = longswift.load(threads=1)
text = (Path(__file__).resolve().parents[1] / "prompts" / "clockmaker.txt").read_text()
ids = engine.encode(text, chat=False)[:2048]
for method in ("ar", "tokenswift"):
    times = []
    for _ in range(2):
        r = engine.generate(ids, method=method, sampling=SamplingConfig(temperature=0),
                            generation=GenerationConfig(max_new_tokens=300, ignore_eos=True))
        times.append(r.stats.decode_seconds / r.stats.new_tokens * 1e3)
    print(sys.argv[1] if len(sys.argv) > 1 else "", method, [round(t, 2) for t in times], r.token_ids[-3:])
