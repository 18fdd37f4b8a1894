"""`longswift bench`: our AR and TokenSwift against transformers and llama.cpp on the same model,
prompt and sampling settings, over a grid of prefix lengths x generation lengths x sampling
presets; methods interleaved run by run so machine noise hits all alike. Results go to a
resumable directory (bench/store.py) and a markdown report (bench/report.py)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..checkpoint import heads_fingerprint
from ..config import (GenerationConfig, RuntimeConfig, SamplingConfig, SpecConfig, dtype_name, flag_name,
                      seed_problem)
from ..engine import Engine, load
from ..stream import GenerationStream
from ..errors import LongswiftError
from ..runtime.cuda_graphs import resolve_attention, use_graphs
from ..runtime.linear import half_precision_note
from ..runtime.loading import model_files, resolve_path
from ..runtime.memory import MemoryPlan, rope_extension
from ..runtime.model import fused_kernels
from ..runtime.probe import model_probe
from ..spec.budget import unpruned_budget
from ..spec.heads import named_heads_file
from .lockstep import run_lockstep
from .machine import processor_name
from .metrics import PeakMemory, Timeline, distinct_n
from .peers import PEERS, HFRunner, LlamaCppRunner, missing, sampler_note
from .prompts import Prompt, PromptFile, build_prompts, read_bench_prompt_file
from .report import RunContext, write_outputs
from .store import OUTPUT_FILES, MemoryStore, ResultStore, absolute

OURS = ("ar", "tokenswift", "tokenswift-fused")
KNOWN_METHODS = (*OURS, *PEERS)
DEFAULT_METHODS = ("ar", "tokenswift", "hf", "hf-pld", "llamacpp", "llamacpp-pld")
# Sampling presets. greedy: no penalty (comparable with transformers token for token). The others
# are the paper's per-model settings (Table 10), all over a 1024-token penalty window and seeded.
PRESETS = {
    "greedy": SamplingConfig(temperature=0.0, min_p=0.0, repetition_penalty=1.0),
    "paper": SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=1024),  # LLaMA3.1-8B
    "paper-nopenalty": SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.0),  # the Distinct-n ablation
    "top-p": SamplingConfig(temperature=1.0, top_p=0.9, min_p=0.0, repetition_penalty=1.15),  # Qwen2.5-1.5B, YaRN
    "min-p": SamplingConfig(temperature=1.0, min_p=0.05, repetition_penalty=1.15),  # Qwen2.5-7B
    "eta": SamplingConfig(temperature=1.0, min_p=0.0, eta=0.001, repetition_penalty=1.2),  # eta-sampling, our choice of eta
}
DEFAULT_LENGTHS = (2048, 4096, 8192)

MAX_RUNS = 10_000  # runs per cell
MAX_PLD_TOKENS = 1024  # tokens a prompt-lookup step proposes (hf-pld, llamacpp-pld)


@dataclass
class BenchConfig:
    """One benchmark grid: every prefix x preset x length cell runs every method `runs` times."""

    methods: tuple[str, ...] | None = None  # None: DEFAULT_METHODS, skipping those that cannot run here
    prefixes: tuple[int, ...] = (2048,)
    # None: those of DEFAULT_LENGTHS that fit the model's context after the prompt
    lengths: tuple[int, ...] | None = None
    presets: tuple[str, ...] = ("greedy",)
    runs: int = 1
    prompt_file: Path | None = None
    seed: int = 0
    chat: bool = False
    spec: SpecConfig | None = None
    pld_tokens: int = 10  # tokens proposed per prompt-lookup step (hf-pld, llamacpp-pld)
    warmup: bool = True
    lockstep: bool = False  # our methods' runs of a cell and run index run together, a step at a time (bench.lockstep)
    # The flags that set lengths, as given: refusals name them (--new-tokens and --prompt-tokens are aliases)
    length_flag: str = "--lengths"
    prefix_flag: str = "--prefix"

    def __post_init__(self) -> None:
        if (problem := seed_problem(self.seed)) is not None:
            raise LongswiftError(problem)
        if self.methods is not None:
            unknown = [m for m in self.methods if m not in KNOWN_METHODS]
            if not self.methods:
                raise LongswiftError(f"--methods is empty: choose from {', '.join(KNOWN_METHODS)}")
            if unknown:
                raise LongswiftError(f"unknown bench method(s) {unknown}: choose from {', '.join(KNOWN_METHODS)}")
            if len(set(self.methods)) != len(self.methods):
                raise LongswiftError("--methods lists a method twice")
        given = (("--prefix", self.prefixes), ("--lengths", self.lengths or ()), ("--presets", self.presets))
        for flag, values in given:
            twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if twice is not None:  # a repeated value would run its cells twice, reported as extra runs
                raise LongswiftError(f"{flag} lists {twice} twice: give each value once")
        bad = [p for p in self.presets if p not in PRESETS]
        if not self.presets:
            raise LongswiftError(f"--presets is empty: choose from {', '.join(PRESETS)}")
        if bad:
            raise LongswiftError(f"unknown sampling preset(s) {bad}: choose from {', '.join(PRESETS)}")
        if not self.prefixes or min(self.prefixes) <= 0:
            raise LongswiftError("--prefix lengths must be positive")
        if self.lengths is not None and (not self.lengths or min(self.lengths) < 2):
            raise LongswiftError("--lengths (--new-tokens) must be at least 2 tokens each")
        if self.runs <= 0 or self.pld_tokens <= 0:
            raise LongswiftError("--runs and --pld-tokens must be positive")
        if self.runs > MAX_RUNS:  # (a run count of 10**20 hung while the plan was built)
            raise LongswiftError(f"--runs {self.runs} is more than a grid runs ({MAX_RUNS:,} at most)")
        if self.pld_tokens > MAX_PLD_TOKENS:  # (transformers raised an OverflowError traceback on 10**20)
            raise LongswiftError(f"--pld-tokens {self.pld_tokens} is more than a lookup step proposes "
                                 f"({MAX_PLD_TOKENS:,} at most; the peers' default is 10)")

    def sampling(self, preset: str) -> SamplingConfig:
        s = PRESETS[preset]
        return s if s.greedy else dataclasses.replace(s, seed=self.seed)


@dataclass(frozen=True)
class Cell:
    prompt: Prompt
    prefix: int | None
    preset: str
    length: int

    def describe(self) -> dict[str, Any]:
        # the prompt's ids, digested: a prompt of one name and length tokenized otherwise (another tokenizer,
        # chat template or file) is another cell (report.cell_id)
        return {"prompt": self.prompt.name, "prompt_tokens": len(self.prompt.ids), "prefix": self.prefix,
                "preset": self.preset, "length": self.length, "prompt_digest": _key(self.prompt.ids)[:12]}


def spec_label(spec: SpecConfig, method: str, default_walk: str = "rows") -> str:
    """The TokenSwift options of a run (part of its key, so ablations are separate runs). Options at
    their defaults (the walk: the device's, `default_walk`) are left out, which keeps the labels,
    hence the keys, of earlier results."""
    mode = "fused" if method == "tokenswift-fused" else spec.draft_mode
    extra = "".join(f", {text}" for text, default in (
        (f"{spec.draft_cache} draft cache", spec.draft_cache == "dynamic"),
        (f"draft window {spec.draft_window}", spec.draft_window == SpecConfig.draft_window),
        (f"{spec.attention_sinks} sinks", spec.attention_sinks == SpecConfig.attention_sinks),
        (f"{spec.walk} walk", spec.walk == default_walk),
        (f"at most {spec.max_nodes} nodes", not spec.max_nodes or spec.max_nodes >= unpruned_budget(spec)),
        ("no suffix lookup", spec.suffix_lookup),
        (f"lookup steps of at most {spec.lookup_nodes} nodes", spec.lookup_nodes == SpecConfig.lookup_nodes
         or not spec.suffix_lookup),
    ) if not default)
    return (f"tree {spec.tree}, n-gram top-k {spec.ngram_topk}, draft KV {spec.draft_kv_budget}{extra}, {mode} draft, "
            f"adaptive {'on' if spec.adaptive else 'off'}")


# SamplingConfig's fields when run keys were first made. A run's key holds every field; a run recorded before a
# field was added (banned_ids, which changed every key: a resume re-ran every run and the report counted each
# twice) is found by its key without the added fields that are at their defaults.
KEYED_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "eta", "repetition_penalty", "penalty_window", "seed")


def sampling_key(sampling: SamplingConfig) -> dict[str, Any]:
    """The sampling settings an earlier run's key holds (KEYED_SAMPLING, and any other field away from its
    default)."""
    defaults = SamplingConfig()
    return {k: v for k, v in asdict(sampling).items() if k in KEYED_SAMPLING or v != getattr(defaults, k)}


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


class Methods:
    """Builds each method's runner once, lazily, and says which cannot run and why."""

    def __init__(self, engine: Engine, model: str | None, cfg: BenchConfig, n_ctx: int) -> None:
        self.engine, self.cfg, self.n_ctx = engine, cfg, n_ctx
        self.gguf = resolve_path(model) if model is None or isinstance(model, (str, Path)) else None
        self._runners: dict[str, Any] = {}
        self._twin: Any = None

    def skip_reason(self, method: str, sampling: SamplingConfig | None = None) -> str | None:
        if method.startswith("tokenswift") and self.engine.heads is None:
            return "no draft heads for this model: pass --heads FILE (or --heads random)"
        if method in PEERS:
            why = missing(method)
            if why:
                return why
            if method.startswith("llamacpp") and (self.gguf is None or not self.gguf.is_file()):  # (a GGUF of any name)
                return "llama.cpp needs a .gguf model file"
            if sampling is not None:
                return (LlamaCppRunner if method.startswith("llamacpp") else HFRunner).unsupported(sampling)
        return None

    def variant(self, method: str) -> str:
        if method.startswith("tokenswift"):
            assert self.cfg.spec is not None  # (run_grid resolves it for the device)
            return spec_label(self.cfg.spec, method, SpecConfig().for_device(self.engine.model.device).walk)
        if method.endswith("-pld"):
            return f"{self.cfg.pld_tokens} lookup tokens"
        return ""

    def prepare(self, method: str) -> None:
        """Load a peer's model (llama.cpp's own load of the GGUF, transformers' twin), so that one that cannot load
        stops the grid before its first run rather than after the runs of the methods before it."""
        if method in PEERS:
            self._runner(method)

    def run(self, method: str, prompt: list[int], n: int, sampling: SamplingConfig,
            progress: Callable[[int, float], None] | None) -> tuple[list[int], Timeline, Any]:
        """(generated ids, timeline, our GenerationStats or None) of one timed run."""
        if method in OURS:
            return self._ours(method, prompt, n, sampling, progress)
        runner = self._runner(method)
        out = runner.run(prompt, n, sampling, progress)
        return out.token_ids, out.timeline, None

    def _runner(self, method: str) -> Any:
        if method not in self._runners:
            pld = self.cfg.pld_tokens if method.endswith("-pld") else None
            if method.startswith("hf"):
                if self._twin is None:
                    from ..runtime.twin import hf_twin

                    self._twin = hf_twin(self.engine)
                self._runners[method] = HFRunner(self._twin, pld, tuple(sorted(self.engine.eos_ids)))
            else:
                import torch

                self._runners[method] = LlamaCppRunner(self.gguf, self.n_ctx, torch.get_num_threads(), self.cfg.seed,
                                                       pld, tuple(sorted(self.engine.eos_ids)))
        return self._runners[method]

    def run_lockstep(self, ours: list[str], prompt: list[int], n: int, sampling: SamplingConfig,
                     progress: Mapping[str, Callable[[int, float], None] | None]
                     ) -> dict[str, tuple[list[int], Timeline, Any]]:
        """Runs of several of our methods made together, a step at a time, the one furthest behind in
        tokens next (bench.lockstep), each timed on its own clock: method -> (generated ids, timeline,
        GenerationStats)."""
        streams = {m: self._stream(m, prompt, n, sampling) for m in ours}
        timelines = {m: Timeline(n, start=0.0, progress=progress[m]) for m in ours}
        alpha: dict[str, Callable[..., float | None]] = {  # (called bare; `...`: mypy infers no lambda with defaults)
            m: (lambda: None) if m == "ar" else (lambda s=streams[m].stats: s.alpha) for m in ours}
        run_lockstep({m: iter(s) for m, s in streams.items()}, timelines, self.engine.model.device, alpha)
        for m, s in streams.items():  # each clock started with its first step, which prefilled first
            timelines[m].decode_from(s.stats.prefill_seconds)
        return {m: (list(s.token_ids), timelines[m], s.stats) for m, s in streams.items()}

    def _stream(self, method: str, prompt: list[int], n: int, sampling: SamplingConfig) -> GenerationStream:
        assert self.cfg.spec is not None  # (run_grid resolves it for the device)
        return self.engine.stream(prompt, sampling=sampling, generation=GenerationConfig(max_new_tokens=n, ignore_eos=True),
                                  method="ar" if method == "ar" else "tokenswift", spec=method_spec(method, self.cfg.spec))

    def _ours(self, method: str, prompt: list[int], n: int, sampling: SamplingConfig,
              progress: Callable[[int, float], None] | None) -> tuple[list[int], Timeline, Any]:
        stream = self._stream(method, prompt, n, sampling)  # its caches made before the clock starts, as in lockstep
        timeline = Timeline(n, progress=progress)
        stats, count = stream.stats, 0
        for ids in stream:
            count += len(ids)
            timeline.record(count, alpha=stats.alpha if method != "ar" else None)
        timeline.decode_from(timeline.start + stats.prefill_seconds)  # (the loop starts on the clock's start)
        return list(stream.token_ids), timeline, stats


def method_spec(method: str, spec: SpecConfig) -> SpecConfig | None:
    """The TokenSwift options a bench method runs with: none for ar, the fused draft mode for tokenswift-fused."""
    if method == "ar":
        return None
    return dataclasses.replace(spec, draft_mode="fused") if method == "tokenswift-fused" else spec


def suite_identity(engine: Engine, cfg: BenchConfig, heads: Any, prompt_digest: str | None) -> dict[str, Any]:
    """What makes results comparable: a results directory holds runs of one identity only (the grid
    axes, the methods and the TokenSwift options may grow between reruns; they are in each run's key)."""
    import torch

    device = engine.model.device
    block = engine.runtime.token_block(device)
    attention = resolve_attention(engine.runtime.graph_attention, device)  # auto: length on CUDA where torch can
    return {"model": absolute(str(engine.source)), "dtype": dtype_name(engine.model.dtype),
            "device": str(engine.model.device), "packed_linears": bool(engine.model.packed),
            # the GPU or CPU model: runs of another one are not comparable (an H100's directory resumed on an H200)
            "processor": processor_name(device),
            # only where true, so that the identities of result directories made before it still match
            **({"colocated_linears": True} if engine.model.colocated else {}),
            **({"fused_kernels": True} if fused_kernels(engine.model) else {}),
            # 'auto' on a checkpoint without heads of its own takes what 'default' takes, and is recorded so:
            # result directories made when bench's --heads default was 'default' still resume
            "threads": torch.get_num_threads(),
            # a local heads path as set_heads recorded it (absolute: the same file given relative or absolute)
            "heads": "default" if heads == "auto" and not engine.has_checkpoint_heads else str(engine.heads_source),
            # heads from a path: their weights too, so heads retrained into the same file are not taken for
            # the old ones (only for paths, so directories of shipped or random heads made before still match)
            **({"heads_digest": heads_fingerprint(engine.heads)}
               if engine.heads is not None and heads not in (None, "auto", "default", "random") else {}),
            "prompt_file": None if cfg.prompt_file is None else absolute(str(cfg.prompt_file)),
            "prompt_digest": prompt_digest, "chat": cfg.chat, "seed": cfg.seed,
            # only when on, so result directories made before the option existed still match
            **({"float32_logits": True} if engine.model.float32_logits else {}),
            **({"triton_kernels": True} if engine.model.triton_kernels else {}),
            **({"graph_attention": attention} if attention != "bucketed" else {}),  # as resolved on this device
            # settings that change the tokens (rope scaling) or the speed, each only where not the default
            **({"rope_scaling": engine.runtime.rope_scaling} if engine.runtime.rope_scaling else {}),
            **({"read_every": block} if block != RuntimeConfig().token_block(device) else {}),
            **({"lockstep": True} if cfg.lockstep else {}),  # how runs were timed: one way per directory
            **({"warmup": False} if not cfg.warmup else {}),  # (a first run without a warm-up pays one-off costs)
            **({"cuda_graphs": False} if device.type == "cuda" and not use_graphs(engine.runtime.cuda_graphs,
                                                                                   engine.model) else {})}


def shrink_advice(cfg: BenchConfig, cell: Cell) -> str:
    """How to make the grid's longest cell shorter, in the flags given: a prompt sent whole (a chat message, a
    .jsonl file's instruction: prefix None) has no prefix length to lower."""
    return f"lower {cfg.length_flag} or " + ("shorten the prompts" if cell.prefix is None else cfg.prefix_flag)


def check_grid_context(engine: Engine, prompt_tokens: int, length: int, advice: str) -> None:
    """Refuse a grid whose longest cell exceeds the model's context; suggest a rope scaling only where
    one can help (none is in use yet, and a factor that reaches that far exists)."""
    total, limit = prompt_tokens + length, engine.cfg.context_limit
    window = engine.cfg.sliding_window
    if window is not None and total > window:  # (refused by the first run's cache otherwise, mid-grid)
        raise LongswiftError(f"the grid's longest cell (prefix {prompt_tokens} + {length} new = {total} tokens) "
                             f"exceeds this model's sliding window of {window}, which longswift does not implement: "
                             f"{advice}")
    if total <= limit:
        return
    setting = rope_extension(engine.cfg, total, engine.runtime.rope_scaling)
    extend = f", or extend the context with --rope-scaling {setting}" if setting is not None else ""
    raise LongswiftError(f"the grid's longest cell (prefix {prompt_tokens} + {length} new = {total} tokens) exceeds "
                         f"this model's context of {limit}: {advice}{extend}")


def lockstep_bytes(plans: list[MemoryPlan], graph_pools: bool) -> int:
    """What methods run in lockstep hold at once: every one's KV caches, and the largest of their step
    transients, which each step frees before the next method's; with CUDA graphs (`graph_pools`) every
    generation's private pool keeps its graphs' transients for the whole run, so those add up too."""
    work = [p.workspace for p in plans]
    return sum(p.kv_cache + p.draft_cache for p in plans) + (sum(work) if graph_pools else max(work))


def check_grid_memory(engine: Engine, cfg: BenchConfig, cell: Cell, ours: list[str]) -> None:
    """Refuse, before any run, a grid whose longest cell does not fit the free memory: each of `ours` alone (the
    run's own check came after the grid's smaller cells, and named generate's flags), and with --lockstep, which
    holds their KV caches at once (lockstep_bytes), all of them together."""
    from ..runtime.memory import available_bytes, size_text
    from ..spec.budget import run_plan

    if not ours or (free := available_bytes(engine.model.device)) is None:
        return
    model, tokens = engine.model, len(cell.prompt.ids) + cell.length
    spec = (cfg.spec or SpecConfig()).for_device(model.device)
    chunk = min(GenerationConfig().prefill_chunk, len(cell.prompt.ids))  # (as runs plan it: no longer than the prompt)
    plans = [run_plan(engine.cfg, model.dtype, model.device, tokens, chunk, model.packed, model.float32_logits,
                      method_spec(m, spec)) for m in ours]
    for m, plan in zip(ours, plans):
        need = plan.needed(weights_loaded=True)
        if need > free:
            raise LongswiftError(f"{m} needs {size_text(need)} more for the {tokens}-token cell "
                                 f"({plan.describe()}), but {size_text(free)} is free; {shrink_advice(cfg, cell)}, "
                                 "or use a smaller --dtype" + plan.drafting_advice(flag_name))
    if not cfg.lockstep or len(ours) < 2:
        return
    need = lockstep_bytes(plans, model.device.type == "cuda" and use_graphs(engine.runtime.cuda_graphs, model))
    if need > free:
        raise LongswiftError(f"--lockstep holds the KV caches of {', '.join(ours)} at once: {size_text(need)} for "
                             f"the {tokens}-token cell, but {size_text(free)} is free; drop --lockstep, or "
                             f"{shrink_advice(cfg, cell)}")


def default_lengths(engine: Engine, prompt_tokens: int, log: Callable[[str], None]) -> tuple[int, ...]:
    """The default generation lengths that fit the model's context after the longest prompt (the first
    alone when none does: the context check then refuses it, saying what to change)."""
    limit = engine.cfg.context_limit
    fit = tuple(n for n in DEFAULT_LENGTHS if prompt_tokens + n <= limit) or DEFAULT_LENGTHS[:1]
    if len(fit) < len(DEFAULT_LENGTHS) and prompt_tokens + fit[0] <= limit:
        left = ", ".join(str(n) for n in DEFAULT_LENGTHS if n not in fit)
        log(f"default lengths: {left} left out (a {prompt_tokens}-token prompt leaves {limit - prompt_tokens} of the "
            f"model's {limit}-token context); give --lengths to choose")
    return fit


def run_bench(model: str | None, runtime: RuntimeConfig, cfg: BenchConfig, heads: str | None = None,
              out: Path | None = None, json_path: Path | None = None, out_dir: Path | None = None,
              fresh: bool = False, command: str | None = None,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              show_progress: bool = True) -> list[dict[str, Any]]:
    """Run the grid; return every run's record (those resumed from `out_dir` included). `show_progress`:
    log each run's tokens as it goes, not only its start. Stages: the outputs checked, the model loaded, the
    cells built, the methods that can run chosen, the memory checked, the runs planned, run batch by batch
    (each batch's records stored as it ends), the report written."""
    # read once, before loading (a missing file took 20 s to say so), and for the digest that names the results
    prompt_file = read_bench_prompt_file(cfg.prompt_file)
    out_dir = check_outputs(model, cfg, heads, out, json_path, out_dir)
    engine = load(model, runtime, heads=heads)
    cfg = dataclasses.replace(cfg, spec=(cfg.spec or SpecConfig()).for_device(engine.model.device))
    cfg, cells = grid_cells(engine, cfg, prompt_file, log)
    longest = max(cells, key=lambda c: len(c.prompt.ids) + c.length)
    methods = Methods(engine, model, cfg, max(len(c.prompt.ids) + c.length for c in cells) + 64)
    runnable, skipped = runnable_methods(methods, cfg, log)
    presets = list(dict.fromkeys(c.preset for c in cells))
    refused = {(m, p): methods.skip_reason(m, cfg.sampling(p)) for m in runnable for p in presets}  # (None: runs)
    if all(refused.values()):  # (it measured nothing, wrote an empty report and exited 0)
        raise LongswiftError("no method can run any preset of this grid: " + "; ".join(
            f"{m} ({p}): {why}" for (m, p), why in refused.items()) + ": choose other --methods or --presets")
    # before any run (and any file), not when the longest cell's cache (or its second cache, in lockstep) is allocated
    check_grid_memory(engine, cfg, longest, [m for m in runnable if m in OURS])
    identity = suite_identity(engine, cfg, heads, None if prompt_file is None else prompt_file.digest)
    store = (ResultStore(out_dir, identity, fresh, engine.fingerprint,
                         lambda p: log(f"removed '{p}', left by a run that was killed while writing it"),
                         (model_probe(engine.model), engine.model.dtype))
             if out_dir is not None else MemoryStore(identity))
    try:  # (a results directory is locked while this invocation writes it)
        if store.records:
            log(f"resuming: {len(store.records)} runs already in {out_dir}/results.jsonl")
        ctx = RunContext(identity=identity, command=command or "longswift bench (from the Python API)", skipped=skipped, notes={},
                         spec=cfg.spec, methods=tuple(runnable), cells=[c.describe() for c in cells],
                         resumed=len(store.records),
                         variants=tuple(methods.variant(m) for m in runnable if m.startswith("tokenswift")))
        # which rows were measured side by side (random: two invocations can share a second and a process)
        invocation = f"{time.strftime('%Y-%m-%dT%H:%M:%S')}-{secrets.token_hex(4)}"
        plan = plan_runs(cells, runnable, refused, cfg, methods, store, ctx)
        log(f"{len(plan)} runs to do over {len(cells)} cells ({', '.join(runnable) or 'no methods'})")
        note = half_precision_note(engine.model.dtype, engine.model.device)
        if note and plan:
            log(f"note: {note}")
        planned = list(dict.fromkeys(m for _, _, m, _ in plan))
        for m in planned:
            methods.prepare(m)
        if plan and cfg.warmup:
            warm_prompt = list(plan[0][0].prompt.ids[:64])
            for m in planned:  # allocator, packed kernels, first-call paths
                log(f"warm-up {m}")
                methods.run(m, warm_prompt, 4, cfg.sampling("greedy"), None)
        done = 0
        for batch in batches(plan, cfg.lockstep):
            made = run_batch(batch, methods, cfg, done, len(plan), show_progress, log)
            done += len(batch)
            for record in made:
                # (versions: a resumed directory's report names what measured each run)
                record["command"], record["invocation"], record["versions"] = ctx.command, invocation, ctx.versions
            store.extend(made)  # a batch's records in one write: a Ctrl-C keeps all of them or none
            write_outputs(store, ctx, out_dir, plots=False)
        records = store.records
        report = write_outputs(store, ctx, out_dir, plots=True)
        # The files first: a reader of stdout that stops (`| head`) ends the command at the print
        if out is not None:
            from ..atomic import append_atomic

            append_atomic(out, report + "\n")
        if json_path is not None:
            from ..atomic import write_atomic

            write_atomic(json_path, json.dumps({"config": identity, "runs": records}) + "\n")
        print(report)
        return records
    finally:
        store.close()


def check_outputs(model: str | None, cfg: BenchConfig, heads: str | None, out: Path | None, json_path: Path | None,
                  out_dir: Path | None) -> Path | None:
    """Refuse, before the model loads, outputs that cannot be written, that are one file, or that would replace an
    input (the model's files, the prompt file, the heads); returns --out-dir with its ~ expanded."""
    from ..atomic import check_appendable, check_dir_writable, check_distinct, check_json_output, check_writable

    if out_dir is not None:
        out_dir = Path(out_dir).expanduser()  # ('~/runs' made a folder named '~' where the output files expand it)
        check_dir_writable(out_dir, "--out-dir")
    for p in (out, json_path):
        # (a file in an --out-dir not made yet is checked with it: the grid makes it before any run)
        if p is not None and not (out_dir is not None and not out_dir.exists()
                                  and Path(p).expanduser().absolute().parent == Path(out_dir).expanduser().absolute()):
            check_writable(p)
    check_distinct([("--out", out), ("--json", json_path), ("--prompt-file", cfg.prompt_file),
                    *(((f"--out-dir's {name}", out_dir / name) for name in OUTPUT_FILES) if out_dir else ()),
                    *(("--model", f) for f in model_files(model)),  # (an --out-dir that is the model's: its config.json)
                    ("--heads", named_heads_file(heads))])
    if json_path is not None:  # nor over a file that is not JSON (a heads file named by mistake)
        check_json_output(Path(json_path).expanduser(), "--json")
    if out is not None:
        check_appendable(Path(out).expanduser(), "--out")
    return out_dir


def grid_cells(engine: Engine, cfg: BenchConfig, prompt_file: PromptFile | None,
               log: Callable[[str], None]) -> tuple[BenchConfig, list[Cell]]:
    """The grid's cells: each prompt (of each --prefix) x preset x length, and the config with its lengths chosen
    where none were given; refused where the longest cell exceeds the context, before any run."""
    if not cfg.chat and (prompt_file is None or prompt_file.instructions is None):  # --prefix tokens long
        check_grid_context(engine, max(cfg.prefixes), max(cfg.lengths or DEFAULT_LENGTHS[:1]),  # before making them
                           f"lower {cfg.length_flag} or {cfg.prefix_flag}")
    pairs = build_prompts(engine, prompt_file, cfg.chat, cfg.prefixes, cfg.seed)
    if cfg.lengths is None:
        cfg = dataclasses.replace(cfg, lengths=default_lengths(engine, max(len(p.ids) for _, p in pairs), log))
    assert cfg.lengths is not None
    cells = [Cell(prompt, prefix, preset, length) for prefix, prompt in pairs for preset in cfg.presets
             for length in sorted(cfg.lengths)]
    longest = max(cells, key=lambda c: len(c.prompt.ids) + c.length)
    # refused before any run, not mid-grid
    check_grid_context(engine, len(longest.prompt.ids), longest.length, shrink_advice(cfg, longest))
    return cfg, cells


def runnable_methods(methods: Methods, cfg: BenchConfig,
                     log: Callable[[str], None]) -> tuple[list[str], dict[str, str]]:
    """The methods asked for (or the default ones) that can run here, and why each other one cannot (logged); a
    TokenSwift method asked for by name without heads, or no method at all, is refused."""
    skipped: dict[str, str] = {}
    runnable = []
    for m in cfg.methods or DEFAULT_METHODS:
        why = methods.skip_reason(m)
        if why and cfg.methods is not None and m.startswith("tokenswift"):
            raise LongswiftError(f"{m} needs draft heads: pass --heads PATH (or --heads random)")
        if why:
            skipped[m] = why
            log(f"{m}: skipped ({why})")
        else:
            runnable.append(m)
    if not runnable:
        raise LongswiftError("none of the methods can run here: " + "; ".join(f"{m}: {why}" for m, why in skipped.items()))
    return runnable, skipped


def plan_runs(cells: list[Cell], runnable: list[str], refused: Mapping[tuple[str, str], str | None],
              cfg: BenchConfig, methods: Methods, store: MemoryStore,
              ctx: RunContext) -> list[tuple[Cell, int, str, str]]:
    """(cell, run, method, key) of every run still to do (not in `store`, as keyed now or before), interleaved: each
    run index visits every method. A method a preset refuses is noted in the report's skipped, a sampler that is
    not ours in its notes."""
    plan = []
    for cell in cells:
        sampling = cfg.sampling(cell.preset)
        for m in runnable:
            why = refused[(m, cell.preset)]
            if why:
                ctx.skipped[f"{m} ({cell.preset})"] = why
                continue
            note = sampler_note(m, sampling)
            if note:
                ctx.notes[f"{m}, {cell.preset}"] = note
        for r in range(cfg.runs):
            for m in runnable:
                if refused[(m, cell.preset)]:
                    continue
                key, earlier = (_key(cell.prompt.name, cell.prompt.ids, cell.length, settings, m,
                                     methods.variant(m), r)
                                for settings in (asdict(sampling), sampling_key(sampling)))
                if not (store.has(key) or store.has(earlier)):
                    plan.append((cell, r, m, key))
    return plan


def run_batch(batch: list[tuple[Cell, int, str, str]], methods: Methods, cfg: BenchConfig, done: int, total: int,
              show_progress: bool, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run one batch of the plan (one run, or in lockstep our methods' runs of a cell together) and return its
    records; its runs are logged as the next of the plan's `total`, after the `done` runs before them."""
    cell, r = batch[0][0], batch[0][1]
    sampling = cfg.sampling(cell.preset)
    wheres = {m: f"[{done + j}/{total}] {cell.prompt.name} {len(cell.prompt.ids)}+{cell.length} {cell.preset} "
                 f"run {r + 1} {m}" for j, (_, _, m, _) in enumerate(batch, 1)}
    together = len(batch) > 1
    for where in wheres.values():
        log(f"{where}: start{' (in lockstep)' if together else ''}")
    if cfg.lockstep and not together and batch[0][2] in OURS:  # said here and in its record, and so the report
        log(f"{next(iter(wheres.values()))}: runs alone (no other method of ours is left to run in this cell and "
            "run), so not in lockstep")

    def progress(tokens: int, seconds: float, where: str) -> None:
        log(f"{where}: {tokens}/{cell.length} tokens, {seconds:.1f} s{' of its own' if together else ''}")

    tell: dict[str, Callable[[int, float], None] | None] = {
        m: functools.partial(progress, where=where) if show_progress else None
        for m, where in wheres.items()}
    with PeakMemory(methods.engine.model.device) as mem:  # in lockstep: every method of the batch at once
        if not together:
            m = batch[0][2]
            results = {m: methods.run(m, list(cell.prompt.ids), cell.length, sampling, tell[m])}
        else:
            results = methods.run_lockstep(list(wheres), list(cell.prompt.ids), cell.length, sampling, tell)
    made = []
    for _, _, m, key in batch:
        ids, timeline, stats = results[m]
        record = make_record(key, cell, m, methods.variant(m), r, ids, timeline, stats, mem, sampling)
        if cfg.lockstep and m in OURS:  # the methods it ran in lockstep with (none: it ran alone)
            record["lockstep_with"] = [other for _, _, other, _ in batch if other != m]
        made.append(record)
    for (_, _, m, _), record in zip(batch, made):
        extra = (f", alpha {record['alpha']:.2f}" if record["alpha"] is not None
                 else ", nothing drafted: every step plain" if record["draft_positions"] == 0 else "")
        log(f"{wheres[m]}: prefill {record['prefill_seconds']:.2f} s, "
            f"{record['decode_tokens_per_second']:.2f} tok/s{extra}")
    return made


def batches(plan: list[tuple[Cell, int, str, str]], lockstep: bool) -> list[list[tuple[Cell, int, str, str]]]:
    """The plan's runs in the order they run: one at a time, or with `lockstep` all of our methods'
    runs of a cell and run index together, where the first of them stood in the plan (peers, which
    bench cannot step, run on their own, wherever --methods puts them)."""
    out: list[list[tuple[Cell, int, str, str]]] = []
    ours: dict[tuple[int, int], list[tuple[Cell, int, str, str]]] = {}  # (id(cell), run) -> its batch
    for entry in plan:
        cell, r, m, _ = entry
        if not (lockstep and m in OURS):
            out.append([entry])
        elif (id(cell), r) in ours:
            ours[(id(cell), r)].append(entry)
        else:
            ours[(id(cell), r)] = batch = [entry]
            out.append(batch)
    return out


def make_record(key: str, cell: Cell, method: str, variant: str, run: int, ids: list[int], timeline: Timeline,
                stats: Any, mem: PeakMemory, sampling: SamplingConfig) -> dict[str, Any]:
    """One run as a flat JSON-able dict (a line of results.jsonl)."""
    if len(ids) != cell.length:
        raise LongswiftError(f"{method} produced {len(ids)} tokens instead of {cell.length}: leave it out of --methods")
    spec = stats is not None and stats.method == "tokenswift"
    return {
        "key": key, **cell.describe(), "method": method, "variant": variant, "run": run,
        "sampling": asdict(sampling), "new_tokens": len(ids),
        "prefill_seconds": timeline.prefill_seconds, "decode_seconds": timeline.decode_seconds,
        "decode_tokens_per_second": timeline.decode_rate(len(ids)), "first_tokens": timeline.first_tokens,
        "checkpoints": timeline.checkpoints, "checkpoint_alpha": timeline.checkpoint_alpha if spec else None,
        # null where nothing was drafted (every step plain): undefined, not 0 (as generate's --json says)
        "alpha": stats.alpha if spec and stats.draft_positions else None,
        # alpha's parts: the deepest drafted position of each drafting step's trie, summed, can be below the
        # tree's depth times verify_steps (short n-gram paths, --max-nodes), which bench-steps' projection assumes
        "accepted_tokens": stats.accepted_tokens if spec else None,
        "draft_positions": stats.draft_positions if spec else None,
        "ngram_alpha": stats.ngram_accepted / stats.draft_positions if spec and stats.draft_positions else None,
        "tokens_per_step": stats.tokens_per_step if spec else None,
        "lookup_steps": stats.lookup_steps if spec else None,
        "narrow_steps": stats.narrow_steps if spec else None,
        "half_steps": stats.half_steps if spec else None,
        "plain_steps": stats.plain_steps if spec else None,
        "steps": stats.steps if spec else None,  # the first token's draw included
        "verify_steps": stats.verify_steps if spec else None,  # the steps that drafted (alpha's sample)
        "stage_seconds": dict(stats.stage_seconds) if spec else None,
        "graph_captures": stats.graph_captures if stats is not None else None,  # None: a peer
        "graph_capture_seconds": stats.graph_capture_seconds if stats is not None else None,
        **{f"distinct_{n}": distinct_n(ids, n) for n in (1, 2, 3, 4)},
        "peak_memory_bytes": mem.peak_bytes, "memory_at_start_bytes": mem.start_bytes, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "token_ids": ids,
    }
