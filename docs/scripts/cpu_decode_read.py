"""How far the CPU's float32 decode attention is from reading the cache: `python docs/scripts/cpu_decode_read.py
CONTEXT THREADS [LAYERS]` (3 KV heads of 64 with 3 query rows each, the embedded model's shape). LAYERS layers'
keys and values (default 8: ~0.8 GB at 64K, past the 32 MiB L3 cache, as a forward's 30 are) are swept in
turn, five times; prints the best per-layer ms of: the path a decode step takes today (runtime/attention.py:
the oneDNN path past 3K entries), two other orders of the scores' product (oneDNN with the query rows as its
input; F.linear with the keys as its input), each checked against it, and a plain read of the same keys and
values (their sums) as the floor."""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from longswift.runtime.attention import Attention, onednn_span
torch.set_num_threads(int(sys.argv[2]))
S = int(sys.argv[1]); L = int(sys.argv[3]) if len(sys.argv) > 3 else 8
Hkv, G, D = 3, 3, 64
cap = onednn_span(S) + 256
layers = [(torch.randn(Hkv, cap, D), torch.randn(Hkv, cap, D)) for _ in range(L)]
qg = torch.randn(Hkv, G, D)
att = Attention(torch.device("cpu"), torch.float32, D ** -0.5, packed=True)
m = att.masks(1, S - 1, G, None)
op = torch.ops.mkldnn._linear_pointwise
scale = D ** -0.5
def B(qg, keys, values, end):
    span = min(keys.shape[1], onednn_span(end))
    q = qg * scale
    outs = []
    for i in range(Hkv):
        s = op(q[i], keys[i, :span], None, "none", [], "")  # [G, S']
        s[:, end:] = float("-inf")
        p = torch.softmax(s, dim=-1)
        outs.append(op(p, values[i, :span].t(), None, "none", [], ""))
    return torch.stack(outs)
def Dv(qg, keys, values, end):
    span = min(keys.shape[1], onednn_span(end))
    q = qg * scale
    outs = []
    for i in range(Hkv):
        s = F.linear(keys[i, :span], q[i])  # [S', G]
        s[end:] = float("-inf")
        p = torch.softmax(s.t(), dim=-1)
        outs.append(op(p, values[i, :span].t(), None, "none", [], ""))
    return torch.stack(outs)
ref = att.attend(qg, *layers[0], m)
for f in (B, Dv):
    d = (f(qg, *layers[0], m.end) - ref).abs().max().item()
    assert d < 1e-5, (f.__name__, d)
def sweep(f):
    t = time.perf_counter()
    for k, v in layers:
        f(k, v)
    return (time.perf_counter() - t) / L * 1e3
fs = {"current": lambda k, v: att.attend(qg, k, v, m), "onednn-scores": lambda k, v: B(qg, k, v, m.end),
      "linear-scores": lambda k, v: Dv(qg, k, v, m.end), "read": lambda k, v: (k[:, :S].sum(), v[:, :S].sum())}
res = {n: [] for n in fs}
for rep in range(5):
    for n, f in fs.items():
        res[n].append(sweep(f))
print(S, torch.get_num_threads(), {n: round(min(v), 2) for n, v in res.items()})
