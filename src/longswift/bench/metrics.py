"""Benchmark metrics: Distinct-n, the token timeline of a run (checkpoints along the generation),
speedup arithmetic, and the peak memory of a run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..runtime.memory import current_rss

CHECKPOINTS = 8  # the generation is sampled at every 1/8 of its length (the paper's speedup curve)


def distinct_n(ids: list[int], n: int) -> float:
    """Distinct-n (Li et al. 2016, the paper's diversity metric): unique n-grams / all n-grams of `ids`;
    0.0 when the sequence is shorter than n."""
    total = len(ids) - n + 1
    if total <= 0:
        return 0.0
    return len({tuple(ids[i : i + n]) for i in range(total)}) / total


def speedup(rate: float, baseline_rate: float) -> float:
    """How many times faster a method is than a baseline, from decode rates (tokens/s): the ratio of
    the baseline's time per token to the method's (= rate / baseline rate)."""
    if baseline_rate <= 0 or rate <= 0:
        raise ValueError("rates must be positive")
    return rate / baseline_rate


def checkpoint_targets(length: int, count: int = CHECKPOINTS) -> list[int]:
    """Token counts at which a run of `length` tokens is sampled: every 1/count of the length."""
    return sorted({max(1, round(length * k / count)) for k in range(1, count + 1)})


@dataclass
class Timeline:
    """Token arrivals of one run, timed from the call that started it (prefill included).
    `record` is called with the cumulative token count after each step; `extra` values (such as
    alpha so far) are kept for the checkpoints."""

    length: int
    start: float = field(default_factory=time.perf_counter)
    first: float | None = None
    first_tokens: int = 0  # tokens of the first arrival: 1, or a whole block (AR's --read-every, a peer's first step)
    end: float | None = None
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (tokens so far, seconds since start)
    checkpoint_alpha: list[float] = field(default_factory=list)
    progress: Callable[[int, float], None] | None = field(default=None, repr=False)  # (tokens, seconds) at checkpoints
    _targets: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._targets = checkpoint_targets(self.length)

    def record(self, tokens: int, when: float | None = None, alpha: float | None = None) -> bool:
        """Note that `tokens` tokens have arrived; True when this crossed a checkpoint."""
        now = time.perf_counter() if when is None else when
        if self.first is None:
            self.first, self.first_tokens = now, tokens
        self.end = now
        crossed = False
        while self._targets and tokens >= self._targets[0]:
            self._targets.pop(0)
            crossed = True
        if crossed:
            self.checkpoints.append((tokens, now - self.start))
            if alpha is not None:
                self.checkpoint_alpha.append(alpha)
            if self.progress is not None:
                self.progress(tokens, now - self.start)
        return crossed

    def decode_from(self, when: float) -> None:
        """Our methods: decoding starts where the loop's own prefill ended (`when`, on this timeline's clock),
        and every token after the prefill's first counts. Their first arrival can already hold decode work (AR
        forwards its first token before handing it over; a token block holds several steps), which the first
        arrival as the start left out: AR's rate was one forward fast (n-1 tokens in n-2 forwards), a block's
        tokens went uncounted. Peers, whose prefill is not known apart, keep their first arrival."""
        assert self.first is not None, "no token recorded"
        self.first, self.first_tokens = min(when, self.first), 1

    @property
    def prefill_seconds(self) -> float:
        assert self.first is not None, "no token recorded"
        return self.first - self.start

    @property
    def decode_seconds(self) -> float:
        assert self.first is not None and self.end is not None, "no token recorded"
        return self.end - self.first

    def decode_rate(self, tokens: int) -> float:
        """Decode tokens/s of a run of `tokens` tokens: those after the first arrival over decode_seconds.
        A first arrival of k tokens (a block) holds k-1 decode steps that decode_seconds does not, so
        its tokens are not counted; 0.0 where every token came at once (nothing to time)."""
        decode = self.decode_seconds
        return (tokens - self.first_tokens) / decode if decode > 0 else 0.0


def curve_speedup(base: list[tuple[int, float]], other: list[tuple[int, float]], base_prefill: float,
                  other_prefill: float) -> list[tuple[int, float]]:
    """Speedup over the generated length: at each checkpoint of `other`, the baseline's decode time
    to the same token count (linearly interpolated between its checkpoints) / `other`'s decode time.
    Both count decode time from the first token, which the prefill gives: the baseline's curve starts
    at 1 token, 0 s (from 0 tokens it made a baseline that drafts 5 tokens a step look 1.6x slower to
    its first steps' tokens than one token a second, the same rate)."""
    points = [(1, 0.0)] + [(n, t - base_prefill) for n, t in base]
    out = []
    for n, t in other:
        mine = t - other_prefill
        if mine <= 0 or n > points[-1][0]:
            continue
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n0 <= n <= n1:
                theirs = t0 + (t1 - t0) * (n - n0) / (n1 - n0) if n1 > n0 else t1
                if theirs > 0:  # else within the baseline's first block, which has no decode time of its own
                    out.append((n, theirs / mine))
                break
    return out


def time_to(checkpoints: list[tuple[int, float]], target: int, prefill: float) -> float | None:
    """A run's decode time until it held `target` tokens, a checkpoint target of its length (checkpoint_targets):
    the time of its first checkpoint at or past the target, which is when the step that crossed it ended, less
    the prefill. Exact, as an interpolation between checkpoints is not: a method that commits many tokens a step
    crosses a target within a step, and the line between its checkpoints put it there earlier (the report's
    table showed greedy TokenSwift 1.15x AR at a point where its recorded times gave 1.03x). None where no
    checkpoint reaches the target, or it came within the prefill's block (no decode time of its own)."""
    when = next((t for n, t in checkpoints if n >= target), None)
    return None if when is None or when - prefill <= 0 else when - prefill


class PeakMemory:
    """Peak memory during a block: on CUDA, torch's allocator peak; on the CPU, the process's resident
    set sampled every `interval` seconds by a thread (getrusage's high-water mark cannot be reset,
    so it would only ever show the largest run so far)."""

    def __init__(self, device: torch.device, interval: float = 0.05) -> None:
        self.device = device
        self.interval = interval
        self.peak_bytes = 0
        self.start_bytes = 0  # in use when the block began: the peak minus this is what the run itself added
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
        else:
            self.peak_bytes = self.start_bytes = current_rss()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_bytes = max(self.peak_bytes, current_rss())

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, current_rss())
