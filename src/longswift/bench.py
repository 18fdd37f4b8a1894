"""`longswift bench`: our generation methods against transformers' `generate()` on the same
weights, dtype and prompt, greedy, interleaved run by run so machine noise hits all alike."""

from __future__ import annotations

import dataclasses
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .atomic import check_writable, write_atomic
from .config import GenerationConfig, RuntimeConfig, SamplingConfig, SpecConfig
from .engine import Engine, load
from .errors import LongswiftError
from .twin import hf_twin

KNOWN_METHODS = ("ar", "hf", "tokenswift", "tokenswift-fused")
# Sampling presets: greedy without penalty (comparable with transformers token for token), and the
# paper's LLaMA-3.1 setting (min-p 0.1, penalty 1.2 over 1024 tokens, seeded).
PRESETS = {
    "greedy": SamplingConfig(temperature=0.0, repetition_penalty=1.0),
    "paper": SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=1024, seed=0),
}


@dataclass
class BenchConfig:
    methods: tuple[str, ...] = ("ar", "hf")
    prompt_tokens: int = 2048
    new_tokens: int = 1024
    runs: int = 3
    prompt_file: Path | None = None
    seed: int = 0
    sampling: str = "greedy"
    chat: bool = False
    spec: SpecConfig | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in KNOWN_METHODS]
        if unknown or not self.methods:
            raise LongswiftError(f"unknown bench method(s) {unknown}: choose from {', '.join(KNOWN_METHODS)}")
        if self.sampling not in PRESETS:
            raise LongswiftError(f"unknown --sampling preset '{self.sampling}': choose from {', '.join(PRESETS)}")
        if self.sampling != "greedy" and "hf" in self.methods:
            raise LongswiftError("the hf method is compared greedy only: drop hf or use --sampling greedy")
        if self.prompt_tokens <= 0 or self.new_tokens < 2 or self.runs <= 0:
            raise LongswiftError("--prompt-tokens and --runs must be positive and --new-tokens at least 2")


@dataclass
class Measurement:
    """One timed run: time to the first new token, then the rate of the remaining ones."""

    method: str
    run: int
    prefill_seconds: float
    decode_seconds: float
    new_tokens: int
    token_ids: list[int]
    alpha: float = 0.0
    tokens_per_step: float = 1.0
    ngram_accepted: int = 0

    @property
    def decode_tokens_per_second(self) -> float:
        return (self.new_tokens - 1) / self.decode_seconds


def build_prompt(engine: Engine, cfg: BenchConfig) -> list[int]:
    """`prompt_tokens` ids: the prompt file's tokens (repeated if short), or seeded random ids.
    With `chat`, the file's text is the user message of the chat template (not repeated)."""
    if cfg.prompt_file is None:
        g = torch.Generator().manual_seed(cfg.seed)
        return torch.randint(0, engine.cfg.vocab_size, (cfg.prompt_tokens,), generator=g).tolist()
    from .cli import read_prompt_file

    if cfg.chat:
        return engine.encode(read_prompt_file(cfg.prompt_file), chat=True)
    ids = engine.encode(read_prompt_file(cfg.prompt_file))
    while len(ids) < cfg.prompt_tokens:
        ids = ids + ids
    return ids[: cfg.prompt_tokens]


def _timed(tokens: Iterator[list[int]], n: int) -> tuple[float, float, list[int]]:
    """Consume a token stream; return (seconds to the first token, seconds for the rest, ids)."""
    t0 = time.perf_counter()
    first = None
    ids: list[int] = []
    for step in tokens:
        ids.extend(step)
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    if len(ids) != n or first is None:
        raise RuntimeError(f"expected {n} tokens, got {len(ids)}")
    return first - t0, end - first, ids


def _ours(engine: Engine, prompt: list[int], n: int, method: str, cfg: BenchConfig,
          stats_out: list) -> Iterator[list[int]]:
    spec = cfg.spec or SpecConfig()
    if method == "tokenswift-fused":
        spec = dataclasses.replace(spec, draft_mode="fused")
    stream = engine.stream(prompt, sampling=PRESETS[cfg.sampling], generation=GenerationConfig(max_new_tokens=n, ignore_eos=True),
                           method="ar" if method == "ar" else "tokenswift", spec=spec)
    yield from stream
    stats_out.append(stream.stats)


class _Streamer:
    """transformers streamer that forwards each generated token into a queue we iterate."""

    def __init__(self) -> None:
        self.calls = 0
        self.events: list[tuple[float, list[int]]] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls > 1:  # the first call carries the prompt
            self.events.append((time.perf_counter(), value.reshape(-1).tolist()))

    def end(self) -> None:
        pass


def _hf(model: Any, prompt: list[int], n: int) -> tuple[float, float, list[int]]:
    streamer = _Streamer()
    ids = torch.tensor([prompt], device=model.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, streamer=streamer, pad_token_id=0, eos_token_id=None)
    end = time.perf_counter()
    tokens = out[0, len(prompt):].tolist()
    first = streamer.events[0][0]
    return first - t0, end - first, tokens


def memory_bandwidth(gib: float = 1.0) -> float:
    """Measured read bandwidth in bytes/s: the best of ten full sums over a buffer >> cache
    (the best, because a shared machine only ever makes a pass slower)."""
    buf = torch.ones(int(gib * 2**30 // 4), dtype=torch.float32)
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best


def run_bench(model: str | None, runtime: RuntimeConfig, cfg: BenchConfig, heads: str | None = None, out: Path | None = None,
              json_path: Path | None = None, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> list[Measurement]:
    for p in (out, json_path):
        if p is not None:
            check_writable(p)
    engine = load(model, runtime, heads=heads)
    cfg = dataclasses.replace(cfg, spec=(cfg.spec or SpecConfig()).for_device(engine.model.device))
    if engine.heads is None and any(m.startswith("tokenswift") for m in cfg.methods):
        raise LongswiftError("tokenswift methods need draft heads: pass --heads PATH (or --heads random)")
    prompt = build_prompt(engine, cfg)
    runners: dict[str, Callable[[int], tuple[float, float, list[int]]]] = {}
    last_stats: list = []
    for method in cfg.methods:
        if method == "hf":
            hf = hf_twin(engine)
            runners["hf"] = lambda n: _hf(hf, prompt, n)
        else:
            runners[method] = lambda n, m=method: _timed(_ours(engine, prompt, n, m, cfg, last_stats), n)
    bandwidth = memory_bandwidth()
    for name, run in runners.items():  # warm-up: allocator, packed kernels, first-call paths
        log(f"warm-up {name}")
        run(4)
    results: list[Measurement] = []
    for r in range(cfg.runs):
        for name, run in runners.items():
            last_stats.clear()
            prefill, decode, ids = run(cfg.new_tokens)
            m = Measurement(name, r, prefill, decode, cfg.new_tokens, ids)
            if last_stats:
                st = last_stats[0]
                m.alpha, m.tokens_per_step, m.ngram_accepted = st.alpha, st.tokens_per_step, st.ngram_accepted
            log(f"run {r + 1}/{cfg.runs} {name}: prefill {prefill:.2f} s, {m.decode_tokens_per_second:.2f} tok/s")
            results.append(m)
    bandwidth = max(bandwidth, memory_bandwidth())
    table = report(engine, cfg, len(prompt), results, bandwidth)
    print(table)
    if out is not None:
        previous = out.read_text() if out.exists() else ""
        write_atomic(out, previous + table + "\n")
    if json_path is not None:
        rows = [asdict(m) | {"decode_tokens_per_second": m.decode_tokens_per_second} for m in results]
        write_atomic(json_path, json.dumps({"config": asdict(cfg) | {"prompt_file": str(cfg.prompt_file)},
                                            "bandwidth_bytes_per_s": bandwidth, "runs": rows}) + "\n")
    return results


def report(engine: Engine, cfg: BenchConfig, prompt_len: int, results: list[Measurement], bandwidth: float) -> str:
    """A markdown section: command, machine, and per-method medians with ratios and the floor."""
    by: dict[str, list[Measurement]] = {}
    for m in results:
        by.setdefault(m.method, []).append(m)
    rate = {k: statistics.median(m.decode_tokens_per_second for m in v) for k, v in by.items()}
    prefill = {k: statistics.median(m.prefill_seconds for m in v) for k, v in by.items()}
    model = engine.model
    elem = torch.empty((), dtype=model.dtype).element_size()
    weight_bytes = sum(t.numel() for t in model.state.values()) * elem
    mid_context = prompt_len + cfg.new_tokens // 2
    kv_bytes = mid_context * engine.cfg.kv_bytes_per_token(model.dtype)
    floor_ms = (weight_bytes + kv_bytes) / bandwidth * 1e3
    same = []
    for name in by:
        if name != "ar" and "ar" in by:
            a, b = by["ar"][0].token_ids, by[name][0].token_ids
            diverge = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            same.append(f"{name} {'identical' if diverge is None else f'first differs at new token {diverge}'}")
    lines = [
        f"### {prompt_len}-token {'chat ' if cfg.chat else ''}prompt, "
        f"{cfg.new_tokens} new tokens, {cfg.sampling} sampling",
        "",
        f"`longswift bench {shlex.join(sys.argv[2:]) if sys.argv[1:2] == ['bench'] else ''}`".replace(" `", "`"),
        "",
        f"- model: {engine.source} ({engine.cfg.parameter_count():,} parameters), dtype {str(model.dtype).removeprefix('torch.')}, "
        f"device {model.device}, packed linears: {model.packed}",
        f"- machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"python {platform.python_version()}",
        f"- prompt: {'random token ids (seed %d)' % cfg.seed if cfg.prompt_file is None else cfg.prompt_file}; "
        f"{cfg.runs} interleaved runs per method, median shown",
        f"- bandwidth floor: {(weight_bytes + kv_bytes) / 1e6:.0f} MB read per token (weights + KV at "
        f"{mid_context} tokens) / measured read bandwidth {bandwidth / 1e9:.1f} GB/s = {floor_ms:.1f} ms/token",
    ]
    if same:
        lines.append(f"- outputs compared with ar (same seed): {'; '.join(same)}")
    if cfg.spec is not None and any(m.startswith("tokenswift") for m in by):
        sp = cfg.spec
        lines.append(f"- tokenswift: tree {sp.tree}, n-gram top-k {sp.ngram_topk}, draft KV budget {sp.draft_kv_budget}, "
                     f"adaptive steps {'on' if sp.adaptive else 'off'}")
    lines += ["", "| method | prefill s | decode tok/s | ms/token | vs ar | vs hf | alpha | tokens/step | floor / ms/token |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name in by:
        ms = 1e3 / rate[name]
        vs_hf = f"{rate[name] / rate['hf']:.2f}x" if "hf" in rate else "-"
        vs_ar = f"{rate[name] / rate['ar']:.2f}x" if "ar" in rate else "-"
        spec_cols = "- | -"
        if name.startswith("tokenswift"):
            alpha = statistics.median(m.alpha for m in by[name])
            tps = statistics.median(m.tokens_per_step for m in by[name])
            spec_cols = f"{alpha:.2f} | {tps:.2f}"
        lines.append(f"| {name} | {prefill[name]:.2f} | {rate[name]:.1f} | {ms:.1f} | {vs_ar} | {vs_hf} | {spec_cols} | "
                     f"{floor_ms / ms:.0%} |")
    return "\n".join(lines) + "\n"
