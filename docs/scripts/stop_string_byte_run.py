"""The stop-string checker's time a token inside one long byte-fallback run (session 69).

    python docs/scripts/stop_string_byte_run.py

A Llama-2-style tokenizer (words with "▁", all 256 byte tokens, a ByteFallback decoder: built as
tests/test_detok.py's sentencepiece_tokenizer), 1,500 "東" as 4,500 byte tokens pushed one at a time into
StopStrings with the stop string "京京"; prints ms a token. Before session 69 a window inside a run was
widened back to the run's start (up to 1,024 tokens decoded a token)."""

import time

from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from longswift.stop_strings import StopStrings

vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
for word in ["▁hello", "▁world", "▁the", "▁end", "▁"]:
    vocab[word] = len(vocab)
backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", bos_token="<s>", unk_token="<unk>")

ids = [3 + b for b in ("東" * 1500).encode()]
checker = StopStrings(tokenizer, ("京京",))
start = time.perf_counter()
for t in ids:
    checker.cut([t])
print(f"{(time.perf_counter() - start) / len(ids) * 1e3:.3f} ms a token over {len(ids):,} byte tokens of one run")
