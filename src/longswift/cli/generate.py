"""`longswift generate`: its flags, a new run or a resumed one, checked and planned before the model loads;
the run itself writes through cli.outputs (checkpoints, a clean stop on SIGINT/SIGTERM/SIGHUP)."""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..config import (GenerationConfig, ModelConfig, RuntimeConfig, SamplingConfig, SpecConfig, changed_spec_fields,
                      dtype_name, flag_name)
from ..errors import ConfigError, LongswiftError
from .flags import (HEADS_HELP, add_config_flags, add_switch, check_heads_flag, config_from_args, given_path,
                    heads_inputs, heads_value, model_inputs, note_unused_spec_fields, output_file, whole_number)
from .outputs import Outputs, shell_word, shown, write_run
from .stop import StopRequest

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..engine import Engine


RESUME_FLAGS = ("--output", "--json", "--checkpoint", "--checkpoint-every", "--no-progress", "--progress", "--threads",
                "--model", "--heads", "--device", "--max-new-tokens", "--debug")


EXAMPLES = """examples:
  longswift generate --prompt "Write a long story about a lighthouse keeper." --max-new-tokens 2000
      stream a story (the embedded model's chat template is applied; --raw sends the text as it is)
  longswift generate --prompt-file notes.txt --max-new-tokens 4000 --seed 1 --output story.txt --json story.json --checkpoint story.ckpt
      a long run saved as it goes; Ctrl-C stops it cleanly and prints the command that continues it
  longswift generate --resume story.ckpt
      continue an interrupted run to exactly the output it would have produced
  longswift generate --resume story.ckpt --max-new-tokens 7000
      extend a finished run: the text a run of 7,000 tokens would have written
  torchrun --nproc-per-node 2 -m longswift generate --model hf_dir/ --prompt "Write a story." --json out.json
      one model across 2 processes (tensor parallel: gloo on a CPU, NCCL with a GPU each); rank 0 writes the output
"""


def add_parser(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate text from a prompt (or continue a checkpointed generation)",
                         description="Generate text with TokenSwift (or plain autoregressive decoding): the "
                                     "output is what the model would have written token by token.",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = gen.add_argument_group("prompt (one of)").add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=given_path, metavar="FILE",
                        help="read the prompt from this UTF-8 file ('-': from standard input)")
    source.add_argument("--prompt-ids", metavar="IDS",
                        help="the prompt as token ids, e.g. 1,5,9 (sent as they are; for models without a tokenizer)")
    source.add_argument("--resume", type=given_path, metavar="CHECKPOINT",
                        help="continue the generation saved in this checkpoint file, with its settings "
                             "(--max-new-tokens gives it a new length, e.g. to extend a finished run)")
    fmt = gen.add_argument_group("prompt format")
    template = fmt.add_mutually_exclusive_group()
    template.add_argument("--chat", action="store_true", default=None,
                          help="wrap the prompt text in the model's chat template (the default when the model has one)")
    template.add_argument("--raw", dest="chat", action="store_false",
                          help="send the prompt text as it is, without the chat template (like Ollama's raw mode)")
    fmt.add_argument("--system", metavar="TEXT",
                     help="the chat's system message (instead of the template's default one, where it has one)")
    model = gen.add_argument_group("model and method")
    model.add_argument("--model", help="a .gguf file, an HF model directory or a Hugging Face model id "
                                       "org/name[@revision] (default: embedded SmolLM2-135M-Instruct)")
    model.add_argument("--method", choices=["ar", "tokenswift"], default=None,
                       help="decoding method (default: tokenswift when the model has heads, else ar)")
    model.add_argument("--heads", type=heads_value, default=None,
                       help=f"draft heads for TokenSwift (default: auto): {HEADS_HELP}; 'none'; 'random' (testing)")
    files = gen.add_argument_group("output (each path distinct; files are written atomically)")
    files.add_argument("--output", type=output_file, metavar="FILE", help="write the text here instead of stdout")
    files.add_argument("--json", type=output_file, metavar="FILE", help="write {token_ids, text, stats} to this file")
    files.add_argument("--checkpoint", type=output_file, metavar="FILE",
                       help="save the generation's state here every --checkpoint-every tokens and when interrupted; "
                            "continue it with --resume")
    files.add_argument("--checkpoint-every", type=whole_number, default=1024, metavar="N",
                       help="tokens between the checkpoints --checkpoint saves (default: 1024)")
    add_switch(files, "--no-progress", "--progress",
               "no status line (it is shown only on a terminal: tokens, tok/s, ETA, alpha, tokens/step)")
    gen.add_argument("--greedy", action="store_true", help=(
        "shorthand for --temperature 0: the argmax after the repetition penalty, which still applies "
        "(the paper's default); --greedy --repetition-penalty 1 is transformers' plain greedy"))
    gen.add_argument("--stop", action="append", metavar="TEXT", help=(
        "end after the generated token that completes TEXT, which stays in the output (repeatable: the first "
        "of them to appear ends the run); \\n, \\t and \\r in TEXT are a newline, tab and carriage return, "
        "\\\\ a backslash"))
    ban = gen.add_argument_group("banned tokens (never drawn nor drafted: logit -inf, before the penalty)")
    ban.add_argument("--ban-ids", action="append", metavar="IDS", help=(
        "token ids to ban, e.g. 128006,128007 (the reference scripts ban Llama-3.1's assistant header this way); "
        "repeatable"))
    ban.add_argument("--ban-token", action="append", metavar="TOKEN", help=(
        "a token to ban, by its vocabulary entry ('<|im_start|>') or text that is one token (' the'); repeatable"))
    for cls in (SamplingConfig, GenerationConfig, SpecConfig, RuntimeConfig):
        add_config_flags(gen, cls)


def _check_utf8_text(args: argparse.Namespace) -> None:
    """Refuse text arguments that are not UTF-8 (a Latin-1 `--prompt "$(cat notes.txt)"`): Python keeps such
    bytes as surrogates, which the tokenizer failed on with a traceback after loading (a chat template "failed";
    a --stop string could never match)."""
    for flag, values in (("--prompt", [args.prompt]), ("--system", [args.system]), ("--stop", args.stop or []),
                         ("--ban-token", args.ban_token or [])):
        for value in values:
            if value is None:
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                byte = ord(value[exc.start]) - 0xDC00 if 0xDC80 <= ord(value[exc.start]) <= 0xDCFF else None
                where = f"byte 0x{byte:02x}" if byte is not None else f"U+{ord(value[exc.start]):04X}"
                raise LongswiftError(f"{flag} is not UTF-8 text ({where} at character {exc.start}): give it in UTF-8 "
                                     "(a UTF-8 locale), or put the prompt in a UTF-8 file (--prompt-file)") from None


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def stop_text(value: str) -> str:
    """A --stop TEXT with its escapes read (\\n, \\t, \\r, \\\\): a shell passes `--stop "\\n"` as a backslash and
    an n, which never matched the newline meant, and nothing said so (found by review); other backslashes stay."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], value)


def cmd_generate(args: argparse.Namespace) -> int:
    """Every argument is checked before the model is loaded: a mistake costs no loading time."""
    from ..encoding import PromptEncoder
    from ..prompts import STDIN

    if args.checkpoint_every <= 0:
        raise LongswiftError("--checkpoint-every must be a positive number of tokens")
    # on --resume, the checkpoint is the file resumed
    if args.resume is None and args.checkpoint is None and "--checkpoint-every" in _given(args):
        raise LongswiftError("--checkpoint-every needs --checkpoint FILE, the file it saves to")
    if args.resume is None and args.prompt is None and args.prompt_file is None and args.prompt_ids is None:
        raise LongswiftError("give a prompt: --prompt TEXT, --prompt-file FILE or --prompt-ids IDS "
                             "(or --resume CHECKPOINT)")
    if args.resume is not None:
        return _resume(args)
    _check_utf8_text(args)
    if args.greedy:
        typed = [a.split("=")[0] for a in args.argv if a.startswith("--te")]  # argparse takes --temp for --temperature
        given = args.temperature != SamplingConfig.temperature or any("--temperature".startswith(a) for a in typed)
        if given and args.temperature != 0:
            raise LongswiftError(f"--greedy means --temperature 0, but --temperature {args.temperature} was given: "
                                 "drop one of them")
        args.temperature = 0.0
    sampling = config_from_args(SamplingConfig, args)
    if args.ban_ids is not None:
        banned = [t for text in args.ban_ids for t in parse_ids("--ban-ids", text)]
        if any(t < 0 for t in banned):
            raise LongswiftError(f"--ban-ids must be non-negative token ids; got {min(banned)}")
        sampling = replace(sampling, banned_ids=banned)
    if any(not t for t in args.ban_token or ()):
        raise LongswiftError("--ban-token needs a token's text (it was empty): give its vocabulary entry or text")
    generation = replace(config_from_args(GenerationConfig, args), stop=tuple(map(stop_text, args.stop or ())))
    spec = config_from_args(SpecConfig, args)
    runtime = config_from_args(RuntimeConfig, args)
    if args.system is not None:  # the message says which of its conditions failed
        if not args.system.strip():
            raise LongswiftError("--system needs some text (the system message of the chat template)")
        if args.chat is False:
            raise LongswiftError("--system goes into the chat template, which --raw turns off: drop one of them")
        if args.prompt_ids is not None:
            raise LongswiftError("--system goes into the chat template, which --prompt-ids bypasses: give --prompt "
                                 "or --prompt-file")
    prompt, chat = _prompt(args)
    heads = args.heads or "auto"
    check_heads_flag(heads, args.method)
    outputs = _outputs(args, inputs=[("--prompt-file", None if str(args.prompt_file) == STDIN else args.prompt_file),
                                     *model_inputs(args.model), *heads_inputs(heads)])
    _keep_unfinished(outputs)
    # (torch: once the arguments are checked)
    from ..runtime.loading import load_config, model_tokenizer, weights_copied
    from ..spec.released import describe_heads
    from ..spec.tokenswift import spec_for_heads

    cfg = load_config(args.model, runtime.rope_scaling)
    # Plan for TokenSwift's buffers where it will run: --method tokenswift, or heads that --heads finds (read from
    # file headers, as info does: a model with none, planned as TokenSwift, was refused runs that fit as AR)
    found = describe_heads(args.model, heads, cfg) if args.method != "ar" else None
    tokenswift = args.method == "tokenswift" or (found is not None and found.drafts)
    planned = spec
    if tokenswift and found is not None and found.gamma is not None:  # a tree deeper than the heads draft: refused
        planned = spec_for_heads(spec, runtime.torch_device(), found.gamma)[0]  # before loading, not after
    system = args.system
    if isinstance(prompt, str):  # encoded before the weights load (their tokenizer and config suffice), so that the
        # plan counts its tokens: a prompt past the context or the memory is refused without reading a weight
        prompt = PromptEncoder(model_tokenizer(args.model), cfg).encode(prompt, chat, system)
        chat, system = False, None  # (in the ids now)
    _plan_before_loading(cfg, runtime, generation, len(prompt), planned if tokenswift else None,
                         copies=weights_copied(args.model, runtime.torch_dtype()))
    if args.prompt_ids is not None and any(not 0 <= t < cfg.vocab_size for t in prompt):  # (text's: encode's check)
        raise LongswiftError(f"--prompt-ids must be in [0, {cfg.vocab_size}) for this model")
    if any(t >= cfg.vocab_size for t in sampling.banned_ids):
        raise LongswiftError(f"--ban-ids must be in [0, {cfg.vocab_size}) for this model")
    # torchrun's group is joined before the stop handlers take SIGTERM and SIGINT: a rendezvous that waits for a
    # process that never comes blocks in torch, where a handler's flag is never read; SIGTERM's default ends it
    with Ranks(runtime) as ranks, StopRequest() as stop, (outputs.locked() if ranks.main else nullcontext()):
        with stop.at_once():
            engine = ranks.load(args.model, heads, drafts=args.method != "ar")
        if args.ban_token:  # names need the tokenizer: looked up once it is loaded
            if engine.tokenizer is None:
                raise LongswiftError("--ban-token names tokens by their text, and this model has no tokenizer: ban "
                                     "them by id with --ban-ids")
            try:
                named = tuple(engine.token_id(t) for t in args.ban_token)
            except LongswiftError as exc:
                raise LongswiftError(f"--ban-token: {exc.cli_message}") from None
            sampling = replace(sampling, banned_ids=(*sampling.banned_ids, *named))
        if ranks.main:
            _note_unused_drafting(args, spec, heads, engine.heads is None)
        stream = engine.stream(prompt, sampling=sampling, generation=generation, chat=chat, method=args.method,
                               spec=spec, system=system)
        return write_run(engine, stream, outputs, stop, args.no_progress)


def _prompt(args: argparse.Namespace) -> tuple[str | list[int], bool | None]:
    """The prompt a new run was given (--prompt-ids' ids, or the text of --prompt or --prompt-file), and whether to
    wrap text in the chat template (None: where the model has one)."""
    from ..prompts import STDIN, read_prompt_file, without_final_newline

    if args.prompt_ids is not None:
        if args.chat:
            raise LongswiftError("--chat wraps prompt text: use --prompt or --prompt-file with it")
        return parse_ids("--prompt-ids", args.prompt_ids), False
    if args.prompt is None and str(args.prompt_file) == STDIN:
        from ..runtime.torchrun_env import env_world_size

        if env_world_size() > 1:  # one process got the text, which one by chance; the others an empty prompt
            raise LongswiftError("--prompt-file - (standard input) reaches only one of torchrun's processes: "
                                 "write the prompt to a file and give its name")
        if sys.stdin is not None and sys.stdin.isatty():  # (it waited without a word for text typed at a terminal)
            print("longswift: reading the prompt from the terminal: type it, then press Ctrl-D on a line of its own",
                  file=sys.stderr)
    elif args.prompt is None and not _every_process_reads(args.prompt_file):
        # A FIFO's text went to one process and the others waited for a writer (a hang); torchrun passes no
        # process substitution <(...) on (its /dev/fd/N was "does not exist")
        raise LongswiftError(f"--prompt-file '{args.prompt_file}' is a pipe (a process substitution <(...), a FIFO "
                             "or a device), which torchrun's processes cannot each read: write the prompt to a "
                             "file and give its name")
    prompt = args.prompt if args.prompt is not None else without_final_newline(read_prompt_file(args.prompt_file))
    if not prompt.strip():
        raise LongswiftError("the prompt is empty: give some prompt text")
    return prompt, args.chat


def _note_unused_drafting(args: argparse.Namespace, spec: SpecConfig, heads: str, no_heads: bool) -> None:
    """Say which drafting flags given change nothing in this run (one command line run with each method: not
    refused, but said): all of them where the run is AR (`no_heads`: the model has none), or those another
    TokenSwift setting leaves unused."""
    drafting = changed_spec_fields(spec)
    if args.method == "ar" and args.heads not in (None, "none"):
        drafting = ["heads", *drafting]
    if drafting and (args.method == "ar" or no_heads):
        flags = ", ".join(map(flag_name, drafting))
        why = ("--method ar runs AR" if args.method == "ar" else "--heads none runs AR" if heads == "none"
               else "this model has no draft heads, so the run is AR")
        print(f"longswift: note: {flags} {'sets' if len(drafting) == 1 else 'set'} how TokenSwift drafts, and "
              f"{why}, which does not draft", file=sys.stderr)
    elif drafting:
        note_unused_spec_fields(spec)


def _every_process_reads(path: Path) -> bool:
    """Whether each of torchrun's processes can read the prompt file for itself (always, for one process): a regular
    file, or a path read_prompt_file refuses on its own; not a pipe, nor a /dev/fd/N that torchrun did not pass on."""
    from ..runtime.torchrun_env import env_world_size

    if env_world_size() == 1:
        return True
    try:
        return stat.S_ISREG(os.stat(path).st_mode)  # (stat opens nothing: a FIFO does not block it)
    except FileNotFoundError:
        return not str(path).startswith(("/dev/fd/", "/proc/self/fd/"))
    except OSError:  # (read_prompt_file says why it cannot be read)
        return True


def parse_ids(flag: str, text: str) -> list[int]:
    """--prompt-ids' or --ban-ids' value: token ids separated by commas or spaces, at least one."""
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise LongswiftError(f"{flag} must be token ids separated by commas or spaces; got '{text}'") from None
    if not ids:
        raise LongswiftError("the prompt is empty: give at least one token id" if flag == "--prompt-ids"
                             else f"{flag} needs at least one token id")
    return ids


class Ranks:
    """One process, or (under torchrun) this rank of a tensor-parallel group: every rank runs the
    model's shard and the same loop; rank 0 alone writes output, progress, JSON and checkpoints."""

    def __init__(self, runtime: RuntimeConfig) -> None:
        from ..runtime.torchrun_env import env_rank, env_world_size

        self.parallel = env_world_size() > 1
        self.main = env_rank() == 0
        self.runtime = runtime

    def __enter__(self) -> Ranks:
        if self.parallel:
            from ..runtime.parallel import init_from_env

            self.runtime = init_from_env(self.runtime)
        return self

    def load(self, model: str | None, heads: str, drafts: bool) -> Any:
        """`drafts`: the run may be TokenSwift's (notes on its heads are said)."""
        from ..engine import load
        from ..runtime.linear import half_precision_note

        engine = load(model, self.runtime, heads=heads, tensor_parallel=self.parallel)
        note = half_precision_note(engine.model.dtype, engine.model.device)  # (once it loads: an error is one line)
        for note in (note, engine.heads_note() if drafts else None):
            if note and self.main:
                print(f"longswift: note: {note}", file=sys.stderr)
        return engine

    def __exit__(self, *exc: Any) -> None:
        if self.parallel:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _resumed_outputs(args: argparse.Namespace, ckpt: Checkpoint, given: list[str],
                     resumed: Path) -> tuple[Path | None, dict[str, Path]]:
    """Set a resume's --output, --json, --checkpoint-every and --checkpoint to the checkpoint's where not given
    again, and refuse outputs it cannot write or that were written since. Returns where the checkpoint was saved if
    it was moved since (else None) and the outputs that follow it there (flag -> path)."""
    # Each output not given again goes where the first run wrote it. (Older checkpoints hold paths
    # relative to where they were written: read them from the checkpoint's folder.)
    here = resumed.parent
    saved: dict[str, Path | None] = {k: here / Path(cast(str, v)).expanduser() if v else None  # (paths, or null)
                                     for k, v in ckpt.outputs.items() if k in ("output", "json")}
    # A checkpoint resumed from elsewhere than it was saved (its job's directory copied or moved): the outputs that
    # lay in the job's directory follow it (the copy's resume wrote into the original job's files).
    followed: dict[str, Path] = {}  # flag -> where its output follows the checkpoint to
    if (was := _moved_from(ckpt.outputs.get("checkpoint"), resumed)) is not None:
        follow = _following(was, resumed, {k: p for k, p in saved.items() if ("--" + k) not in given})
        saved |= follow
        followed = {"--" + k: p for k, p in follow.items()}
    args.output = saved.get("output") if args.output is None else args.output
    args.json = saved.get("json") if args.json is None else args.json
    if "--checkpoint-every" not in given and ckpt.outputs.get("checkpoint_every"):  # saves as often as the first run
        args.checkpoint_every = ckpt.outputs["checkpoint_every"]
    for flag, path in (("--output", args.output), ("--json", args.json)):  # (a job directory moved since)
        if path is not None and flag not in given and not path.parent.is_dir():
            raise LongswiftError(f"the checkpoint writes {flag} to '{path}', whose directory no longer exists: "
                                 f"give {flag} FILE with --resume to write it elsewhere")
        # A run writes its outputs before it saves its state, so one written after the checkpoint is another
        # run's (given the same --output, it finished meanwhile) or an edit: the resume would replace it unasked.
        # (A copied directory's files carry the times of the copy: not checked there.)
        if path is not None and flag not in given and flag not in followed and path.is_file() and \
                path.stat().st_mtime_ns > resumed.stat().st_mtime_ns:
            raise LongswiftError(f"'{path}' (the checkpoint's {flag}) was written after the checkpoint was saved, by "
                                 f"another run or by hand, and resuming would replace it: move it away, or give "
                                 f"{flag} FILE with --resume to write elsewhere")
    if args.checkpoint is None:
        args.checkpoint = args.resume
        if not os.access(here, os.W_OK):
            raise LongswiftError(f"cannot update the checkpoint '{args.resume}' in place: its directory is not "
                                 "writable; give --checkpoint FILE with --resume to save the resumed run elsewhere")
        if not os.access(resumed, os.W_OK) or not resumed.stat().st_mode & 0o222:  # (an archived one; root: no bit)
            raise LongswiftError(f"cannot update the checkpoint '{args.resume}' in place: it is read-only; make it "
                                 "writable (chmod u+w), or give --checkpoint FILE with --resume to save the resumed "
                                 "run elsewhere")
    return was, followed


def _resumed_configs(args: argparse.Namespace, ckpt: Checkpoint, given: list[str],
                     model: Any) -> tuple[RuntimeConfig, GenerationConfig, SpecConfig | None]:
    """The checkpoint's runtime (with a --device or --threads given now), generation and TokenSwift settings; a
    damaged setting, a device this machine lacks, or a model or heads that were Python objects are refused."""
    moved = {"device": args.device} if "--device" in given else {}  # e.g. a GPU run continued on a CPU
    try:
        if moved and RuntimeConfig(device=args.device).torch_device().type != "cuda":
            # CUDA's own settings do not follow the run off CUDA (they change no token there: graphs replay what
            # runs eagerly; the Triton kernels round as the eager ops, which a CPU run also differs from in float32)
            moved |= {"cuda_graphs": "auto", "triton_kernels": False}
        runtime = RuntimeConfig(**{**ckpt.runtime, **moved})
        gen = GenerationConfig(**ckpt.generation)
    except ConfigError as exc:
        if exc.cli_message.startswith("--device") and moved:  # the device asked for now is not on this machine
            raise LongswiftError(exc.cli_message) from None
        if exc.cli_message.startswith("--device"):  # a device this machine does not have: not damage
            raise LongswiftError(f"checkpoint '{args.resume}' ran on another device: {exc.cli_message}") from None
        raise LongswiftError(f"checkpoint '{args.resume}' holds damaged settings ({exc})") from None
    except (TypeError, LongswiftError) as exc:
        raise LongswiftError(f"checkpoint '{args.resume}' holds damaged settings ({exc})") from None
    if args.threads is not None:  # checked as the first run's was, before the checkpoint can record it
        runtime = replace(runtime, threads=args.threads)
    if model is not None and str(model).startswith("<"):
        raise LongswiftError(f"the checkpoint's model was a Python object ({model}): pass --model PATH")
    if args.heads is None and (ckpt.heads_source or "").startswith("<"):  # (set_heads was given a DraftHeads)
        raise LongswiftError(f"the checkpoint's draft heads were a Python object ({ckpt.heads_source}): pass "
                             "--heads PATH (the file they were saved to)")
    try:  # TokenSwift's draft cache and tree count too (a resume that fits only as AR: refused before loading)
        spec = SpecConfig(**ckpt.spec) if ckpt.method == "tokenswift" else None
    except (TypeError, LongswiftError) as exc:
        raise LongswiftError(f"checkpoint '{args.resume}' holds damaged settings ({exc})") from None
    return runtime, gen, spec


def _say_resuming(ckpt: Checkpoint, gen: GenerationConfig, engine: Engine, resumed: Path) -> None:
    """The line a resume starts with: where it resumes, or that the run is complete."""
    from ..stats import ended

    done = ended(list(ckpt.token_ids), gen, engine.eos_ids, ckpt.stats.get("finish_reason"))  # no re-read then
    print(f"longswift: the run in '{shown(resumed)}' is complete "
          f"({len(ckpt.token_ids)} of {gen.max_new_tokens} tokens, stop: {done}): its outputs are written again"
          if done else
          f"longswift: resuming at {len(ckpt.token_ids)} of {gen.max_new_tokens} tokens "
          f"(re-reading {len(ckpt.prompt_ids) + len(ckpt.token_ids)} tokens of context)"
          + (f"; in {dtype} the re-read cache rounds otherwise than the steps that wrote it: the rest "
             "follows the model's distribution, not the uninterrupted run's tokens"
             if (dtype := dtype_name(engine.model.dtype)) in ("bfloat16", "float16") else ""), file=sys.stderr)


def _resume(args: argparse.Namespace) -> int:
    from ..checkpoint import EMBEDDED, read_checkpoint
    from ..runtime.torchrun_env import env_rank

    given = _given(args)
    extra = [a for a in given if a not in (*RESUME_FLAGS, "--resume")]
    if extra:
        raise LongswiftError(f"{extra[0]} cannot be used with --resume: the checkpoint's settings are used (only "
                             f"{', '.join(RESUME_FLAGS[:-1])} apply)")
    seen = _identity(args.resume)  # (before the read: a save between the two is a change, refused below)
    ckpt = read_checkpoint(args.resume)
    if "--heads" in given and ckpt.method != "tokenswift":  # (it ran on as AR without a word)
        raise LongswiftError(f"--heads has no use here: the checkpoint's run is {ckpt.method.upper()}, and a resumed "
                             "run keeps its method; drop --heads")
    if "--max-new-tokens" in given:  # a new length: extends a finished run
        ckpt = ckpt.with_length(args.max_new_tokens)
    resumed = args.resume.expanduser().absolute()
    was, followed = _resumed_outputs(args, ckpt, given, resumed)
    model = args.model or (None if ckpt.model_source == EMBEDDED else ckpt.model_source)
    _moved_since(args, ckpt)
    outputs = _outputs(args, inputs=[*model_inputs(model), *heads_inputs(args.heads or ckpt.heads_source)],
                       checkpoint_flag="--checkpoint" if "--checkpoint" in given else "--resume",
                       recorded=[f for f in ("--output", "--json") if f not in given])
    _keep_unfinished(outputs, resuming=resumed)
    runtime, gen, spec = _resumed_configs(args, ckpt, given, model)
    from ..runtime.loading import load_config, weights_copied

    _plan_before_loading(load_config(model, runtime.rope_scaling), runtime, gen, len(ckpt.prompt_ids), spec,
                         resumed=True, copies=weights_copied(model, runtime.torch_dtype()))
    if followed and env_rank() == 0:  # (once the refusals before loading are past: a refusal is one line)
        print(f"longswift: the checkpoint was saved as '{was}' (copied or moved since): "
              + ", ".join(f"{flag} follows it to '{shown(to)}'" for flag, to in sorted(followed.items())),
              file=sys.stderr)
    heads = args.heads or ckpt.heads_source or "none"
    updated = outputs.checkpoint is not None and outputs.checkpoint.resolve() == resumed.resolve()
    # torchrun's group is joined before the stop handlers take SIGTERM and SIGINT: a rendezvous that waits for a
    # process that never comes blocks in torch, where a handler's flag is never read; SIGTERM's default ends it
    with Ranks(runtime) as ranks, StopRequest() as stop, (outputs.locked() if ranks.main else nullcontext()):
        # (read before its lock: a run holding it saved it since; one saved elsewhere, --checkpoint, was read whole)
        if ranks.main and updated and _identity(args.resume) != seen:
            raise LongswiftError(f"the checkpoint '{shown(resumed)}' changed while this resume started (another "
                                 "run saved or removed it): run the command again to continue from what it holds now")
        with stop.at_once():
            engine = ranks.load(model, heads, drafts=ckpt.method == "tokenswift")
        stream = engine.resume(ckpt)
        if ranks.main:
            _say_resuming(ckpt, gen, engine, resumed)
        return write_run(engine, stream, outputs, stop, args.no_progress,
                         last_saved=(resumed, len(ckpt.token_ids)))


def _identity(path: Path) -> tuple[int, ...] | None:
    """What changes when a file is saved again (replaced by a rename, or written in place); None if unreadable."""
    try:
        st = os.stat(path.expanduser())
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _moved_from(was: Any, resumed: Path) -> Path | None:
    """Where the checkpoint now read from `resumed` was saved (`was`, its outputs' record), if that is another
    file: a copy or a move of it since; None where it is the same file, or an older checkpoint records none."""
    if not isinstance(was, str) or not was:
        return None
    old = Path(was)
    try:
        if old == resumed or (old.exists() and os.path.samefile(old, resumed)):
            return None
    except OSError:  # (unreadable where it was: it is not this file)
        pass
    return old


def _following(was: Path, resumed: Path, outputs: dict[str, Path | None]) -> dict[str, Path]:
    """The outputs that follow a checkpoint saved at `was` and read now from `resumed` (a job's directory copied
    or moved), and where to. The checkpoint's old and new folders, less the trailing folders they share (job/ckpt
    and job2/ckpt give job and job2), are the job's old and new places: an output under the old one goes to the
    same place under the new one where its folder exists there; one elsewhere, or whose folder the copy left out,
    stays where it was recorded. Recorded paths are compared as normalised text (`..`); the new place is taken
    through symlinks, and an output that lands on the file it was (another name for it) does not follow."""
    old_root, new_root = Path(os.path.normpath(was)).parent, resumed.resolve().parent
    while old_root.name and old_root.name == new_root.name:
        old_root, new_root = old_root.parent, new_root.parent
    moved = {}
    for k, p in outputs.items():
        if p is None or not (p := Path(os.path.normpath(p))).is_relative_to(old_root):
            continue
        new = new_root / p.relative_to(old_root)
        if new.parent.is_dir() and new.resolve() != p.resolve():
            moved[k] = new
    return moved


def _keep_unfinished(out: Outputs, resuming: Path | None = None) -> None:
    """Refuse a run whose outputs would replace a checkpoint of a run not yet finished: re-running a job's
    command after it was stopped (a batch script after preemption), or an output named by mistake (--json on
    a checkpoint, --checkpoint on another job's), would replace hours of saved state. `resuming`: the
    checkpoint this run continues, which it updates."""
    from ..checkpoint import read_checkpoint, unfinished_run

    fallback = out.fallback_checkpoint() if out.checkpoint is None and (out.output or out.json) else None
    for flag, path in (("--checkpoint", out.checkpoint), ("the checkpoint next to --output/--json", fallback),
                       ("--output", out.output), ("--json", out.json)):
        if path is None or not path.is_file() or (resuming is not None and path.resolve() == resuming.resolve()):
            continue
        try:
            with open(path, "rb") as f:
                if not f.read(64).removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{"):  # (text: read no further)
                    continue
            c = read_checkpoint(path)
        except OSError:
            continue
        except LongswiftError as exc:  # damaged: nothing to keep; another version's run: its version resumes it
            if (run := unfinished_run(path)) is None:
                continue
            raise LongswiftError(f"'{shown(path)}' ({flag}) holds an unfinished run ({run[0]} of {run[1]} tokens) that "
                                 f"this run would replace: {exc}; or "
                                 + ("delete the file to start over" if "checkpoint" in flag else
                                    f"give {flag} another file")) from None
        total = c.generation.get("max_new_tokens")
        if c.stats.get("finish_reason") in ("eos", "stop") or not isinstance(total, int) or len(c.token_ids) >= total:
            continue
        instead = "delete the file to start over" if "checkpoint" in flag else f"give {flag} another file"
        raise LongswiftError(f"'{shown(path)}' ({flag}) holds an unfinished run ({len(c.token_ids)} of {total} tokens): "
                             f"continue it with `longswift generate --resume {shell_word(shown(path))}`, or {instead}")


def _moved_since(args: argparse.Namespace, ckpt: Any) -> None:
    """Refuse, naming the flag that says where they are now, a resume whose checkpoint's model or heads path
    is gone (a job directory moved or copied to another machine)."""
    source = ckpt.model_source  # EMBEDDED, "<ClassName>", a hub id, or a local path recorded absolute
    if args.model is None and os.path.isabs(source) and not os.path.exists(source):
        raise LongswiftError(f"the checkpoint's model '{source}' no longer exists: give --model PATH with "
                             "--resume (where that model is now)")
    heads = ckpt.heads_source
    if args.heads is None and heads is not None and os.path.isabs(heads) and not os.path.exists(heads):
        raise LongswiftError(f"the checkpoint's draft heads '{heads}' no longer exist: give --heads PATH with --resume "
                             "(where those heads are now)")


def _given(args: argparse.Namespace) -> list[str]:
    """The flags on the command line as typed, those that apply on --resume spelt out (_spelt_out)."""
    return [_spelt_out(a.split("=")[0]) for a in args.argv if a.startswith("--")]


def _spelt_out(flag: str) -> str:
    """A flag that applies on --resume, as argparse took it from a unique prefix (--out for --output);
    any other flag as typed. (No other flag of generate's is a prefix of one of these: a prefix of
    one of them that argparse accepted was that flag.)"""
    whole = [f for f in (*RESUME_FLAGS, "--resume") if f.startswith(flag)]
    return flag if flag in whole or len(whole) != 1 else whole[0]


def _outputs(args: argparse.Namespace, inputs: Sequence[tuple[str, Path | None]] = (),
             checkpoint_flag: str = "--checkpoint", recorded: Sequence[str] = ()) -> Outputs:
    """The output paths, made absolute, checked writable and distinct (from each other and from the
    input files): two outputs on one file would leave only the one written last. `checkpoint_flag`: the flag
    that named the checkpoint (a resume updates the file --resume names); `recorded`: the flags whose path a
    resume took from its checkpoint (named so: the user gave no such flag)."""
    from ..atomic import check_distinct, check_json_output, check_writable

    named = {flag: check_writable(p, flag).absolute() for flag, p in (("--output", args.output), ("--json", args.json),
                                                                 (checkpoint_flag, args.checkpoint)) if p is not None}
    out = Outputs(named.get("--output"), named.get("--json"), named.get(checkpoint_flag), args.checkpoint_every)
    if out.checkpoint is None:
        fallback = named["the checkpoint written when interrupted"] = out.fallback_checkpoint()
        try:
            check_writable(fallback)
        except LongswiftError as exc:  # the run itself may still write what it was asked to (stdout)
            from ..runtime.torchrun_env import env_rank

            if env_rank() == 0:  # (under torchrun every process checks; rank 0 alone says so, as it writes)
                print(f"longswift: warning: {exc}, where an interrupted run saves its state: give --checkpoint FILE "
                      "to make this run resumable", file=sys.stderr)
    check_distinct([(f"the checkpoint's {flag}" if flag in recorded else flag, p) for flag, p in named.items()]
                   + list(inputs))
    for flag in ("--json", checkpoint_flag):  # nor over a file that is not JSON (a heads file named by mistake)
        if flag in named:
            check_json_output(named[flag], flag)
    return out


def _plan_before_loading(cfg: ModelConfig, runtime: RuntimeConfig, gen: GenerationConfig, prompt_tokens: int,
                         spec: SpecConfig | None = None, resumed: bool = False, copies: bool = True) -> None:
    """Refuse, before reading any weights, a run (of the model whose config is `cfg`) whose weights + KV cache for its
    prompt and new tokens cannot fit (with TokenSwift's tree and draft cache when `spec` is given; `resumed`: a run
    that keeps its checkpoint's rope scaling; `copies`: whether the load holds the weights as copies,
    runtime.loading.weights_copied). Under torchrun, a model that does not split across the processes is refused here,
    and on CUDA the plan is one process's shard."""
    import torch

    from ..runtime.memory import check_context
    from ..runtime.model import FLOAT32_LOGITS_TP
    from ..runtime.parallel import plan_shards, shard_config
    from ..runtime.torchrun_env import env_local_rank, env_world_size
    from ..spec.budget import plan_before_loading

    check_context(cfg, prompt_tokens, gen.max_new_tokens, rescalable=not resumed, applied=runtime.rope_scaling)
    tokens = prompt_tokens + gen.max_new_tokens
    held = cfg  # what one process holds
    if env_world_size() > 1:
        shard = shard_config(cfg, plan_shards(cfg, 0, env_world_size()))
        # A GPU holds its process's shard (the LM head counted whole); on a CPU the processes share the
        # host's memory, and each reads the whole checkpoint while loading.
        device = runtime.torch_device()
        if runtime.float32_logits and runtime.torch_dtype() in (torch.bfloat16, torch.float16):  # (as the model does,
            raise LongswiftError(FLOAT32_LOGITS_TP)  # but before every process has read the whole checkpoint)
        held = shard if device.type == "cuda" else cfg
        local = env_local_rank()  # this process's GPU, as init_from_env chooses it (which refuses one not there)
        if device.type == "cuda" and device.index is None and local < torch.cuda.device_count():
            runtime = replace(runtime, device=f"cuda:{local}")  # (the current one is cuda:0 for all)
    # The prefill reads the prompt (a resume's, the tokens it holds too): no chunk is longer
    chunk = min(gen.prefill_chunk, tokens if resumed else prompt_tokens)
    plan_before_loading(held, runtime, tokens, chunk, spec, copies).check(weights_loaded=False, resumed=resumed)


