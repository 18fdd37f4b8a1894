"""Where the GPU time of one AR decode step goes (issue #16: the 8B step reached 45-60% of the
bandwidth floor in session 6, and no profile located the rest). Random weights of a real shape,
colocated linears and the fused kernels, as a model loaded from a file runs on CUDA. Per context:

- the step's wall time replayed as a CUDA graph (how generation runs it, sampling excluded) and
  run eagerly (the same body, kernel by kernel), medians of 30, against the bandwidth floor;
- the kernels of one step, from torch.profiler: count and GPU time per class (matrix products,
  attention, norms, copies and indexing, reductions, element-wise, other) and the slowest kernels.

python docs/scripts/gpu_step_profile.py SHAPE CONTEXTS [LAYERS [ATTENTION [triton]]]
(e.g. llama-3.1-8b 4096,100000; smollm2-135m 2048; LAYERS "" for all; ATTENTION bucketed (default) or
length, which says why and stops where this torch's flash kernel cannot run it; `triton`: with
--triton-kernels, whose rope_store and silu_mul are a class of their own; its norm and attention kernels count
as norms and attention)

Without CUDA it profiles the eager body on the CPU in float32, counting torch ops' own CPU time
instead of kernels: a check that the script runs, not a measurement of anything this issue targets."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from longswift.bench.shapes import random_state, shape_config, weight_bytes_read
from longswift.bench.timing import measure_bandwidth, median_seconds, synchronizer
from longswift.runtime.attention import length_unsupported
from longswift.runtime.cache import FullKVCache
from longswift.runtime.cuda_graphs import StepGraphs
from longswift.runtime.model import Transformer
from longswift.runtime.triton_kernels import triton_unavailable

# A kernel's class is the first whose words appear in its lower-cased name (attention before products:
# flash's split-KV kernel says "splitkv"; norms and copies before element-wise: their kernels say "vectorized").
# "attention" counts the flash kernels only: the explicit tail of bucketed attention (a bmm, a softmax)
# lands in matmul and reduction.
CLASSES = (
    ("triton", ("rope_store", "silu_mul")),  # --triton-kernels' own (runtime/triton_jit.py)
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitk", "addmm", "linear", "bmm", "mm")),
    ("norm", ("rms", "norm")),
    ("copy/index", ("copy", "memcpy", "memset", "index", "scatter", "gather", "cat", "fill", "embedding")),
    ("reduction", ("reduce", "softmax", "logsumexp", "sum", "max", "argmax")),
    ("element-wise", ("elementwise", "vectorized", "unrolled", "mul", "add", "silu", "roll", "exp")),
)
STEPS = 5  # decode steps per profile
REPS = 30  # timed steps per median


def kind(name: str) -> str:
    low = name.lower()
    return next((c for c, words in CLASSES if any(w in low for w in words)), "other")


@dataclass
class Profile:
    """Kernels (CUDA) or torch ops' own time (CPU) of one step: name -> (count, microseconds)."""

    kernels: dict[str, tuple[float, float]] = field(default_factory=dict)

    def classes(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for name, (n, us) in self.kernels.items():
            c = kind(name)
            count, total = out.get(c, (0.0, 0.0))
            out[c] = (count + n, total + us)
        return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))

    def total(self) -> tuple[float, float]:
        return sum(n for n, _ in self.kernels.values()), sum(us for _, us in self.kernels.values())


def profiled(step: Callable[[], object], cuda: bool) -> Profile:
    """One step's kernels (CUDA: the device's own kernel records, replayed graphs' included) or ops."""
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(STEPS):
            step()
        if cuda:
            torch.cuda.synchronize()
    result = Profile()
    for e in prof.key_averages():
        if cuda and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if cuda:
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        else:
            us = e.self_cpu_time_total
        if us > 0:
            result.kernels[e.key] = (e.count / STEPS, us / STEPS)
    return result


def report(label: str, ms: float, floor_ms: float, p: Profile, cuda: bool) -> None:
    n, us = p.total()
    what = "kernels" if cuda else "torch ops (own CPU time)"
    print(f"  {label}: {ms:.3f} ms a step ({100 * floor_ms / ms:.0f}% of the floor); {n:.0f} {what}, "
          f"{us / 1e3:.3f} ms of them ({100 * us / 1e3 / ms:.0f}% of the step)")
    if cuda and us < 0.5 * 1e3 * ms:  # CUPTI has recorded replayed graphs' kernels wrongly on some CUDA versions
        print(f"    (warning: the kernels recorded add up to {100 * us / 1e3 / ms:.0f}% of the step; if this is the "
              "replayed graph, read its split against the eager body's)")
    for c, (cn, cus) in p.classes().items():
        print(f"    {c:13s} {cn:6.0f} x  {cus / 1e3:8.3f} ms  ({100 * cus / max(us, 1e-9):4.1f}%)")
    top = sorted(p.kernels.items(), key=lambda kv: -kv[1][1])[:12]
    for name, (kn, kus) in top:
        print(f"      {kus / 1e3:8.3f} ms {kn:5.0f} x  {name[:110]}")


def main() -> None:
    shape, contexts = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    layers = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None  # "" = all of the shape's
    attention = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else "bucketed"
    triton = len(sys.argv) > 5 and sys.argv[5] == "triton"
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if attention == "length" and (why := length_unsupported(device)) is not None:
        print(f"--graph-attention length: {why}")
        return
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = synchronizer(device)
    cfg = shape_config(shape, layers)
    if triton and (why := triton_unavailable(device)) is not None:
        print(f"--triton-kernels: {why}")
        return
    model = Transformer(cfg, random_state(cfg, dtype, device), pack=True, triton_kernels=triton)
    bandwidth = measure_bandwidth(device, 2**30)
    capacity = max(contexts) + 64
    cache = FullKVCache(cfg, capacity, dtype, device)
    cache.k.normal_()
    cache.v.normal_()
    print(f"{shape} layers={cfg.num_layers} {str(dtype).removeprefix('torch.')} on "
          f"{torch.cuda.get_device_name(device) if cuda else 'cpu'}, torch {torch.__version__}, "
          f"graph attention {attention}; colocated={model.colocated} fused_norm={model.fused_norm} "
          f"fused_residual={model.fused_residual} fused_rope={model.fused_rope} "
          f"triton_kernels={model.triton_kernels}; read bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s", flush=True)
    ways = {"replayed": True, "eager body": False} if cuda else {"eager body": False}
    graphs = {label: StepGraphs(model, cache, capture=capture, attention=attention) for label, capture in ways.items()}
    elem = torch.empty((), dtype=dtype).element_size()
    for context in contexts:
        kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * context * elem
        floor_ms = 1e3 * (weight_bytes_read(cfg, dtype) + kv) / bandwidth
        print(f"context {context}: bandwidth floor {floor_ms:.3f} ms (weights "
              f"{weight_bytes_read(cfg, dtype) / 1e9:.2f} GB + KV {kv / 1e9:.2f} GB)", flush=True)
        for label, g in graphs.items():
            def step(g: StepGraphs = g) -> None:
                cache.length = context
                g.decode(5, context)

            ms = 1e3 * median_seconds(step, REPS, 3, sync)
            report(label, ms, floor_ms, profiled(step, cuda), cuda)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
