"""What bfloat16 costs against float32 for the embedded model's LM head ([49152, 576]) by the rows of a product, on
this CPU: `python docs/scripts/bf16_head_rows.py [REPS]` (default 3; one thread).

Rows 1 and 32 are what decoding and a verify pass read; 1,024 and 3,072 what train-heads' loss reads per chunk
(--chunk 1024 positions x up to 3 heads). Two ways each: `F.linear` (what bfloat16 autocast runs in train-heads)
and oneDNN's packed product (`mkldnn._linear_pointwise`, what the runner uses on CPU). Prints each one's best time
over REPS and the bfloat16/float32 ratio, and whether this CPU multiplies bfloat16 in hardware
(runtime.linear.bfloat16_products_native: AVX512-BF16 or AMX), which train-heads' --bf16-lm-head default reads."""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from longswift.runtime.linear import bfloat16_products_native, onednn_computes

VOCAB, HIDDEN = 49152, 576


def best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, oneDNN bfloat16: "
          f"{onednn_computes(torch.bfloat16)}, bfloat16 in hardware: {bfloat16_products_native()}")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen) / HIDDEN**0.5
    print("| rows | F.linear float32 ms | F.linear bfloat16 ms | ratio | packed float32 ms | packed bfloat16 ms "
          "| ratio |")
    print("|---|---|---|---|---|---|---|")
    for rows in (1, 32, 1024, 3072):
        x = torch.randn(rows, HIDDEN, generator=gen)
        cells = []
        plain = {}
        for dt in (torch.float32, torch.bfloat16):
            xd, wd = x.to(dt), weight.to(dt)  # (converted once: a step's autocast converts the head once too)
            plain[dt] = best(lambda xd=xd, wd=wd: F.linear(xd, wd), reps)
        cells += [plain[torch.float32], plain[torch.bfloat16], plain[torch.bfloat16] / plain[torch.float32]]
        packed = {}
        for dt in (torch.float32, torch.bfloat16):
            if not onednn_computes(dt):
                packed[dt] = float("nan")
                continue
            w = torch.ops.mkldnn._reorder_linear_weight(weight.to(dt))
            xd = x.to(dt)
            packed[dt] = best(lambda xd=xd, w=w: torch.ops.mkldnn._linear_pointwise(xd, w, None, "none", [], ""),
                              reps)
        cells += [packed[torch.float32], packed[torch.bfloat16], packed[torch.bfloat16] / packed[torch.float32]]
        print(f"| {rows} | " + " | ".join(f"{c * 1e3:.1f}" if i % 3 != 2 else f"{c:.2f}x" for i, c in enumerate(cells))
              + " |")


if __name__ == "__main__":
    main()
