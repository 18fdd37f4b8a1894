"""Where a bench cell's TokenSwift output first differs from AR's, how far the draw there fell from the edge
between the two tokens: `python docs/scripts/draw_boundary.py OUT_DIR PRESET [METHOD]` (a `longswift bench`
results directory, a preset of it, default method tokenswift; the embedded model unless the directory's
config names another file).

Both methods draw new token i with the seed's i-th uniform u by inverse CDF (sampling.draw_rows). The script
recomputes AR's transformed distribution at that position with one forward over prompt + AR's tokens, in
float32 and in float64, and prints where u * total falls against the two tokens' CDF intervals: a float32
difference that lands within ~1e-6 of an edge is rounding (the verify pass's sums round otherwise than a
decode step's), and float64 says on which side the exact value lies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import longswift
from longswift import SamplingConfig
from longswift.bench.prompts import build_prompts, read_bench_prompt_file
from longswift.sampling import transform, uniforms


def main() -> None:
    out, preset = Path(sys.argv[1]), sys.argv[2]
    method = sys.argv[3] if len(sys.argv) > 3 else "tokenswift"
    identity = json.loads((out / "config.json").read_text())["identity"]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    ar = next(r for r in rows if r["preset"] == preset and r["method"] == "ar")
    other = next(r for r in rows if r["preset"] == preset and r["method"] == method)
    i = next((k for k, (x, y) in enumerate(zip(ar["token_ids"], other["token_ids"])) if x != y), None)
    if i is None:
        print(f"{preset}: {method}'s tokens are AR's")
        return
    recorded = SamplingConfig(**{k: tuple(v) if k == "banned_ids" else v for k, v in ar["sampling"].items()})
    if recorded.greedy:
        sys.exit(f"{preset} is greedy: no uniform decides its tokens")
    u = float(uniforms(torch.Generator().manual_seed(recorded.seed), i + 1)[i])
    tokens = ar["token_ids"][i], other["token_ids"][i]
    print(f"{preset}: new token {i}: ar drew {tokens[0]}, {method} {tokens[1]}; u = {u:.17g}")
    for dtype in ("float32", "float64"):
        engine = longswift.load(identity.get("model"), dtype=dtype)
        cfg = engine.ban_eos(recorded)  # bench runs ignore EOS, which bans it (not in the recorded settings)
        prompt_file = read_bench_prompt_file(Path(identity["prompt_file"]) if identity.get("prompt_file") else None)
        prompt = dict(build_prompts(engine, prompt_file, identity.get("chat", False), (ar["prefix"],),
                                    identity.get("seed", 0)))
        seq = list(prompt.get(ar["prefix"], next(iter(prompt.values()))).ids) + ar["token_ids"][:i]
        with torch.inference_mode():
            logits, _ = engine.model.forward(torch.tensor(seq), torch.arange(len(seq)), None,
                                             logits_rows=slice(-1, None))
            window = torch.tensor(seq[-cfg.penalty_window:] if cfg.penalty_window else [], dtype=torch.long)
            p = torch.softmax(transform(logits, window[None], cfg)[0].double(), dim=-1)  # [V]
        cdf = torch.cumsum(p, dim=-1)
        target = u * float(cdf[-1])
        for name, t in zip(("ar", method), tokens):
            lo, hi = float(cdf[t] - p[t]), float(cdf[t])
            side = "inside" if lo <= target < hi else "outside"
            print(f"  {dtype}: {name}'s token {t}: p {float(p[t]):.3g}, CDF interval [{lo:.12f}, {hi:.12f}); "
                  f"u * total {target:.12f} {side}, {min(abs(target - lo), abs(target - hi)):.2g} from its "
                  "nearest edge")


if __name__ == "__main__":
    main()
