"""The length path's attention through flash (what runs today) against the Triton attention (--triton-kernels,
runtime.triton_kernels.attention), 8B shape (8 KV heads of 128, 4 query heads each), bfloat16 on CUDA.

Session 51 (H200): a 32-node verify pass at 100K context cost 13.45 ms, 1.45x an AR step (target: 1.3x). Its
attention ran at about 185 TFLOPS through torch's FlashAttention-2 kernels, which take a KV head's rows 64 at a
time; the Triton attention takes all 128 rows of a 32-node pass in one block (each key read once) and splits the
keys among the device's multiprocessors. Neither figure for it exists yet: this script measures it.

For each cached length and node count (1: a decoding token, prefix_attention; more: a verify pass, by_length
over the prefix and the new entries under a random trie, merged), LAYERS layers each over its own cache (no
layer finds the last one's keys in L2), captured in one CUDA graph and replayed; the median of REPS replays, per
layer, in microseconds, both ways, their ratio, the Triton attention's TFLOPS (4 * rows * keys * D FLOP a KV
head), and the largest difference between the two outputs (bf16 rounding).

python docs/scripts/triton_attention_ab.py [NODES [CONTEXTS]]   (defaults 1,8,16,32,41,64,121 and
4096,32768,100000)

Without CUDA it says so and stops: flash's kernels and the compiled Triton kernels exist only there."""

from __future__ import annotations

import sys

import torch

from longswift.runtime.attention import additive_mask, by_length, key_span, prefix_attention
from longswift.runtime.triton_kernels import attention, attention_parts

HKV, GRP, D = 8, 4, 128
LAYERS, REPS = 8, 20


def span_of(context: int) -> int:
    """The span a step at `context` cached slots reads: doubled from 1,024 (runtime.cuda_graphs)."""
    span = 1024
    while span < context + 1:
        span *= 2
    return span


def random_trie(n: int, gen: torch.Generator) -> torch.Tensor:
    seen = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        seen[i] |= seen[int(torch.randint(0, i, (1,), generator=gen))]
    return seen


def replayed_ms(fn) -> float:
    """Median ms of one replay of fn() captured in a CUDA graph, over REPS replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up (and the Triton compile) outside the capture
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
        print("no CUDA device: nothing to compare (flash's kernels and the compiled Triton kernels run on CUDA)")
        return
    nodes = [int(n) for n in (sys.argv[1] if len(sys.argv) > 1 else "1,8,16,32,41,64,121").split(",")]
    contexts = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "4096,32768,100000").split(",")]
    cuda, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name(cuda)}, torch {torch.__version__}; {HKV} KV heads x {GRP} query heads of "
          f"{D}, bf16; per layer (median of {REPS} replays of {LAYERS} layers), microseconds")
    print("| context | nodes | rows a KV head | parts | flash us | triton us | triton / flash | triton TFLOPS "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for context in contexts:
        span = span_of(context)
        caches = [(torch.randn(HKV, span + 128, D, device=cuda, dtype=dtype),
                   torch.randn(HKV, span + 128, D, device=cuda, dtype=dtype)) for _ in range(LAYERS)]
        for n in nodes:
            rows = GRP * n
            q = torch.randn(HKV, rows, D, device=cuda, dtype=dtype)
            parts = attention_parts(cuda, HKV, rows, span)
            outs: dict[str, list[torch.Tensor]] = {}
            if n == 1:  # a decoding token: its key is the last used slot
                used = torch.tensor([context + 1], device=cuda)
                ks = key_span(used, span)

                def flash(ks=ks) -> None:
                    outs["flash"] = [prefix_attention(q, k[:, :span], v[:, :span], ks, scale) for k, v in caches]

                def triton(used=used, parts=parts) -> None:
                    outs["triton"] = [attention(q, k, v, used, scale, None, parts) for k, v in caches]
            else:
                used = torch.tensor([context], device=cuda)
                ks = key_span(used, span)
                tree = random_trie(n, gen).to(cuda)
                bias = additive_mask(tree.repeat(GRP, 1), dtype)

                def flash(ks=ks, bias=bias, n=n) -> None:
                    outs["flash"] = [by_length(q, k[:, :span], v[:, :span], ks, k[:, context:context + n],
                                               v[:, context:context + n], bias, scale) for k, v in caches]

                def triton(used=used, tree=tree, parts=parts) -> None:
                    outs["triton"] = [attention(q, k, v, used, scale, tree, parts) for k, v in caches]
            us = {label: 1e3 * replayed_ms(fn) / LAYERS for label, fn in (("flash", flash), ("triton", triton))}
            keys = context + (1 if n == 1 else n)
            tflops = 4 * HKV * rows * keys * D / (us["triton"] * 1e-6) / 1e12
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(outs["flash"], outs["triton"]))
            print(f"| {context} | {n} | {rows} | {parts} | {us['flash']:.1f} | {us['triton']:.1f} | "
                  f"{us['triton'] / us['flash']:.2f} | {tflops:.0f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main()
