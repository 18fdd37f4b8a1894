"""What the linear maps of one decoding step of the embedded model's shape cost on this CPU per weight format:
`python docs/scripts/cpu_weight_formats.py [ROWS [REPS]]` (default 1 row, 5 reps; one thread).

The 30 layers' products in their order (q/k/v 960x576, o 576x576, gate/up 3072x576, down 576x1536), each
weight its own tensor, so that they are read from memory as in a forward (425 MB in float32: no cache holds
them), through:
- float32 weights as they are (`F.linear`, what --no-pack-weights runs);
- float32 and bfloat16 weights packed for oneDNN (`mkldnn._linear_pointwise`, what the runner uses on CPU; bfloat16
  only where this CPU's oneDNN computes it);
- 4-bit weights with a scale and an offset per 32 inputs, the GGUF's Q4_1 layout (the embedded model's),
  through torch's CPU kernel for them (`aten._weight_int4pack_mm_for_cpu`, float32 activations): its
  products equal the dequantized float32 weights' to float rounding (checked below), so the model would be
  the same one, read at a fifth of the bytes (the scales and offsets included);
- 8-bit weights with one scale per output row, bfloat16 activations (`aten._weight_int8pack_mm`): not the
  same model (a Q4_1 weight's per-32 offsets do not fit one scale a row: the relative difference of its
  products is printed), for what a weight-only int8 path would cost.
Prints each format's best pass over REPS and the bytes it read per second."""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from longswift.runtime.linear import onednn_computes

GROUP = 32
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [out, in] of one layer's products
LAYERS = 30


def q4_1(out: int, inp: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1-like weights: 4-bit codes [out, in], scales and offsets [out, in / 32]; w = d * q + m."""
    q = torch.randint(0, 16, (out, inp), dtype=torch.int32, generator=gen)
    d = torch.rand(out, inp // GROUP, generator=gen) * 0.01
    m = -torch.rand(out, inp // GROUP, generator=gen) * 0.08
    return q, d, m


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    native_bf16 = onednn_computes(torch.bfloat16)
    plain, fp32, bf16, int4, int8, widths = [], [], [], [], [], []
    bytes_fp32 = bytes_int4 = bytes_int8 = 0
    for _ in range(LAYERS):
        for out, inp in SHAPES:
            q, d, m = q4_1(out, inp, gen)
            w = (q.view(out, -1, GROUP).float() * d[..., None] + m[..., None]).view(out, inp)  # dequantized
            plain.append(w)
            fp32.append(torch.ops.mkldnn._reorder_linear_weight(w))
            if native_bf16:  # (an AVX2-only CPU's oneDNN has no bfloat16 products: runtime.linear.onednn_computes)
                bf16.append(torch.ops.mkldnn._reorder_linear_weight(w.bfloat16()))
            # The kernel computes (q - 8) * scale + zero per group: zero = m + 8 d.
            sz = torch.stack([d.t(), (m + 8 * d).t()], dim=-1).contiguous()  # [in / 32, out, 2]
            int4.append((torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2), sz))
            scale = w.abs().amax(dim=1) / 127  # [out]
            int8.append((torch.round(w / scale[:, None]).to(torch.int8), scale.bfloat16()))
            widths.append(inp)
            bytes_fp32 += w.numel() * 4
            bytes_int4 += w.numel() // 2 + sz.numel() * 4
            bytes_int8 += w.numel() + scale.numel() * 2
            if len(int4) == 1:
                x = torch.randn(rows, inp, generator=gen)
                err = (torch.ops.aten._weight_int4pack_mm_for_cpu(x, int4[0][0], GROUP, sz) - x @ w.t()).abs().max()
                print(f"int4 kernel against the dequantized float32 product: max abs difference {float(err):.2e}")
                exact = x @ w.t()
                err8 = (torch.ops.aten._weight_int8pack_mm(x.bfloat16(), *int8[0]).float() - exact).norm() / exact.norm()
                print(f"int8 kernel against the dequantized float32 product: relative difference {float(err8):.2e}")
    xs = {inp: torch.randn(rows, inp, generator=gen) for inp in set(widths)}  # [rows, in] per input width
    xb = {inp: x.bfloat16() for inp, x in xs.items()}

    def onednn(weights: list[torch.Tensor], inputs: dict[int, torch.Tensor]):
        return lambda: [torch.ops.mkldnn._linear_pointwise(inputs[i], w, None, "none", [], "")
                        for w, i in zip(weights, widths)]

    def int4_pass():
        return [torch.ops.aten._weight_int4pack_mm_for_cpu(xs[i], p, GROUP, sz) for (p, sz), i in zip(int4, widths)]

    def int8_pass():
        return [torch.ops.aten._weight_int8pack_mm(xb[i], q, scale) for (q, scale), i in zip(int8, widths)]

    passes = {"float32 plain (F.linear, --no-pack-weights)": (lambda: [F.linear(xs[i], w) for w, i in zip(plain, widths)],
                                                              bytes_fp32),
              "float32 oneDNN": (onednn(fp32, xs), bytes_fp32),
              "bfloat16 oneDNN": (onednn(bf16, xb), bytes_fp32 // 2),
              "4-bit (Q4_1 layout) int4pack": (int4_pass, bytes_int4),
              "8-bit (a scale per row) int8pack": (int8_pass, bytes_int8)}
    if not native_bf16:
        del passes["bfloat16 oneDNN"]
    for name, (fn, nbytes) in passes.items():
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        print(f"{name}: {best * 1e3:.1f} ms for {LAYERS} layers' products of {rows} row(s), "
              f"{nbytes / 2**20:.0f} MiB of weights, {nbytes / best / 1e9:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
