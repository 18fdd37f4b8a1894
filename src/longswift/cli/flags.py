"""Command-line flags built from the config dataclasses' fields, and configs built back from them."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import HEADS_WORDS, SpecConfig, changed_spec_fields, flag_name, seed_problem, unused_spec_fields
from ..errors import LongswiftError

# --model of every command but generate (whose help names the embedded model) and export-heads (the base model)
MODEL_HELP = ("a .gguf file, an HF model directory or a Hugging Face hub id org/name[@revision] "
              "(default: embedded model)")

# Where --heads takes draft heads from (spec.released.choose_heads), for each command's --heads help.
HEADS_HELP = ("'auto' = the model checkpoint's own heads (released TokenSwift models), else those shipped for the "
              "model (the embedded model has some), else none; 'default' = only shipped heads; a heads file, or a "
              "directory / hub id holding heads.safetensors or a released checkpoint")

# Help group titles: what a user looks for, not the class names.
TITLES = {
    "SamplingConfig": "sampling",
    "GenerationConfig": "generation",
    "SpecConfig": "TokenSwift (draft heads, tree, n-grams, draft cache)",
    "RuntimeConfig": "device and precision",
    "TrainConfig": "training",
}


def output_file(text: str) -> Path:
    """argparse type: an output file's path. Refuses an empty one (Path("") is ".", refused as "output path '.'
    is a directory") and one ending in a slash, which names a directory (Path drops the slash: the file was
    written under the directory's name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a file name")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"'{text}' ends in '/', so it names a directory: give a file name")
    return Path(text)


def given_path(text: str) -> Path:
    """argparse type: a path that is not empty (Path("") is ".": an unset variable trained into, resumed from or
    wrote results into the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?): give a path")
    return Path(text)


def whole_number(text: str) -> int:
    """argparse type: an integer, with a one-line reason when it is not one ('1e9', '2.5', 'abc')."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None


def seed_number(text: str) -> int:
    """argparse type: a seed torch's generators take, refused at parse time rather than after loading."""
    value = whole_number(text)
    problem = seed_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem.removeprefix("--seed "))
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None


def add_config_flags(parser: argparse.ArgumentParser, cls: type,
                     overrides: dict[str, tuple[Any, str]] | None = None, skip: tuple[str, ...] = ()) -> None:
    """One flag per dataclass field: `--field-name`, typed and documented from the field.
    `overrides` gives a field another default and help text in this command: {name: (default, help)}.
    `skip`: fields this command does not use, which get no flag (config_from_args gives them their default)
    rather than one that would be accepted and do nothing."""
    group = parser.add_argument_group(TITLES.get(cls.__name__, cls.__name__))
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata or f.name in skip:
            continue
        flag = flag_name(f.name)
        kind = hints[f.name]
        default, text = (overrides or {}).get(f.name, (f.default, f.metadata["help"]))
        choices = f.metadata.get("choices")
        if choices and not all(c in text for c in choices):
            text += f"; one of {', '.join(choices)}"
        if default is not None and "default" not in text:  # each default once
            text += f" (default: {default})"
        if kind is bool or kind == (bool | None):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=text)
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        parse = seed_number if f.name == "seed" else {int: whole_number, float: number}.get(base, base)
        metavar = "{" + ",".join(choices) + "}" if choices else {int: "N", float: "X"}.get(base, f.name.upper())
        group.add_argument(flag, dest=f.name, type=parse, default=default, metavar=metavar, help=text)


def add_switch(group: Any, flag: str, other: str, help: str) -> None:
    """A command's own on/off flag (off by default; `flag` turns it on) and its other form, which states the default,
    as every config switch has (`--adaptive` / `--no-adaptive`): the last given wins."""
    dest = flag.removeprefix("--").replace("-", "_")
    group.add_argument(flag, action="store_true", help=help)
    group.add_argument(other, dest=dest, action="store_false", help=f"(the default) the opposite of {flag}")


def config_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The config the flags give (a field the command has no flag for keeps its default)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                  if "help" in f.metadata and hasattr(args, f.name)})


# RuntimeConfig fields that only the decoding loop reads (CUDA graphs, token blocks, logits precision):
# commands that never decode (info, train-heads, export-heads) take no flags for them.
DECODING_ONLY = ("cuda_graphs", "read_every", "graph_attention", "float32_logits", "triton_kernels")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether a command draws progress bars: asked (no --no-progress) and stderr is a terminal, where a
    bar redrawn with carriage returns reads as one line (in a redirected file it is kilobytes of them)."""
    return not args.no_progress and sys.stderr.isatty()


def progress_lines(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Where a long command says how far it is when stderr is no terminal (a log under nohup, where bars are
    not drawn): plain lines, now and then; None on a terminal (the bars say it) or with --no-progress."""
    if args.no_progress or sys.stderr.isatty():
        return None
    from .stop import say  # best effort: a reader of stderr that went away (| tee, closed) must not stop the run

    return lambda line: say(f"longswift: {line}")


def heads_value(text: str) -> str:
    """--heads as argparse takes it: an empty value (an unset shell variable) is refused, not read as the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?): give a heads file or directory, 'auto', "
                                         "'default', 'random' or 'none'")
    return text


def check_heads_flag(heads: str, method: str | None) -> None:
    """--heads checked before the model loads: a missing heads file, an unfinished train-heads --out."""
    if method == "tokenswift" and heads == "none":
        raise LongswiftError("--method tokenswift needs draft heads: drop --heads none (or use --method ar)")
    if heads.endswith(".safetensors") and not Path(heads).expanduser().is_file():
        if Path(heads).expanduser().exists():  # a device, pipe or directory: there, but no heads file
            raise LongswiftError(f"heads file '{heads}' is not a regular file: pass a file written by `longswift "
                                 "train-heads`")
        raise LongswiftError(f"heads file '{heads}' does not exist: pass a file written by `longswift train-heads`")
    if Path(heads).expanduser().is_dir():
        from ..spec.released import choose_heads

        # a directory with no heads, or an unfinished train-heads --out: said before loading
        choose_heads(heads, in_checkpoint=lambda: False, shipped=lambda: None)
    elif heads not in HEADS_WORDS and not Path(heads).expanduser().exists():
        from ..runtime.loading.hub import parse_hub_id

        if parse_hub_id(heads) is None:  # neither a path that is there nor a hub id: said before loading
            raise LongswiftError(f"heads '{heads}' do not exist: pass a heads file, a directory holding one, or a "
                                 "released checkpoint")


def heads_inputs(heads: str | None) -> list[tuple[str, Path | None]]:
    """The --heads files as check_distinct inputs, which no output may replace: a heads file, every file of a
    heads directory (a TokenSwift checkpoint's model files too), and the heads shipped in the package, which
    auto and default read. `generate --output H.safetensors --heads H.safetensors` replaced the trained heads
    with the generated text."""
    from ..spec.heads import SHIPPED_DIR

    if heads is None or heads in ("none", "random"):
        return []
    path = Path(heads).expanduser()
    if path.is_file():
        return [("--heads", path)]
    if path.is_dir():
        return [("--heads", f) for f in sorted(path.iterdir()) if f.is_file()]
    return [("--heads", f) for f in sorted(SHIPPED_DIR.glob("*.safetensors"))] if heads in ("auto", "default") else []


def model_inputs(model: str | None) -> list[tuple[str, Path | None]]:
    """The --model's files as check_distinct inputs (runtime.loading.model_files): no output may replace
    them."""
    from ..runtime.loading import model_files

    if model is not None and str(model).startswith("<"):  # a checkpoint's Python object: refused on resume
        return []
    return [("--model", f) for f in model_files(model)]


def note_unused_spec_fields(spec: SpecConfig) -> None:
    """Say which TokenSwift flags given (those off their defaults) another of them leaves unused (`--draft-mode fused`
    has no draft cache for --draft-kv-budget to size): taken, not refused, but said on stderr."""
    unused, _, why = unused_spec_fields(spec, changed_spec_fields(spec))
    if unused:
        flags = ", ".join(map(flag_name, unused))
        print(f"longswift: note: {flags} {'sets' if len(unused) == 1 else 'set'} nothing here: {why}", file=sys.stderr)
