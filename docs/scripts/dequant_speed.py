"""Time longswift's torch dequantizing (runtime/gguf_quants.py) against the gguf package's numpy, one thread.

    python docs/scripts/dequant_speed.py [ROW_VALUES]

Random blocks with ordinary float16 scales, 16M values a type in rows of ROW_VALUES (default 4096, a 7-8B
model's hidden size; 576 is the embedded model's); the best of three, in ms a million values. Session 47 also
ported Q8_0, Q5_0, Q5_1 and Q6_K and measured them here: Q8_0 1.0x, the others 0.7-0.9x, so they stayed with gguf-py.
"""

import sys
import time

import gguf
import numpy as np
import torch

from longswift.runtime.loading.gguf_quants import DEQUANTIZE

torch.set_num_threads(1)
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
    data[:, :4] = rng.normal(0, 0.05, size=(n, 2)).astype(np.float16).view(np.uint8)  # d (and m / dmin)
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
