"""The host's share of a full TokenSwift step (draft pass + the heads' trie with n-gram paths +
verify + walk + commit), on a random 2-layer model whose forward costs little, every step forced
full, the GPU's default trie (--tree 1,3,3,3 with 20 n-gram continuations), greedy unless told.
Run from the repo root:

python docs/scripts/full_step_host.py ops|time [greedy|paper] [rounds]

`ops`: the aten ops of a step by stage, inside and outside the CUDA step bodies (run eagerly on
the CPU, as tests/test_cuda_graphs.py does): on a GPU the ops inside a body replay as one graph,
every op outside it runs eagerly (a launch, or host work on CPU tensors). `time`: the median
wall ms per full step over `rounds` runs of 300 new tokens through the CPU path (one thread).
To compare with an earlier commit, run it with PYTHONPATH pointing at that commit's src/."""
import collections
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

import longswift
import longswift.generate as generate_mod
import longswift.spec.tokenswift as ts
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.bench.grid import PRESETS
from longswift.spec.schedule import FULL, StepSchedule

args = sys.argv[1:] + ["ops", "greedy", "5"][len(sys.argv) - 1 :]
mode, preset, rounds = args[0], args[1], int(args[2])
sampling = PRESETS[preset]
if not sampling.greedy:
    sampling = SamplingConfig(**{**sampling.__dict__, "seed": 1})
StepSchedule.choose = lambda self: self._run(FULL)
torch.set_num_threads(1)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=8192)
engine = longswift.load(LlamaForCausalLM(cfg).eval(), device="cpu", dtype="float32", heads="random")
prompt = [(i * 7) % 500 for i in range(512)]  # repetitive: the n-gram table proposes paths
STAGES = ("draft", "build_tree", "verify", "accept", "commit")


class StageOps(TorchDispatchMode):
    """Counts aten ops by the TokenSwift stage that ran them, and whether inside a step body."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame, stage, body = sys._getframe(1), "other", False
        while frame is not None:
            body |= frame.f_code.co_name == "body" and frame.f_code.co_filename.endswith("cuda_graphs.py")
            if frame.f_code.co_name in STAGES and frame.f_code.co_filename.endswith("tokenswift.py"):
                stage = frame.f_code.co_name
                break
            frame = frame.f_back
        self.ops[f"{stage} ({'in' if body else 'outside'} the body)"] += 1
        return func(*args, **(kwargs or {}))


def stream(new: int, walk: str):
    spec = SpecConfig(tree="1,3,3,3", ngram_topk=20, walk=walk)
    s = engine.stream(prompt, sampling=sampling, spec=spec, method="tokenswift",
                      generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
    steps = iter(s)
    next(steps)  # the prefill and the first token
    return s, steps


if mode == "ops":
    generate_mod.step_bodies = ts.step_bodies = lambda model: True  # the CUDA path, run eagerly
    s, steps = stream(100, "batched")
    with StageOps() as count:
        for _ in steps:
            pass
    n = s.stats.steps - 1
    print(f"{preset}: {n} full steps, {(s.stats.new_tokens - 1) / n:.2f} tokens a step; aten ops a step:")
    for key in sorted(count.ops):
        print(f"  {key}: {count.ops[key] / n:.1f}")
    outside = sum(v for k, v in count.ops.items() if "outside" in k) / n
    print(f"  outside the bodies in all: {outside:.1f}")
else:
    times = []
    for _ in range(rounds):
        s, steps = stream(300, "rows")
        t0 = time.perf_counter()
        for _ in steps:
            pass
        times.append((time.perf_counter() - t0) / (s.stats.steps - 1) * 1000)
    print(f"{preset}: ms per full step {[round(t, 2) for t in times]}, median {statistics.median(times):.2f}")
