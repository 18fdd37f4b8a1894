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

python docs/scripts/triton_attention_ab.py tune [CASES]   the Triton attention alone under every AttentionTiles of
  keys 32/64/128 a tile, 4/8 warps and 2/3/4 pipeline stages, per case CONTEXT:NODES (default
  100000:32,100000:121,100000:1,4096:1,4096:32), the six fastest first, after the default's time; a choice that
  does not compile (shared memory) says so.

Without CUDA it says so and stops: flash's kernels and the compiled Triton kernels exist only there."""

from __future__ import annotations

import sys

import torch

from longswift.runtime.attention import additive_mask, by_length, key_span, prefix_attention
from longswift.runtime.cuda_graphs import BUCKET, span_for
from longswift.runtime.triton_kernels import DEFAULT_TILES, AttentionTiles, attention, attention_parts

HKV, GRP, D = 8, 4, 128
LAYERS, REPS = 8, 20


def span_of(context: int) -> int:
    """The span a step at `context` cached slots reads (StepGraphs: its slot + 1, in a cache that does not cut it)."""
    return span_for(context + 1, BUCKET, 1 << 62)


def layer_caches(span: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """LAYERS layers' bfloat16 keys and values [HKV, span + 128, D] (room for a pass's new entries past the span)."""
    return [(torch.randn(HKV, span + 128, D, device=device, dtype=torch.bfloat16),
             torch.randn(HKV, span + 128, D, device=device, dtype=torch.bfloat16)) for _ in range(LAYERS)]


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


def tune(cases: list[tuple[int, int]]) -> None:
    cuda, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    gen = torch.Generator().manual_seed(0)
    choices = [DEFAULT_TILES, *(AttentionTiles(n, w, s) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4))]
    print(f"{torch.cuda.get_device_name(cuda)}, torch {torch.__version__}; the Triton attention per layer "
          f"(median of {REPS} replays of {LAYERS} layers), microseconds; default {DEFAULT_TILES}")
    for context, n in cases:
        span = span_of(context)
        caches = layer_caches(span, cuda)
        rows = GRP * n
        q = torch.randn(HKV, rows, D, device=cuda, dtype=dtype)
        parts = attention_parts(cuda, HKV, rows, span)
        used = torch.tensor([context + 1 if n == 1 else context], device=cuda)
        tree = None if n == 1 else random_trie(n, gen).to(cuda)
        timed: list[tuple[float, AttentionTiles]] = []
        failed = []
        for tiles in choices:
            try:
                us = 1e3 * replayed_ms(lambda: [attention(q, k, v, used, scale, tree, parts, tiles)
                                                for k, v in caches]) / LAYERS
            except Exception as e:  # a choice that does not compile: too much shared memory, registers
                failed.append(f"{tiles}: {type(e).__name__}")
                continue
            timed.append((us, tiles))
        timed.sort(key=lambda x: x[0])
        default = next((us for us, tiles in timed if tiles == DEFAULT_TILES), None)
        print(f"\n{context} cached, {n} nodes ({rows} rows a KV head, {parts} parts); the default tiles: "
              + (f"{default:.1f} us" if default is not None else "did not run"), flush=True)
        for us, tiles in timed[:6]:
            keys = context + (1 if n == 1 else n)
            print(f"  {us:8.1f} us  {4 * HKV * rows * keys * D / (us * 1e-6) / 1e12:5.0f} TFLOPS  {tiles}",
                  flush=True)
        for line in failed:
            print("  failed:", line, flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare (flash's kernels and the compiled Triton kernels run on CUDA)")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "tune":
        cases = sys.argv[2] if len(sys.argv) > 2 else "100000:32,100000:121,100000:1,4096:1,4096:32"
        tune([(int(c), int(n)) for c, n in (case.split(":") for case in cases.split(","))])
        return
    nodes = [int(n) for n in (sys.argv[1] if len(sys.argv) > 1 else "1,8,16,32,41,64,121").split(",")]
    # 100K first: the verify target's context, kept if `gpu_session.sh first` cuts the part off at its budget
    contexts = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "100000,4096,32768").split(",")]
    cuda, dtype, scale = torch.device("cuda"), torch.bfloat16, D**-0.5
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name(cuda)}, torch {torch.__version__}; {HKV} KV heads x {GRP} query heads of "
          f"{D}, bf16; per layer (median of {REPS} replays of {LAYERS} layers), microseconds")
    print("| context | nodes | rows a KV head | parts | flash us | triton us | triton / flash | triton TFLOPS "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for context in contexts:
        span = span_of(context)
        caches = layer_caches(span, cuda)
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
