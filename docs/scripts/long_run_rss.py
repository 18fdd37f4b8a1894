"""Resident memory of a 100K-token TokenSwift run whose model forward costs little, so that everything
else a long run holds shows: a tiny random Llama (2 layers, hidden 64, vocab 49,152, a 128K context of its
own) whose layers add nothing (o_proj and down_proj zero), so greedy decoding falls into a cycle and
n-gram lookups and the packed CPU path's oneDNN attention run hot; random heads, greedy, no penalty, one
thread. Session 34 found with it that the oneDNN span's 256-row steps still grew such a run by ~0.6 GB
(docs/benchmarks.md). Run it for two checkouts with PYTHONPATH=CHECKOUT/src to compare them.

python docs/scripts/long_run_rss.py [N] [--every K]"""
import argparse, os, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import longswift

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int, nargs="?", default=100_000); ap.add_argument("--every", type=int, default=10_000)
a = ap.parse_args()
torch.set_num_threads(1)
torch.manual_seed(5)
cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=131072, bos_token_id=1, eos_token_id=2)
model = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_(); layer.mlp.down_proj.weight.zero_()
engine = longswift.load(model, heads="random", pack_weights=True, threads=1)
del model


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


stream = engine.stream([5, 6, 7, 8], method="tokenswift",  # (configs, not keywords: older checkouts compare)
                       generation=longswift.GenerationConfig(max_new_tokens=a.n, ignore_eos=True),
                       sampling=longswift.SamplingConfig(temperature=0, repetition_penalty=1.0))
start, mark = time.perf_counter(), 0
print(f"{longswift.__file__}\nnew tokens 0: {rss_mib():.0f} MiB", flush=True)
for _ in stream:
    if len(stream.token_ids) >= mark + a.every:
        mark += a.every
        print(f"new tokens {len(stream.token_ids)}: {rss_mib():.0f} MiB, {time.perf_counter() - start:.0f} s", flush=True)
s = stream.result.stats
print(f"{s.new_tokens} tokens in {s.decode_seconds:.1f} s decoding, {s.tokens_per_step:.2f} tokens/step", flush=True)
