"""Peak private host memory (RssAnon) of each process of a tensor-parallel load (gloo, CPU) of a random
Llama-shaped model saved as an HF directory in several weights files (or of --model), against one process loading it.

    python docs/scripts/tp_load_rss.py [--layers 8] [--hidden 1024] [--shard-size 200MB] [--dtypes float32,bfloat16]
    python docs/scripts/tp_load_rss.py --model default --processes 3    # the embedded GGUF (9 heads: 3 processes)

Run from a checkout whose `longswift` is importable (PYTHONPATH=src); it prints one line per process. The model is
float32 (about 0.8 GB with the defaults), written once to a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def save_model(where: Path, layers: int, hidden: int, shard_size: str) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256, head_dim=64,
                      max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(where, max_shard_size=shard_size)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def anon_mb() -> float:
    """This process's resident anonymous memory (Linux's RssAnon): its own copies. The weights files' pages that
    safetensors maps count as RssFile: the page cache's, which the processes of one machine share."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


class PeakAnon:
    """The largest anon_mb() seen while the block runs, sampled every 5 ms by a thread."""

    def __enter__(self) -> PeakAnon:
        self.peak, self.stop = anon_mb(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.stop.wait(0.005):
            self.peak = max(self.peak, anon_mb())

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, anon_mb())


def _rank(rank: int, world: int, store: str, model: str | None, dtype: str) -> None:
    import longswift

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    before = anon_mb()
    with PeakAnon() as peak:
        engine = longswift.load(model, dtype=dtype, heads=None, tensor_parallel=True, pack_weights=False)
    shard = sum(t.numel() * t.element_size() for t in engine.model.state.values()) / 2**20
    print(f"{dtype}, rank {rank} of {world}: RssAnon {before:.0f} MB before the load, {peak.peak:.0f} MB at its "
          f"peak, {anon_mb():.0f} MB after it; its shard's tensors {shard:.0f} MB", flush=True)
    dist.destroy_process_group()


def _single(model: str | None, dtype: str) -> None:
    import longswift

    torch.set_num_threads(1)
    before = anon_mb()
    with PeakAnon() as peak:
        longswift.load(model, dtype=dtype, heads=None, pack_weights=False)
    print(f"{dtype}, one process: RssAnon {before:.0f} MB before the load, {peak.peak:.0f} MB at its peak, "
          f"{anon_mb():.0f} MB after it", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--shard-size", default="200MB")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="the runs' dtypes (the model is float32)")
    parser.add_argument("--model", help="a model to load instead ('default': the embedded one)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model: str | None = None if args.model == "default" else args.model
        if args.model is None:
            model = str(Path(tmp) / "model")
            size = save_model(Path(model), args.layers, args.hidden, args.shard_size)
            files = sorted(Path(model).glob("*.safetensors"))
            print(f"model: {size / 2**20:.0f} MB float32 in {len(files)} weights files "
                  f"(largest {max(f.stat().st_size for f in files) / 2**20:.0f} MB)", flush=True)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        for dtype in args.dtypes.split(","):
            ctx = mp.get_context("spawn")
            p = ctx.Process(target=_single, args=(model, dtype))
            p.start()
            p.join()
            mp.spawn(_rank, args=(args.processes, str(Path(tmp) / f"store-{dtype}"), model, dtype),
                     nprocs=args.processes, join=True)


if __name__ == "__main__":
    main()
