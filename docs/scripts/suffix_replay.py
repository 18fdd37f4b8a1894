"""Replay lookup-step proposals along an AR run: how many tokens a lookup step of ROOM drafted nodes
would emit at every position, with the n-gram table's continuation of the root alone (the lookup
step before session 45) and with the suffix index's copy first (orders 8,4,2 and 4,3,2).

    python docs/scripts/suffix_replay.py clockmaker|lighthouse NEW_TOKENS [ROOM [PRESET]]

clockmaker: docs/prompts/clockmaker.txt repeated to 2,048 tokens (bench's --prefix 2048); lighthouse:
docs/prompts/lighthouse.txt as a chat message. PRESET: one of bench's (default greedy; seed 0), whose
penalty window both tables leave out as the loop does. The embedded model, one thread. A step's tokens
are counted as 1 + the longest proposed path that matches the run's next tokens (under greedy decoding
what the walk accepts; under sampling a proxy: the draws that were made); the replay roots a step at
every generated position (not the positions a real run's steps land on)."""

from __future__ import annotations

import sys
from pathlib import Path

from dataclasses import replace

import torch

import longswift
from longswift import GenerationConfig, SamplingConfig
from longswift.bench.grid import PRESETS
from longswift.bench.prompts import build_prompts, read_bench_prompt_file
from longswift.spec.ngram import NGRAM_N, NGramTracker
from longswift.spec.suffix import SuffixIndex
from longswift.spec.tree import NGRAM, Trie

PROMPTS = Path(__file__).resolve().parents[1] / "prompts"


def ar_run(kind: str, new: int, sampling: SamplingConfig) -> tuple[list[int], int]:
    engine = longswift.load()
    if kind == "clockmaker":
        clockmaker = read_bench_prompt_file(PROMPTS / "clockmaker.txt")
        prompt = list(build_prompts(engine, clockmaker, False, (2048,), 0)[0][1].ids)
    else:
        prompt = engine.encode((PROMPTS / "lighthouse.txt").read_text(), chat=True)
    out = engine.generate(prompt, method="ar", sampling=sampling,
                          generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
    return prompt + out.token_ids, len(prompt)


def emitted(trie: Trie, tokens: list[int], i: int) -> int:
    """The tokens a step rooted at tokens[i] emits under greedy decoding: 1 + the trie's longest path
    along the run's next tokens."""
    node, n = 0, 1
    while i + n < len(tokens) and (child := trie.children[node].get(tokens[i + n])) is not None:
        node, n = child, n + 1
    return n


def main() -> None:
    kind, new = sys.argv[1], int(sys.argv[2])
    room = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    preset = sys.argv[4] if len(sys.argv) > 4 else "greedy"
    sampling = replace(PRESETS[preset], seed=0)
    torch.set_num_threads(1)
    tokens, start = ar_run(kind, new, sampling)
    exclude = sampling.penalized_window
    ngrams = NGramTracker(NGRAM_N, exclude)
    indexes = {"8,4,2": SuffixIndex(exclude, (8, 4, 2)), "4,3,2": SuffixIndex(exclude, (4, 3, 2))}
    totals = {"n-gram only": 0, **{f"copy {k} + n-gram": 0 for k in indexes}}
    for i in range(start, len(tokens) - 1):
        ngrams.update(tokens, i + 1)
        top = ngrams.table.top(tokens[i], 1)
        gram = top[0][0] if top else ()
        alone = Trie.with_root(tokens[i])
        alone.add_path(gram, NGRAM)
        totals["n-gram only"] += emitted(alone, tokens, i)
        for name, index in indexes.items():  # as lookup_tree builds an unpruned trie of room + 1 nodes
            index.update(tokens, i + 1)
            trie = Trie.with_root(tokens[i])
            trie.add_path(index.propose(tokens, i + 1, room), NGRAM)
            if len(trie) + trie.missing(gram) <= room + 1:
                trie.add_path(gram, NGRAM)
            totals[f"copy {name} + n-gram"] += emitted(trie, tokens, i)
    steps = len(tokens) - 1 - start
    print(f"{kind}: {new} tokens ({preset}), lookup steps of at most {room} drafted nodes rooted at each of "
          f"{steps} positions")
    for name, total in totals.items():
        print(f"  {name:22s} {total / steps:.2f} tokens a step")


if __name__ == "__main__":
    main()
