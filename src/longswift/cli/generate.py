"""`longswift generate`: stream a generation to stdout or files, with checkpoints, resume, and a
clean stop on SIGINT/SIGTERM (finish the step, write everything, say how to resume)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ..config import GenerationConfig, RuntimeConfig, SamplingConfig, SpecConfig
from ..errors import LongswiftError
from .flags import add_config_flags, config_from_args

RESUME_FLAGS = ("--output", "--json", "--checkpoint", "--checkpoint-every", "--no-progress", "--threads", "--model",
                "--heads", "--debug")


def add_parser(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate text from a prompt (or continue a checkpointed generation)")
    gen.add_argument("--model", help="a .gguf file, an HF model directory or a Hugging Face model id org/name[@revision] "
                                     "(default: embedded SmolLM2-135M-Instruct)")
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    source.add_argument("--prompt-ids", help="the prompt as token ids, e.g. 1,5,9 (models without a tokenizer)")
    source.add_argument("--resume", type=Path, metavar="CHECKPOINT",
                        help="continue the generation saved in this checkpoint file, with its settings")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--method", choices=["ar", "tokenswift"], default=None,
                     help="decoding method (default: tokenswift when the model has heads, else ar)")
    gen.add_argument("--heads", default=None,
                     help="draft heads for TokenSwift: 'auto' (the default) = the model checkpoint's own heads "
                          "(released TokenSwift models), else those shipped for the model (the embedded model has "
                          "some), else none; 'default' = only shipped heads; a heads file, or a directory / hub id "
                          "holding heads.safetensors or a released checkpoint; 'none'; 'random' (testing)")
    gen.add_argument("--greedy", action="store_true", help=(
        "shorthand for --temperature 0: the argmax after the repetition penalty, which still applies "
        "(the paper's default); --greedy --repetition-penalty 1 is transformers' plain greedy"))
    gen.add_argument("--output", type=Path, help="write the text here (atomically) instead of stdout")
    gen.add_argument("--json", type=Path, help="write {token_ids, text, stats} to this file (atomically)")
    gen.add_argument("--checkpoint", type=Path,
                     help="save the generation's state here (atomically) every --checkpoint-every tokens and when "
                          "interrupted; continue it with --resume")
    gen.add_argument("--checkpoint-every", type=int, default=1024, metavar="N",
                     help="tokens between checkpoints (default: 1024)")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    for cls in (SamplingConfig, GenerationConfig, SpecConfig, RuntimeConfig):
        add_config_flags(gen, cls)


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to stop after the current step; a second
    one interrupts at once (KeyboardInterrupt). Handlers are restored on exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nlongswift: {signal.Signals(signum).name} received: finishing the current step and saving "
              "(send it again to stop at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._saved[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)


@dataclass
class Outputs:
    """Where this run writes: text file (or stdout), JSON result, checkpoint."""

    output: Path | None
    json: Path | None
    checkpoint: Path | None
    every: int

    def fallback_checkpoint(self) -> Path:
        """Where an interrupted run without --checkpoint saves its state."""
        base = self.output or self.json
        return base.with_name(base.name + ".checkpoint.json") if base else Path("longswift.checkpoint.json")


def cmd_generate(args: argparse.Namespace) -> int:
    from ..prompts import read_prompt_file

    if args.checkpoint_every <= 0:
        raise LongswiftError("--checkpoint-every must be a positive number of tokens")
    if args.resume is None and args.prompt is None and args.prompt_file is None and args.prompt_ids is None:
        raise LongswiftError("give a prompt: --prompt TEXT, --prompt-file FILE or --prompt-ids IDS "
                             "(or --resume CHECKPOINT)")
    if args.resume is not None:
        return _resume(args)
    if args.greedy:
        args.temperature = 0.0
    if args.prompt_ids is not None:
        if args.chat:
            raise LongswiftError("--chat wraps prompt text: use --prompt or --prompt-file with it")
        prompt: str | list[int] = parse_prompt_ids(args.prompt_ids)
    else:
        prompt = args.prompt if args.prompt is not None else read_prompt_file(args.prompt_file)
        if not prompt.strip():
            raise LongswiftError("the prompt is empty: give some prompt text")
    outputs = _outputs(args)
    runtime = config_from_args(RuntimeConfig, args)
    generation = config_from_args(GenerationConfig, args)
    _plan_before_loading(args.model, runtime, generation, 1 + generation.max_new_tokens)
    with StopRequest() as stop, Ranks(runtime) as ranks:
        engine = ranks.load(args.model, args.heads or "auto")
        stream = engine.stream(prompt, sampling=config_from_args(SamplingConfig, args), generation=generation,
                               chat=args.chat, method=args.method, spec=config_from_args(SpecConfig, args))
        return _run(engine, stream, outputs, stop, args.no_progress)


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise LongswiftError(f"--prompt-ids must be token ids separated by commas or spaces; got '{text}'") from None
    if not ids:
        raise LongswiftError("the prompt is empty: give at least one token id")
    return ids


class Ranks:
    """One process, or (under torchrun) this rank of a tensor-parallel group: every rank runs the
    model's shard and the same loop; rank 0 alone writes output, progress, JSON and checkpoints."""

    def __init__(self, runtime: RuntimeConfig) -> None:
        from ..runtime.parallel import env_rank, env_world_size

        self.parallel = env_world_size() > 1
        self.main = env_rank() == 0
        self.runtime = runtime

    def __enter__(self) -> Ranks:
        if self.parallel:
            from ..runtime.parallel import init_from_env

            self.runtime = init_from_env(self.runtime)
        return self

    def load(self, model: str | None, heads: str) -> Any:
        from ..engine import load

        return load(model, self.runtime, heads=heads, tensor_parallel=self.parallel)

    def __exit__(self, *exc: Any) -> None:
        if self.parallel:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _resume(args: argparse.Namespace) -> int:
    from ..checkpoint import read_checkpoint

    given = [a.split("=")[0] for a in args.argv if a.startswith("--")]  # the command line as typed
    extra = [a for a in given if a not in (*RESUME_FLAGS, "--resume")]
    if extra:
        raise LongswiftError(f"{extra[0]} cannot be used with --resume: the checkpoint's settings are used (only "
                             f"{', '.join(RESUME_FLAGS[:-1])} apply)")
    ckpt = read_checkpoint(args.resume)
    if args.output is None and args.json is None:
        saved = {k: Path(v) if v else None for k, v in ckpt.outputs.items()}
        args.output, args.json = saved.get("output"), saved.get("json")
    if args.checkpoint is None:
        args.checkpoint = args.resume
    outputs = _outputs(args)
    runtime = RuntimeConfig(**ckpt.runtime)
    if args.threads is not None:
        runtime.threads = args.threads
    model = args.model or (None if ckpt.model_source == "<embedded>" else ckpt.model_source)
    if model is not None and str(model).startswith("<"):
        raise LongswiftError(f"the checkpoint's model was a Python object ({model}): pass --model PATH")
    gen = GenerationConfig(**ckpt.generation)
    _plan_before_loading(model, runtime, gen, len(ckpt.prompt_ids) + gen.max_new_tokens)
    heads = args.heads or ckpt.heads_source or "none"
    with StopRequest() as stop, Ranks(runtime) as ranks:
        engine = ranks.load(model, heads)
        stream = engine.resume(ckpt)
        if ranks.main:
            print(f"longswift: resuming at {len(ckpt.token_ids)} of {ckpt.generation['max_new_tokens']} tokens "
                  f"(re-reading {len(ckpt.prompt_ids) + len(ckpt.token_ids)} tokens of context)", file=sys.stderr)
        return _run(engine, stream, outputs, stop, args.no_progress)


def _outputs(args: argparse.Namespace) -> Outputs:
    from ..atomic import check_writable

    for p in (args.output, args.json, args.checkpoint):
        if p is not None:
            check_writable(p)
    return Outputs(args.output, args.json, args.checkpoint, args.checkpoint_every)


def _plan_before_loading(model: str | None, runtime: RuntimeConfig, gen: GenerationConfig, tokens: int) -> None:
    """Refuse, before reading any weights, a run whose weights + KV cache for `tokens` cannot fit.
    A new run plans for a one-token prompt (the prompt is not tokenized yet): the exact plan, with
    the prompt and TokenSwift's buffers, is checked again before the cache is allocated."""
    from ..runtime.linear import packing_supported
    from ..runtime.loading import load_config
    from ..runtime.memory import check_context, plan_memory

    cfg = load_config(model, runtime.rope_scaling)
    check_context(cfg, tokens - gen.max_new_tokens, gen.max_new_tokens)
    dtype, device = runtime.torch_dtype(), runtime.torch_device()
    packed = runtime.pack_weights is not False and packing_supported(dtype, device)
    plan_memory(cfg, dtype, device, tokens, gen.prefill_chunk, packed).check(weights_loaded=False)


def _run(engine: Any, stream: Any, out: Outputs, stop: StopRequest, no_progress: bool) -> int:
    from tqdm import tqdm

    from ..atomic import AtomicFile, write_atomic
    from ..detok import IncrementalDecoder

    tp = engine.tp
    if tp is not None and tp.rank != 0:  # other ranks: same steps, same stop decisions, no output
        for _ in stream:
            if tp.broadcast_int(int(stop.signum is not None)):
                break
        return stop.exit_code if stop.signum is not None or stream.result is None else 0
    saved = {"output": str(out.output) if out.output else None, "json": str(out.json) if out.json else None}
    text_file = AtomicFile(out.output) if out.output else None
    try:
        decoder = IncrementalDecoder(engine.tokenizer) if engine.tokenizer is not None else None
        push = decoder.push if decoder else (lambda ids: "".join(f" {t}" for t in ids))  # no tokenizer: the ids
        earlier = push(list(stream.token_ids)) if stream.token_ids else ""
        if text_file:
            text_file.write(earlier)  # a resumed run's file holds the whole text
        sink = text_file.write if text_file else _stdout_write
        stats = stream.stats
        total = stream.max_new_tokens
        bar = tqdm(total=total, initial=len(stream.token_ids), unit="tok", file=sys.stderr, disable=no_progress,
                   dynamic_ncols=True, mininterval=0.5, leave=True)
        next_save = len(stream.token_ids) + out.every
        with bar:
            for ids in stream:
                sink(push(ids))
                bar.update(len(ids))
                if stats.method == "tokenswift" and stats.steps % 8 == 0:
                    bar.set_postfix(alpha=f"{stats.alpha:.2f}", tok_per_step=f"{stats.tokens_per_step:.2f}", refresh=False)
                if out.checkpoint and len(stream.token_ids) >= next_save:
                    stream.checkpoint(saved).save(out.checkpoint)
                    next_save = len(stream.token_ids) + out.every
                stopping = stop.signum is not None
                if tp is not None:  # every rank must stop after the same step
                    stopping = bool(tp.broadcast_int(int(stopping)))
                if stopping:
                    stop.signum = stop.signum or signal.SIGTERM
                    break
            if decoder:
                sink(decoder.flush())
        interrupted = stop.signum is not None and stream.result is None
        if text_file:
            text_file.commit()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if interrupted:
            path = out.checkpoint or out.fallback_checkpoint()
            stream.checkpoint(saved).save(path)
            result = stream.result_so_far(finish_reason="interrupted")
        else:
            if out.checkpoint:  # the final state: resuming it reproduces the finished outputs
                stream.checkpoint(saved).save(out.checkpoint)
            result = stream.result
        if out.json:
            write_atomic(out.json, json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    except BaseException:
        if text_file:
            text_file.discard()
        raise
    s = result.stats
    spec_info = f", alpha {s.alpha:.2f}, {s.tokens_per_step:.2f} tokens/step" if s.method == "tokenswift" else ""
    ranks = f" on {tp.world} processes" if tp is not None else ""
    print(f"{s.method}: {s.new_tokens} tokens in {s.decode_seconds:.2f} s ({s.tokens_per_second:.1f} tok/s{spec_info}){ranks}, "
          f"prefill {s.prompt_tokens} tokens in {s.prefill_seconds:.2f} s, stop: {s.finish_reason}", file=sys.stderr)
    if interrupted:
        print(f"longswift: interrupted at {len(stream.token_ids)} of {total} tokens; state saved to '{path}'. "
              f"Continue with: longswift generate --resume {path}", file=sys.stderr)
        return stop.exit_code
    return 0


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
