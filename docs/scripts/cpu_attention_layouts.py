"""One layer's decode/verify attention on the CPU, the scores computed two ways round, per dtype:
`python docs/scripts/cpu_attention_layouts.py` (one thread; 3 KV heads of 64, the embedded model's).
q @ keys^T (the explicit path's float32 order), (keys @ q^T)^T (what bfloat16 uses: runtime/attention.py,
`keys_first`), and the CPU's flash kernel, each followed by the softmax and the product with the values;
keys and values are views of a longer cache, as in a forward. Prints the best of 5 means, in us."""

from __future__ import annotations

import time

import torch


def bench(fn, reps: int = 300) -> float:
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e6


def main() -> None:
    torch.set_num_threads(1)
    hkv, d, scale = 3, 64, 0.125
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for span in (512, 2048, 4096, 8192):
            for rows in (3, 21):  # a decoding token's 3 query heads per KV head; a 7-node trie's 21
                keys = torch.randn(hkv, span + 256, d, dtype=dtype)[:, :span]  # [Hkv, S, D] views of a cache
                values = torch.randn(hkv, span + 256, d, dtype=dtype)[:, :span]
                q = torch.randn(hkv, rows, d, dtype=dtype)  # [Hkv, R, D]

                def attend(scores: torch.Tensor) -> torch.Tensor:
                    return torch.bmm(torch.softmax(scores.mul_(scale), -1, dtype=torch.float32).to(dtype), values)

                q_first = bench(lambda: attend(torch.bmm(q, keys.transpose(1, 2))))
                keys_first = bench(lambda: attend(torch.bmm(keys, q.transpose(1, 2)).transpose(1, 2)))
                flash = bench(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q[None], keys[None], values[None], 0.0, False, scale=scale)[0])
                print(f"{str(dtype).removeprefix('torch.'):8} {span:5} entries, {rows:2} rows: q @ keys^T "
                      f"{q_first:6.0f} us, (keys @ q^T)^T {keys_first:6.0f} us, flash {flash:6.0f} us", flush=True)


if __name__ == "__main__":
    main()
