"""AR decode ms/token at 8.7K-9.2K context (embedded model, rope yarn:2, the clockmaker prompt four times cut
to 8,600 tokens, greedy, one thread), where session 34 made the oneDNN span step 512 keys instead of 256;
run it for two checkouts alternately (PYTHONPATH=CHECKOUT/src).

python docs/scripts/onednn_span_long_ab.py LABEL"""
import os, sys, time, torch, longswift
torch.set_num_threads(1)
e = longswift.load(threads=1, rope_scaling="yarn:2")
text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prompts", "clockmaker.txt")).read()
ids = e.encode(text) * 4
ids = ids[:8600]
stream = e.stream(ids, sampling=longswift.SamplingConfig(temperature=0),
                  generation=longswift.GenerationConfig(max_new_tokens=600, ignore_eos=True), method="ar")
marks = {}
for _ in stream:
    n = len(stream.token_ids)
    if n in (100, 600):
        marks[n] = time.perf_counter()
print(sys.argv[1], longswift.__file__, "ms/token over tokens 100-600:", round((marks[600]-marks[100])*1000/500, 2), "ids_tail", stream.token_ids[-3:], flush=True)
