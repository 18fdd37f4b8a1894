"""Timing on a device: medians of synchronised repetitions, and the memory read bandwidth that a
step's bandwidth floor is measured against (bench-steps and the scripts in docs/scripts use them)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch


def last_level_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    try:
        return max(0, int(os.sysconf("SC_LEVEL3_CACHE_SIZE")))
    except (ValueError, OSError, AttributeError):
        return 0


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def median_seconds(fn: Callable[[], object], reps: int, warmup: int, sync: Callable[[], None],
                   spreads: list[float] | None = None) -> float:
    """The median of `reps` timed calls after `warmup` untimed ones; `spreads` hears each call's slowest over its
    median (a busy machine's sign: a median alone hid repetitions 100 times slower)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    if spreads is not None and median > 0:
        spreads.append(max(times) / median)
    return median


def measure_bandwidth(device: torch.device, nbytes: int, reps: int = 10) -> float:
    """Read bandwidth in bytes/s: the best of `reps` sums over a float32 buffer larger than the
    last-level cache (the best, because a shared machine only ever makes a pass slower)."""
    sync = synchronizer(device)
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    buf.sum()
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        buf.sum()
        sync()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best
