"""How far a load's memory peaks above what the loaded model settles at, and what the memory plan counts for it
(session 70).

    python docs/scripts/load_peak.py [MODEL] [DTYPE]        # MODEL: a .gguf or a model directory; default: the
                                                            # embedded model in float32

Samples the process's anonymous resident memory (RssAnon: what the weights take once they are copies; a safetensors
file's pages, which stay the file's, are not in it) every 0.2 ms while `longswift.load` runs, in this fresh process;
prints it before, after and at the peak, the peak over the settled size, and the plan's `loading` term for the same
model, dtype and packing (runtime.memory.loading_bytes). Run it with PYTHONPATH=<a worktree>/src to measure another
commit's loader."""

import sys
import threading
import time

import torch

import longswift
from longswift.runtime import loading, memory

MiB = 2**20


def anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


source = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
dtype = sys.argv[2] if len(sys.argv) > 2 else "float32"
peak, done = [0], threading.Event()


def sample() -> None:
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.0002)


before = anon()
threading.Thread(target=sample, daemon=True).start()
engine = longswift.load(source, dtype=dtype, heads=None)
done.set()
time.sleep(0.01)
after = anon()
planned = "none"  # (a commit before session 70 plans nothing for it)
if hasattr(loading, "weights_copied"):
    plan = memory.plan_memory(loading.load_config(source), getattr(torch, dtype), torch.device("cpu"), 1, 1,
                              engine.model.packed, copies=loading.weights_copied(source, getattr(torch, dtype)))
    planned = f"{plan.loading / MiB:.0f} MiB"
print(f"{source or 'embedded'} {dtype}: RssAnon before {before // MiB} MiB, after {after // MiB}, peak "
      f"{peak[0] // MiB}; peak over settled {(peak[0] - after) // MiB} MiB; planned beside the weights {planned}")
