"""`longswift train-heads` and `longswift eval-heads`."""

from __future__ import annotations

import argparse
import functools
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import RuntimeConfig, SamplingConfig, SpecConfig, flag_name
from ..errors import ADD_TOKENIZER_FILES, LongswiftError
from .flags import (DECODING_ONLY, HEADS_HELP, MODEL_HELP, add_config_flags, add_switch, check_heads_flag,
                    config_from_args, given_path, heads_value, model_inputs, output_file, progress_lines, seed_number,
                    show_progress, whole_number)
from .outputs import note_stale, os_error_with

if TYPE_CHECKING:
    import torch

    from ..train.config import TrainConfig
    from ..train.train import HeadTrainer


def add_parsers(sub: Any) -> None:
    from ..train.config import TrainConfig

    train = sub.add_parser("train-heads", help="train draft heads for a model (the base stays frozen)")
    train.add_argument("--model", help=MODEL_HELP)
    train.add_argument("--out", type=given_path, required=True, metavar="DIR",
                       help="directory for checkpoint.pt, heads.safetensors, train_log.json")
    _add_data_flags(train)
    train.add_argument("--resume", action="store_true", help="continue from --out's checkpoint.pt")
    add_switch(train, "--no-progress", "--progress", "no progress on stderr: no bars on a terminal, and no plain "
               "line as each phase starts and a checkpoint is saved where stderr is redirected (a log)")
    add_config_flags(train, TrainConfig)
    add_config_flags(train, RuntimeConfig, skip=DECODING_ONLY)

    ev = sub.add_parser("eval-heads", help="per-head accuracy on held-out text and TokenSwift alpha")
    ev.add_argument("--model", help=MODEL_HELP)
    ev.add_argument("--heads", type=heads_value, required=True,
                    help=f"the heads to measure: {HEADS_HELP}")
    _add_data_flags(ev)
    ev.add_argument("--seq-len", type=whole_number, default=512,  # train-heads' windows: a self-distilled document fills one
                    help="tokens per evaluation window (default %(default)s, as train-heads)")
    ev.add_argument("--seed", type=seed_number, default=1,
                    help="sampling seed of --self-distill data (default %(default)s; training uses its own --seed, 0 "
                         "by default)")
    ev.add_argument("--alpha-tokens", type=whole_number, default=1024,
                    help="tokens of held-out TokenSwift generation for alpha (paper sampling; 0 skips; default "
                         "%(default)s)")
    ev.add_argument("--json", type=output_file, help="write the results here (atomically)")
    add_switch(ev, "--no-progress", "--progress", "no progress on stderr: no bars on a terminal, and no plain "
               "line as each phase starts where stderr is redirected (a log)")
    # alpha measures the heads, so every step drafts: adaptive steps (generate's default) run nearly all
    # steps plain where the heads do not pay on this machine, and alpha would come from a handful of drafts.
    add_config_flags(ev, SpecConfig, {"adaptive": (False, (
        "run the alpha generation with adaptive steps, as `generate` does (plain steps where drafts do not pay, "
        "so alpha comes from the few steps that drafted); default: off, every step drafts"))})
    add_config_flags(ev, RuntimeConfig)


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", action="append", default=[], metavar="FILE_OR_DIR",
                   help="text (.txt/.md/.text), JSONL with a 'text' field (.jsonl/.ndjson/.json), or a directory of "
                        "them; repeatable")
    p.add_argument("--self-distill", type=whole_number, default=0, metavar="N",
                   help="first generate N tokens with the model itself (paper sampling, cached) and use them")
    p.add_argument("--distill-new-tokens", type=whole_number, default=512,
                   help="tokens generated per self-distill document (default %(default)s)")
    p.add_argument("--distill-batch", type=whole_number, default=32,
                   help="self-distill documents generated at once (default %(default)s)")


def _kept(checkpoint: Path, again: str) -> str:
    """What a stopped run's saved checkpoint holds and how to go on from it: the line a second signal and a full disk
    end with. Its step (`step N of M`) is read from the file; left out where it cannot be (the resume will say)."""
    import torch

    try:
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        step = f" (step {int(saved['step'])} of {int(saved['config']['steps'])})"
    except Exception:  # (a damaged file)
        step = ""
    return f"'{checkpoint}' holds the last saved step{step}: continue with: {again}"


def read_data(args: argparse.Namespace, purpose: str = "training") -> list[str]:
    """Check the data flags and read the --data texts, before the model loads (which takes minutes,
    and --self-distill many more): a missing file or a bad number costs no loading time. `purpose`: what the data
    is for, as the refusal of none names it ("training", "evaluation")."""
    from ..train.data import read_texts

    if not args.data and not args.self_distill:
        raise LongswiftError(f"no {purpose} data: pass --data FILE_OR_DIR and/or --self-distill N")
    if args.self_distill < 0:
        raise LongswiftError(f"--self-distill must be a number of tokens >= 0, got {args.self_distill}")
    for flag in ("distill_new_tokens", "distill_batch"):
        if getattr(args, flag) <= 0:
            raise LongswiftError(f"{flag_name(flag)} must be positive, got {getattr(args, flag)}")
    return read_texts(args.data) if args.data else []


def check_seq_len(args: argparse.Namespace, runtime: RuntimeConfig, seq_len: int) -> None:
    """Refuse windows longer than the model's context (from its config, before the weights load): the
    base's hidden states past it are not what generation ever feeds the heads."""
    from ..runtime.loading import load_config
    from ..train.train import check_window_length

    cfg = load_config(args.model, runtime.rope_scaling)
    limit = cfg.context_limit
    if seq_len > limit:
        raise LongswiftError(f"--seq-len {seq_len} exceeds this model's context of {limit} tokens: lower --seq-len "
                             "(or extend the context on purpose with --rope-scaling)")
    check_window_length(cfg, seq_len)


def prepare_windows(engine: Any, args: argparse.Namespace, texts: list[str], seq_len: int, seed: int,
                    check: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """Token windows [N, seq_len] from the --data `texts` and/or --self-distill, each window's first target index
    [N] (None where every token is a target: no self-distill), and a description of them. A self-distilled
    document's prompt is context, not a target; its windows of prompt alone are dropped (info's
    "prompt_only_windows"). `check`: called with the number of windows there will be before self-distill samples
    (minutes), where that is any (none: self_distill and cut_counted_windows say why)."""
    from ..train.data import counted_starts, cut_counted_windows, tokenize
    from ..train.distill import distill_prompts, distilled_prompt_lengths, self_distill

    if engine.tokenizer is None:  # --data is text and --self-distill writes from text prompts: both need one
        raise LongswiftError("this model has no tokenizer, and both --data (text) and --self-distill (text prompts) "
                             f"need one: {ADD_TOKENIZER_FILES}")
    documents: list[list[int]] = []
    prompt_lengths: list[int] = []  # (of each document: its tokens that are context but not targets)
    info: dict = {}
    if texts:
        documents += tokenize(engine.tokenizer, texts, engine.cfg.vocab_size)
        prompt_lengths += [0] * len(documents)
        info["data"] = [str(d) for d in args.data]
    if args.self_distill:
        prompts = distill_prompts(engine)
        distilled = distilled_prompt_lengths(prompts, args.self_distill, args.distill_new_tokens)
        lengths = [len(d) for d in documents] + [p + args.distill_new_tokens for p in distilled]
        prompt_lengths += distilled
        count = sum(len(counted_starts(n, p, seq_len)) for n, p in zip(lengths, prompt_lengths))  # (cut's count)
        if check is not None and count:
            check(count)
        t0 = time.perf_counter()
        if (log := progress_lines(args)) is not None:
            purpose = "text to evaluate on" if getattr(args, "command", None) == "eval-heads" else "training text"
            log(f"self-distill: the model writes {args.self_distill:,} tokens of {purpose}")
        docs = self_distill(engine, args.self_distill, args.distill_new_tokens, args.distill_batch,
                            SamplingConfig(seed=seed), progress=show_progress(args), prompts=prompts, window=seq_len)
        documents += docs
        info["self_distill"] = {"tokens": args.self_distill, "new_tokens_per_document": args.distill_new_tokens,
                                "documents": len(docs), "sampling": asdict(SamplingConfig(seed=seed)),
                                "seconds": round(time.perf_counter() - t0, 1)}
    windows, first = cut_counted_windows(documents, prompt_lengths, seq_len)
    info["windows"] = int(windows.shape[0])
    info["tokens"] = int(windows.numel())
    if args.self_distill:
        info["prompt_only_windows"] = sum(len(d) // seq_len for d in documents) - info["windows"]  # (dropped)
        if (log := progress_lines(args)) is not None:
            log(f"{info['windows']:,} windows of {seq_len} tokens; {info['prompt_only_windows']:,} more held only a "
                "self-distilled document's prompt and are dropped (a prompt is context, never a target)")
    return windows, first if args.self_distill else None, info


def _checked_train_inputs(args: argparse.Namespace, cfg: TrainConfig, runtime: RuntimeConfig,
                          distill: dict[str, Any]) -> tuple[Path, list[str]]:
    """What train-heads refuses before loading and distilling, which take minutes: an --out it cannot write or
    resume, data holding --out, outputs over its inputs, a window past the context. Returns --out and the texts."""
    from ..atomic import check_distinct
    from ..train.data import data_files
    from ..train.train import CHECKPOINT, HEADS_FILE, LOG_FILE, check_checkpoint, check_out_dir, run_settings

    out = check_out_dir(args.out, args.resume)
    if args.resume:
        # damaged, or other settings: said before loading (and sampling) too
        check_checkpoint(out / CHECKPOINT, cfg, mmap=True,
                         settings=run_settings(runtime.torch_dtype(), runtime.rope_scaling, distill))
    for d in args.data or []:  # its checkpoint, heads and log would be read as documents by the next run
        if Path(d).expanduser().is_dir() and out.resolve().is_relative_to(Path(d).expanduser().resolve()):
            raise LongswiftError(f"--out '{args.out}' is inside --data '{d}', whose documents the next run would read "
                                 "with this run's files among them: choose an --out outside it")
    texts = read_data(args)
    # What training writes into --out, never over the data or the model it reads (a --data file named
    # train_log.json in --out was replaced by the log).
    check_distinct([*(("--data", d) for d in (data_files(args.data) if args.data else [])),
                    *model_inputs(args.model),
                    *((f"--out's {name}", out / name) for name in (CHECKPOINT, HEADS_FILE, LOG_FILE))])
    check_seq_len(args, runtime, cfg.seq_len)
    return out, texts


def _report_trained(args: argparse.Namespace, cfg: TrainConfig, trainer: HeadTrainer, info: dict[str, Any], t0: float,
                    again: str, interrupted_code: int) -> int:
    """train-heads' closing lines (an interrupted run's, or the last step's loss and accuracy); its exit code."""
    from ..train.train import CHECKPOINT, HEADS_FILE, not_converged

    if trainer.interrupted:
        print(f"longswift: interrupted at step {trainer.step} of {cfg.steps}; checkpoint saved to "
              f"'{Path(args.out) / CHECKPOINT}'. Continue with: {again}", file=sys.stderr)
        return interrupted_code
    last = trainer.log[-1] if trainer.log else None
    acc = " / ".join(f"{a:.3f}" for a in last["head_acc"]) if last else "n/a"
    resumed = f" ({cfg.steps - trainer.resumed_at} in this run, resumed at step {trainer.resumed_at})" \
        if trainer.resumed_at else ""
    loss = last["loss"] if last else float("nan")
    steps = f"{cfg.steps} step{'s' if cfg.steps != 1 else ''}"
    read = f" (of {info['windows']})" if trainer.windows_read < info["windows"] else ""  # (the steps read no more)
    print(f"trained {cfg.gamma} heads on {trainer.windows_read}{read} windows x {cfg.seq_len} tokens for {steps}"
          f"{resumed} in {time.perf_counter() - t0:.0f} s; last step loss {loss:.3f}, top-1 accuracy per head {acc}",
          file=sys.stderr)
    print(f"heads: {Path(args.out) / HEADS_FILE} (use with --heads)", file=sys.stderr)
    if (warning := not_converged(trainer.log, cfg.lr)) is not None:
        print(f"longswift: warning: {warning}", file=sys.stderr)
    return 0


def cmd_train_heads(args: argparse.Namespace) -> int:
    from ..atomic import absent_dirs, remove_made
    from ..engine import load
    from ..train.train import CHECKPOINT, TrainConfig, check_batch, claimed_out_dir, train_heads
    from .stop import StopRequest, say

    cfg = config_from_args(TrainConfig, args)
    runtime = config_from_args(RuntimeConfig, args)
    distill = {"self_distill": args.self_distill}  # (the windows' other settings: a resume with others is refused)
    if args.self_distill:
        distill |= {"distill_new_tokens": args.distill_new_tokens, "distill_batch": args.distill_batch}
    out, texts = _checked_train_inputs(args, cfg, runtime, distill)
    made = absent_dirs(out)  # directories this run will make: gone again if it stops before saving anything
    # Ctrl-C / SIGTERM / SIGHUP while loading, sampling or computing hidden states: stop at once, nothing to
    # save; during the steps: finish the step, save the checkpoint, say how to resume.
    stop = StopRequest()
    argv = list(getattr(args, "argv", None) or ["train-heads", "--out", str(args.out)])
    again = shlex.join(["longswift", *argv, *([] if "--resume" in argv else ["--resume"])])
    try:
        try:
            # --out is held from here on, so that a second run into it is refused now, not after minutes of loading
            with stop, claimed_out_dir(out, args.resume, note_stale):
                with stop.at_once():
                    engine = load(args.model, runtime, heads=None)
                    t0 = time.perf_counter()  # (the time reported: windows, hidden states and steps)
                    # (check_batch: before sampling)
                    windows, first, info = prepare_windows(engine, args, texts, cfg.seq_len, cfg.seed,
                                                           check=functools.partial(check_batch, cfg))
                trainer = train_heads(engine, windows, cfg, out, resume=args.resume, progress=show_progress(args),
                                      extra_meta={"data": info}, stop=stop, claimed=True, log=progress_lines(args),
                                      data_settings=distill, first=first)
        except OSError as exc:  # a disk that fills, a directory made read-only: the last checkpoint saved still resumes
            if isinstance(exc, BrokenPipeError) or not (out / CHECKPOINT).exists():
                raise
            raise os_error_with(exc, _kept(out / CHECKPOINT, again)) from exc
        except KeyboardInterrupt as exc:  # a second signal, or one before the steps: the last checkpoint still resumes
            if type(exc) is not KeyboardInterrupt:
                raise
            if (out / CHECKPOINT).exists():
                kept = _kept(out / CHECKPOINT, again)
                if stop.signum is None:
                    raise KeyboardInterrupt(kept) from exc
                say(f"longswift: interrupted; {kept}")
                return stop.exit_code  # (the signal's: 143 for SIGTERM)
            if stop.signum is None:
                raise
            remove_made(made)
            say("longswift: stopped before a checkpoint was saved: nothing written")
            return stop.exit_code
    except BaseException:  # whatever stopped it (a model that cannot load, an allocation's RuntimeError, a
        # KeyboardInterrupt of no signal): before a checkpoint, nothing was saved and the --out it made goes (as
        # docs/heads.md says); after one, --out holds it, to resume from (remove_made removes only empty ones too)
        if not (out / CHECKPOINT).exists():
            remove_made(made)
        raise
    return _report_trained(args, cfg, trainer, info, t0, again, stop.exit_code)


def _check_not_training_documents(record: dict | None, args: argparse.Namespace) -> None:
    """Refuse an eval-heads --self-distill that would write documents its heads were trained on (`record`: their
    train-heads record): it scored them on their own training data without a word. Self-distill's batch at document
    `lo` takes the built-in requests from `lo` on, in turn, seeded with --seed + lo: with the same --distill-new-tokens
    and --distill-batch, a seed that differs from training's by a multiple of both the requests' count and the
    batch writes training's batches again, wherever the two runs' documents overlap."""
    from ..train.distill import PROMPTS

    data = record.get("data") if isinstance(record, dict) else None
    distilled = data.get("self_distill") if isinstance(data, dict) else None
    settings = record.get("settings") if isinstance(record, dict) else None
    if not args.self_distill or not isinstance(distilled, dict):
        return
    sampling = distilled.get("sampling")
    seed = sampling.get("seed") if isinstance(sampling, dict) else None
    docs, new = distilled.get("documents"), distilled.get("new_tokens_per_document")
    # A record without the batch (the shipped heads', written before settings were kept) is checked as if every
    # batch could be training's: a seed that differs by a multiple of the requests' count alone is refused
    batch = settings.get("distill_batch") if isinstance(settings, dict) else None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seed, docs, new, batch or 1)):
        return
    assert isinstance(seed, int) and isinstance(docs, int)
    if new != args.distill_new_tokens or (batch is not None and (batch != args.distill_batch or batch <= 0)):
        return
    shift, period = args.seed - seed, math.lcm(len(PROMPTS), batch or 1)
    evaluated = -(-args.self_distill // new)  # the documents this run writes; its batch at lo is training's at lo+shift
    if shift % period == 0 and -evaluated < shift < docs:
        trained = f"--distill-batch {batch}" if batch is not None else "a --distill-batch not recorded"
        raise LongswiftError(f"eval-heads --seed {args.seed} would self-distill documents these heads were trained on "
                             f"(train-heads --seed {seed}, --distill-new-tokens {new}, {trained}): give a --seed that "
                             f"differs from {seed} by other than a multiple of {period}, such as --seed {seed + 1}")


def cmd_eval_heads(args: argparse.Namespace) -> int:
    from ..atomic import check_distinct, check_json_output, check_writable, write_atomic
    from ..engine import load
    from ..spec.heads import named_heads_file
    from ..train.data import data_files
    from ..train.eval import check_alpha_fits, check_window, head_accuracy, held_out_alpha

    runtime = config_from_args(RuntimeConfig, args)
    spec = config_from_args(SpecConfig, args)
    if args.json:
        check_writable(args.json)
        # --json is written last, over what is there: never over the heads, the model or the data this run reads
        data = data_files(args.data) if args.data else []  # (a --data that is not there: read_data says so below)
        check_distinct([("--heads", named_heads_file(args.heads)),
                        *model_inputs(args.model), *(("--data", d) for d in data),
                        ("--json", args.json)])
        check_json_output(args.json, "--json")  # nor over any other file that is not JSON (a heads file)
    if args.alpha_tokens < 0:
        raise LongswiftError("--alpha-tokens must be >= 0")
    if args.seq_len < 2:
        raise LongswiftError(f"--seq-len must be at least 2, got {args.seq_len}")
    if args.heads == "none":
        raise LongswiftError("eval-heads needs draft heads: pass --heads with a heads file, 'default' or 'auto'")
    check_heads_flag(args.heads, None)
    texts = read_data(args, "evaluation")
    check_seq_len(args, runtime, args.seq_len)
    engine = load(args.model, runtime, heads=args.heads)
    if engine.heads is None:
        raise LongswiftError(f"--heads {args.heads} found no draft heads for this model: pass a heads file "
                             "(train one with `longswift train-heads`)")
    check_window(args.seq_len, engine.heads.gamma)  # before the windows, which may distill for minutes
    if args.alpha_tokens:
        check_alpha_fits(engine, args.alpha_tokens, spec=spec)  # before the windows, which may distill for minutes
    _check_not_training_documents(engine.heads_training_record(), args)
    windows, first, info = prepare_windows(engine, args, texts, args.seq_len, args.seed)
    log = progress_lines(args)  # (a log's plain line as each phase starts, as --no-progress's help says)
    if log is not None:
        log(f"the heads' accuracy on {info['windows']:,} windows x {args.seq_len} tokens")
    acc = head_accuracy(engine, engine.heads, windows, progress=show_progress(args), first=first)
    left_out = info.get("prompt_only_windows")  # (self-distilled windows of prompt alone: nothing to score)
    dropped = f" ({left_out} of only prompt tokens left out)" if left_out else ""
    print(f"accuracy on {info['windows']} windows x {args.seq_len} tokens{dropped}: {acc.describe()}")
    result: dict = {"heads": args.heads, "data": info, "accuracy": asdict(acc)}
    if args.alpha_tokens:
        if log is not None:
            log(f"held-out TokenSwift generation of {args.alpha_tokens:,} tokens (paper sampling)")
        s = held_out_alpha(engine, args.alpha_tokens, spec=spec, progress=show_progress(args))
        alpha = f"{s.alpha:.3f}" if s.draft_positions else "n/a (nothing drafted)"  # (to_dict's alpha: None)
        print(f"held-out TokenSwift generation ({s.new_tokens} tokens, paper sampling): alpha {alpha} "
              f"({s.verify_steps} of {s.steps - 1} steps after the first token drafted), "
              f"{s.tokens_per_step:.2f} tokens/step, "
              f"n-gram share {s.ngram_accepted / max(1, s.accepted_tokens):.2f}")
        result["generation"] = s.to_dict()
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")
    return 0
