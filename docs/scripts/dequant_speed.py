"""Time longswift's torch dequantizing (runtime/gguf_quants.py) against the gguf package's numpy.

    python docs/scripts/dequant_speed.py [ROW_VALUES] [THREADS]

Random blocks with ordinary float16 scales, 16M values a type in rows of ROW_VALUES (default 4096, a 7-8B
model's hidden size; 576 is the embedded model's); the best of three, in ms a million values. torch runs THREADS
threads (default 1; loading runs torch's, one per core, or --threads); gguf-py's numpy runs one whatever it is told.
Session 47 also ported Q8_0, Q5_0, Q5_1 and Q6_K and measured them here with one thread: Q8_0 1.0x, the others
0.7-0.9x, so they stayed with gguf-py. Session 49 moved Q8_0 to torch: with the two threads a load runs here it was
2-2.5x gguf-py (the embedded model's token embeddings, 28M values: 0.06 s against 0.16).
"""

import sys
import time

import gguf
import numpy as np
import torch

from longswift.runtime.loading.gguf_quants import DEQUANTIZE

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
rng = np.random.default_rng(0)
row = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
for kind, ours in DEQUANTIZE.items():
    qt = gguf.GGMLQuantizationType[kind]
    values, size = gguf.GGML_QUANT_SIZES[qt]
    if row % values:
        continue  # (k-quants' blocks are 256 values)
    rows = (16 << 20) // row
    n = rows * row // values
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    at = 208 if kind == "Q6_K" else 0  # where d (and m / dmin) is stored
    data[:, at:at + 4] = rng.normal(0, 0.05, size=(n, 2)).astype(np.float16).view(np.uint8)[:, :size - at]
    data = data.reshape(rows, -1)
    best = {}
    for name, run in (("gguf-py", lambda: gguf.quants.dequantize(data, qt)), ("torch", lambda: ours(data))):
        run()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best[name] = min(times) / 16 * 1e3
    print(f"rows of {row}: {kind}: gguf-py {best['gguf-py']:.2f} ms/M, torch {best['torch']:.2f} ms/M, "
          f"{best['gguf-py'] / best['torch']:.1f}x")
