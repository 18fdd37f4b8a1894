"""A model stuck on a token that completes no text: 10K lone UTF-8 lead bytes pushed one at a time into the
streaming decoder (a byte-level tokenizer built as tests/conftest.py's byte_tokenizer), seconds per 2,500.
Session 34: each push decoded the whole run again (quadratic: 8.5-9.7 s for 10K); now 0.12-0.15 s.

python docs/scripts/detok_stuck.py"""
import time
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
import longswift
from longswift.detok import IncrementalDecoder

vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
tok = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
lead = tok.encode("東")[0]  # the first of its three bytes: no text alone
decoder, start = IncrementalDecoder(tok), time.perf_counter()
print(longswift.__file__)
for i in range(1, 10_001):
    decoder.push([lead])
    if i % 2500 == 0:
        print(f"{i} tokens: {time.perf_counter() - start:.2f} s for the last 2,500", flush=True)
        start = time.perf_counter()
