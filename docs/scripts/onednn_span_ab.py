"""AR decode time per token past the oneDNN attention threshold (tokens 850-1300 after the 2,260-token
clockmaker prompt: contexts 3,110-3,560), greedy, one thread, and the last ids; run it for two checkouts
alternately (PYTHONPATH=OTHER/src for the other) to compare them (session 33: the rounded oneDNN span).

python docs/scripts/onednn_span_ab.py LABEL"""
import os
import sys, time, torch, longswift
torch.set_num_threads(1)
e = longswift.load(threads=1)
text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prompts", "clockmaker.txt")).read()
stream = e.stream(text, sampling=longswift.SamplingConfig(temperature=0), generation=longswift.GenerationConfig(max_new_tokens=1300, ignore_eos=True), chat=False, method="ar")
marks = {}
for ids in stream:
    n = len(stream.token_ids)
    if n in (850, 1300):
        marks[n] = time.perf_counter()
print(sys.argv[1], longswift.__file__, "ms/token over tokens 850-1300:", round((marks[1300]-marks[850])*1000/450, 2), "ids_tail", stream.token_ids[-3:])
