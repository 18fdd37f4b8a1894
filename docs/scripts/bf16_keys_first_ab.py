"""bfloat16 decoding on the CPU with the attention scores as q @ keys^T (the CPU's bmm copies the transposed
key span first) against keys @ q^T read transposed (runtime/attention.py, `keys_first`), in one process on
the embedded model, the two alternately: `python docs/scripts/bf16_keys_first_ab.py [PROMPT [NEW [ROUNDS]]]`
(default a 2,048-token clockmaker prompt, 200 new tokens, 3 rounds; one thread). Prints each run's decode
ms/token and where the runs' tokens (AR and TokenSwift, greedy and the paper's sampling) first differ from AR's."""

from __future__ import annotations

import sys

import torch

import longswift
from longswift import GenerationConfig, SamplingConfig


def main() -> None:
    prompt_len = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    torch.set_num_threads(1)
    engine = longswift.load(dtype="bfloat16")
    ids = engine.tokenizer(open("docs/prompts/clockmaker.txt").read())["input_ids"][:prompt_len]
    gen = GenerationConfig(max_new_tokens=new, ignore_eos=True)
    presets = {"greedy": SamplingConfig(temperature=0), "paper": SamplingConfig(seed=1)}
    tokens: dict[tuple[str, str, bool], list[int]] = {}
    for r in range(rounds):
        for keys_first in (False, True):
            engine.model.attention.keys_first = keys_first
            for method in ("ar", "tokenswift"):
                for preset, sampling in presets.items():
                    result = engine.generate(ids, method=method, sampling=sampling, generation=gen)
                    s = result.stats
                    print(f"round {r} keys_first={keys_first!s:5} {method:10} {preset:6} "
                          f"{1e3 * s.decode_seconds / s.new_tokens:6.2f} ms/token", flush=True)
                    tokens.setdefault((method, preset, keys_first), result.token_ids)
    for preset in presets:
        runs = {key: ids for key, ids in tokens.items() if key[1] == preset}
        base = runs[("ar", preset, False)]
        first = {f"{m} keys_first={k}": next((i for i, (a, b) in enumerate(zip(ids, base)) if a != b), None)
                 for (m, _, k), ids in runs.items()}
        print(f"{preset}: the new token where each run's first differs from AR's (keys_first=False; None: the same):",
              first)


if __name__ == "__main__":
    main()
