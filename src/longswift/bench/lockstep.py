"""Lockstep runs (`longswift bench --lockstep`): several of our generations of one cell advanced a
step at a time, the one furthest behind in tokens next, each timed on a clock of its own that runs
only while its step does.

Runs interleaved whole (bench's default) put minutes between the methods being compared, and this
machine's speed drifts by 5-15% over minutes (docs/benchmarks.md). In lockstep the methods pass
each token count at about the same time (taking turns step for step would not do it: a method
that commits several tokens a step, or AR's token blocks on CUDA, would finish first and leave the
other to run alone), so each meets the drift the others meet, and the ratio of their rates holds
where the rates themselves move. A step's own work is unchanged: each generation keeps its own
cache, generator and state; what the methods share is the model's weights, which a step reads whole
either way (they do not fit a last-level cache). The price is memory: every method's KV cache is
held at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import torch

from .metrics import Timeline
from .timing import synchronizer


def run_lockstep(steps: Mapping[str, Iterator[list[int]]], timelines: Mapping[str, Timeline], device: torch.device,
                 alpha: Mapping[str, Callable[[], float | None]]) -> dict[str, int]:
    """Run every generation in `steps` (method -> iterator of the token ids each step commits,
    prefill and first token included) to its end, one step at a time, next always the one with the
    fewest tokens so far (ties: the order of `steps`); record each arrival in the method's timeline
    at the method's own clock (started at 0: pass timelines made with start=0.0), with
    `alpha[method]()` for its checkpoints. A step's time includes waiting for the device to finish
    it. -> tokens each method produced."""
    sync = synchronizer(device)
    clocks = dict.fromkeys(steps, 0.0)
    counts = dict.fromkeys(steps, 0)
    live = dict(steps)
    while live:
        method = min(live, key=counts.__getitem__)  # min() keeps the first of equals: the order of `steps`
        t0 = time.perf_counter()
        ids = next(live[method], None)
        sync()
        clocks[method] += time.perf_counter() - t0
        if ids is None:
            del live[method]
            continue
        counts[method] += len(ids)
        timelines[method].record(counts[method], when=clocks[method], alpha=alpha[method]())
    return counts
