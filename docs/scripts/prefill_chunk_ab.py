"""Time reading a prompt with the embedded model at several --prefill-chunk sizes, interleaved round by round.

    python docs/scripts/prefill_chunk_ab.py PROMPT_TOKENS CHUNK[,CHUNK...] [ROUNDS] [auto|cascade|explicit|onednn]

Each round reads the same PROMPT_TOKENS tokens (docs/prompts/clockmaker.txt, repeated) once per chunk size, through
`Transformer.prefill` as a run does; prints every round's seconds and each size's best and median. The last token's
logits are compared across sizes (their largest difference: rounding, since chunks sum in other orders)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

import longswift
from longswift.runtime.cache import FullKVCache

PROMPT = Path(__file__).resolve().parents[1] / "prompts" / "clockmaker.txt"


def main() -> None:
    p, chunks = int(sys.argv[1]), [int(c) for c in sys.argv[2].split(",")]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    kernel = sys.argv[4] if len(sys.argv) > 4 else "auto"
    engine = longswift.load()
    model, cfg = engine.model, engine.cfg
    model.attention.kernel = None if kernel == "auto" else kernel
    ids = engine.encode(PROMPT.read_text())
    while len(ids) < p:
        ids += ids
    tokens = torch.tensor(ids[:p])
    times: dict[int, list[float]] = {c: [] for c in chunks}
    last: dict[int, torch.Tensor] = {}
    with torch.inference_mode():
        for r in range(rounds):
            for c in chunks:
                cache = FullKVCache(cfg, p, model.dtype, model.device)
                start = time.perf_counter()
                logits, _ = model.prefill(tokens, cache, c)
                times[c].append(time.perf_counter() - start)
                last[c] = logits
            print(f"round {r}: " + "  ".join(f"{c}: {times[c][-1]:.2f} s" for c in chunks), flush=True)
    ref = last[chunks[0]]
    for c in chunks:
        diff = (last[c] - ref).abs().max().item()
        print(f"chunk {c}: best {min(times[c]):.2f} s, median {statistics.median(times[c]):.2f} s, "
              f"{p / min(times[c]):.0f} tok/s; logits vs chunk {chunks[0]}: max diff {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
