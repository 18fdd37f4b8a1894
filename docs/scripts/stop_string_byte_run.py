"""The stop-string checker's time a token inside one long byte-fallback run (session 69).

    python docs/scripts/stop_string_byte_run.py

A Llama-2-style tokenizer (words with "▁", all 256 byte tokens, a ByteFallback decoder: built as
tests/test_detok.py's sentencepiece_tokenizer, imported from there: run from the repository with the dev
extras), 1,500 "東" as 4,500 byte tokens pushed one at a time into
StopStrings with the stop string "京京"; prints ms a token. Before session 69 a window inside a run was
widened back to the run's start (up to 1,024 tokens decoded a token)."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_detok import sentencepiece_tokenizer  # noqa: E402  (the tests' Llama-2-style tokenizer)

from longswift.stop_strings import StopStrings  # noqa: E402

tokenizer = sentencepiece_tokenizer()  # ids: 0-2 special, then <0x00>..<0xFF>
ids = [3 + b for b in ("東" * 1500).encode()]
checker = StopStrings(tokenizer, ("京京",))
start = time.perf_counter()
for t in ids:
    checker.cut([t])
print(f"{(time.perf_counter() - start) / len(ids) * 1e3:.3f} ms a token over {len(ids):,} byte tokens of one run")
