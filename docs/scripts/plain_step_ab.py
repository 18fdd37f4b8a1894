"""AR vs TokenSwift decode cost per token, interleaved in one process (the order reversed every
other round), timed from the first yielded token (prefill excluded) in process CPU time and wall
time; the paper's sampling (seed 1) unless told. Run from the repo root:

python docs/scripts/plain_step_ab.py plain|adaptive [preset] [new_tokens] [rounds] [embedded|tiny|shape]

`plain` forces every TokenSwift step to be a plain step (the root alone: what adaptive steps fall
back to when no draft pays), to compare its cost with an AR step; `adaptive` runs the real loop.
`embedded` (default): the shipped heads, a 2K-token prose prompt, CPU defaults. `tiny`: a random
2-layer model (hidden 64, the embedded model's vocabulary of 49,152) and random heads on a 512-token
prompt, whose forward costs little, so what shows is the host's cost per step (Python, sampling,
bookkeeping), the part that grows in weight on a GPU where the forward is a few milliseconds.
`shape`: random weights of the embedded model's shape on CUDA if there is one (bfloat16, graphs on
auto, tokens read back one at a time for both methods: --read-every 1), else on the CPU; for a GPU
machine, which has no model file (docs/scripts/gpu_session.sh plain)."""
import statistics
import sys
import time
from pathlib import Path

import torch

import longswift
from longswift import GenerationConfig, SamplingConfig
from longswift.bench.grid import PRESETS
from longswift.spec.schedule import PLAIN, StepSchedule

args = sys.argv[1:] + ["plain", "paper", "64", "4", "embedded"][len(sys.argv) - 1 :]
mode, preset, new, rounds, model = args[0], args[1], int(args[2]), int(args[3]), args[4]
if mode == "plain":
    StepSchedule.choose = lambda self: self._run(PLAIN)
if model == "tiny":
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)  # steadier timings of a forward this small
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192)
    e = longswift.load(LlamaForCausalLM(cfg).eval(), device="cpu", dtype="float32", heads="random")
    ids = list(range(100, 612))
elif model == "shape":
    from longswift import RuntimeConfig
    from longswift.bench.shapes import random_state, shape_config
    from longswift.engine import Engine
    from longswift.runtime.loading import LoadedModel

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = shape_config("smollm2-135m", None)
    runtime = RuntimeConfig(device=device.type, dtype=str(dtype).removeprefix("torch."), read_every=1)
    e = Engine(LoadedModel(cfg, random_state(cfg, dtype, device), None, "<random smollm2-135m>"),
               pack_weights=True, runtime=runtime)  # as a loaded file: packed on CPU, colocated on CUDA
    e.set_heads("random")
    ids = torch.randint(0, cfg.vocab_size, (2048,), generator=torch.Generator().manual_seed(0)).tolist()
else:
    e = longswift.load(heads="default")
    ids = e.encode(Path("docs/prompts/clockmaker.txt").read_text())[:2048]
sampling = PRESETS[preset]
if not sampling.greedy:
    sampling = SamplingConfig(**{**sampling.__dict__, "seed": 1})
gen = GenerationConfig(max_new_tokens=new, ignore_eos=model != "embedded")
cpu: dict[str, list[float]] = {"ar": [], "tokenswift": []}
wall: dict[str, list[float]] = {"ar": [], "tokenswift": []}
out: dict[str, list[int]] = {}
for r in range(rounds):
    for method in ("ar", "tokenswift")[:: -1 if r % 2 else 1]:
        stream = e.stream(ids, sampling=sampling, generation=gen, method=method)
        steps = iter(stream)
        next(steps)
        c0, w0 = time.process_time(), time.perf_counter()
        n = sum(len(x) for x in steps)
        cpu[method].append((time.process_time() - c0) / n * 1000)
        wall[method].append((time.perf_counter() - w0) / n * 1000)
        out[method] = stream.result.token_ids
        print(f"{method}: {cpu[method][-1]:.3f} cpu ms/token, {wall[method][-1]:.3f} wall ms/token, plain steps "
              f"{stream.stats.plain_steps}, lookup steps {stream.stats.lookup_steps}", flush=True)
for name, d in (("cpu", cpu), ("wall", wall)):
    print(f"{name} ms/token medians:", {m: round(statistics.median(v), 3) for m, v in d.items()},
          "TokenSwift - AR per round:", [round(t - a, 3) for t, a in zip(d["tokenswift"], d["ar"])],
          "TokenSwift/AR speed per round:", [round(a / t, 3) for t, a in zip(d["tokenswift"], d["ar"])])
print("same tokens:", out["ar"] == out["tokenswift"])
