"""The decode step's draw, each way captured in a CUDA graph and replayed: torch's ops (what a SAMPLED step body
runs without --triton-kernels: the penalty window's gather, the transform, draw_rows, the history write) against
the Triton kernels (runtime.triton_sampling), both through runtime.cuda_graphs.device_draw, the function the
body calls.

Session 51 (H200): the draw took 0.24 ms of the 4K AR step (6.11 ms; the target, 70% of the bandwidth floor, is
5.34). For each vocabulary and preset: microseconds a draw (the median of ROUNDS rounds of REPS replays), both
ways, their ratio, and how many of TOKENS uniforms (spread over [0, 1)) drew the same token both ways (they may
differ within rounding of a boundary: runtime.triton_sampling).

python docs/scripts/triton_sampling_ab.py [VOCABS]   (default 49152,128256: SmolLM2's, Llama 3's; each vocabulary
compiles the kernels anew, a second or so each, which `gpu_session.sh first` gives 60 s in all)

Without CUDA it says so and stops."""

from __future__ import annotations

import statistics
import sys

import torch

from longswift.config import SamplingConfig
from longswift.runtime.cuda_graphs import device_draw
from longswift.runtime.triton_sampling import sample_params, sampling_fits

PRESETS = {
    "greedy, penalty": SamplingConfig(temperature=0, repetition_penalty=1.2, penalty_window=1024),
    "paper (min-p 0.1, penalty 1.2 over 1,024)": SamplingConfig(seed=1),
    "temperature 0.8": SamplingConfig(temperature=0.8, min_p=0.0, repetition_penalty=1.0),
}
POSITION, ROUNDS, REPS, TOKENS = 3000, 7, 100, 200


def captured(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # (Triton compiles here, outside the capture)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph) -> float:
    times = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / REPS)
    return statistics.median(times)


def main(vocabs: list[int]) -> None:
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; a draw's microseconds, graph-replayed\n")
    print("| vocabulary | preset | torch us | Triton us | torch / Triton | same token |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for vocab in vocabs:
        logits = (torch.randn(vocab, generator=g) * 2.5).to(dev)
        history = torch.randint(0, vocab, (4096,), generator=g).to(dev)
        at = torch.tensor([POSITION], device=dev)
        for name, sampling in PRESETS.items():
            assert sampling_fits(sampling, logits.dtype)
            params = sample_params(sampling, logits.dtype, dev)
            u = torch.zeros(1, dtype=torch.float64, device=dev)
            times, drawn = [], []
            for triton in (False, True):
                tokens = torch.zeros(1, dtype=torch.long, device=dev)
                graph = captured(lambda: device_draw(logits, history, at, sampling, None if sampling.greedy else u,
                                                     tokens, params if triton else None))
                times.append(replay_us(graph))
                seen = []
                for k in range(TOKENS):
                    u.fill_((k + 0.5) / TOKENS)
                    graph.replay()
                    seen.append(int(tokens[0]))
                drawn.append(seen)
            same = sum(a == b for a, b in zip(*drawn))
            print(f"| {vocab:,} | {name} | {times[0]:.1f} | {times[1]:.1f} | {times[0] / times[1]:.2f}x | "
                  f"{same} of {TOKENS} |", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("no CUDA device: the draw's kernels run compiled only on one (tests/test_triton_sampling.py runs them "
              "interpreted here)")
        sys.exit(0)
    main([int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [49152, 128256])
