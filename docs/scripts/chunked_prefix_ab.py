"""The length path's verify attention with the span in chunks (flash's regular kernel, 128 query rows a tile)
against the split kernel (one grouped query token, 64 rows a tile), 8B shape (8 KV heads of 128, 4 query
heads each), bfloat16 on CUDA. Session 51 (H200): a 32-node verify pass at 100K context cost 13.45 ms, 1.45x
an AR step, against 10.54 for 8 nodes: 128 rows a KV head are two tiles of the split kernel, each reading the
whole cache.

For each node count and cached length: by_length (the prefix, the new entries under a causal mask, merged) for
LAYERS layers, each over its own cache (so that no layer finds the last one's keys in L2), captured in one CUDA
graph and replayed; the median of REPS replays, per layer, chunked (prefix_chunks' count) and not (chunks=1).
Also one decoding token's prefix_attention (the AR step's call) for scale, and the largest difference between
the two verify outputs (bf16 rounding: the chunks round each part's output).

python docs/scripts/chunked_prefix_ab.py [NODES [CONTEXTS]]   (defaults 8,16,32,41,64,121 and 4096,32768,100000)

Without CUDA it says so and stops: the kernels it compares exist only there."""

from __future__ import annotations

import sys

import torch

from longswift.runtime.attention import additive_mask, by_length, key_span, prefix_attention, prefix_chunks

HKV, GRP, D = 8, 4, 128
LAYERS, REPS = 8, 20


def span_of(context: int) -> int:
    """The span a step at `context` cached slots reads: doubled from 1,024 (runtime.cuda_graphs.span_for)."""
    span = 1024
    while span < context + 1:
        span *= 2
    return span


def replayed_ms(fn) -> float:
    """Median ms of one replay of fn() captured in a CUDA graph, over REPS replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare (the chunked path runs flash's CUDA kernels)")
        return
    nodes = [int(n) for n in (sys.argv[1] if len(sys.argv) > 1 else "8,16,32,41,64,121").split(",")]
    contexts = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "4096,32768,100000").split(",")]
    cuda, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    print(f"{torch.cuda.get_device_name(cuda)}, torch {torch.__version__}; {HKV} KV heads x {GRP} query heads of "
          f"{D}, bf16; per layer (median of {REPS} replays of {LAYERS} layers), microseconds")
    print("| context | span | nodes | rows a KV head | chunks | split kernel us | chunked us | chunked / split "
          "| AR prefix us | max |diff| |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for context in contexts:
        span = span_of(context)
        caches = [(torch.randn(HKV, span, D, device=cuda, dtype=dtype),
                   torch.randn(HKV, span, D, device=cuda, dtype=dtype)) for _ in range(LAYERS)]
        used = torch.tensor([context], device=cuda)
        q1 = torch.randn(HKV, GRP, D, device=cuda, dtype=dtype)
        ar_ks = key_span(used + 1, span)
        ar_us = 1e3 * replayed_ms(lambda: [prefix_attention(q1, k, v, ar_ks, scale) for k, v in caches]) / LAYERS
        for n in nodes:
            rows = GRP * n
            q = torch.randn(HKV, rows, D, device=cuda, dtype=dtype)
            new_k, new_v = (torch.randn(HKV, n, D, device=cuda, dtype=dtype) for _ in range(2))
            bias = additive_mask(torch.ones(n, n, dtype=torch.bool, device=cuda).tril_().repeat(GRP, 1), dtype)
            outs, us = {}, {}
            for label, chunks in (("split", 1), ("chunked", None)):
                ks = key_span(used, span, rows=rows, hkv=HKV, chunks=chunks)

                def run(ks=ks, label=label) -> None:
                    outs[label] = [by_length(q, k, v, ks, new_k, new_v, bias, scale) for k, v in caches]

                us[label] = 1e3 * replayed_ms(run) / LAYERS
            p = prefix_chunks(rows, HKV, span)
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(outs["split"], outs["chunked"]))
            print(f"| {context} | {span} | {n} | {rows} | {p} | {us['split']:.1f} | {us['chunked']:.1f} | "
                  f"{us['chunked'] / us['split']:.2f} | {ar_us:.1f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main()
