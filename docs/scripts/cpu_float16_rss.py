"""A float16 run of the embedded model on the CPU: resident memory as the tokens come, the decode speed and a
hash of the tokens: `python docs/scripts/cpu_float16_rss.py METHOD NEW` (METHOD ar or tokenswift; one thread,
greedy, EOS ignored, a short chat prompt). For an A/B, run it on two checkouts (`git stash`, or PYTHONPATH)."""

from __future__ import annotations

import hashlib
import os
import sys

import longswift
from longswift import GenerationConfig, SamplingConfig

method, new = sys.argv[1], int(sys.argv[2])
engine = longswift.load(threads=1, dtype="float16")


def rss_mib() -> int:
    with open("/proc/self/statm") as f:  # (Linux) resident pages are the second field
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)


ids = engine.encode("Write a long story about a lighthouse keeper.", chat=True)
stream = engine.stream(ids, method=method, sampling=SamplingConfig(temperature=0),
                       generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
marks, n, mark = {}, 0, 100
for block in stream:
    n += len(block)
    if n >= mark:
        marks[n] = rss_mib()
        mark += 200
s = stream.result.stats
digest = hashlib.sha256(str(stream.result.token_ids).encode()).hexdigest()[:12]
print(f"{method}: RSS MiB after tokens {marks}, {(s.new_tokens - 1) / s.decode_seconds:.1f} tok/s, tokens {digest}")
