"""`longswift export-heads`: write draft heads in TokenSwift's released layout (an HF model directory
with the heads inside, `model.medusa_layers.*`) or as a longswift heads file, so the two tools share heads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..atomic import OutputLock, check_new_dir, check_writable
from ..config import RuntimeConfig
from ..errors import LongswiftError, refuse_non_utf8
from .flags import (DECODING_ONLY, HEADS_HELP, add_config_flags, check_heads_flag, config_from_args, given_path,
                    heads_value, model_inputs)
from .outputs import note_stale

FORMATS = ("tokenswift", "longswift")


# What a file's name ends in, not a directory's: --format tokenswift made a directory "heads.safetensors".
FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".txt")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export-heads", help="write draft heads as a TokenSwift checkpoint directory or a heads file")
    p.add_argument("--model", help="the base model: a .gguf file, an HF directory or a hub id (default: embedded model)")
    p.add_argument("--heads", type=heads_value, default="auto",
                   help=f"the heads to export (default: auto): {HEADS_HELP}; 'random' (seeded and untrained: a file "
                        "for testing)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="tokenswift: an HF directory (config.json with medusa_heads, model.safetensors holding base "
                        "model and heads, tokenizer), as TokenSwift's released checkpoints; longswift: one heads "
                        ".safetensors file with base-model identity and its training record (default: longswift "
                        "for an --out ending in .safetensors, else tokenswift)")
    p.add_argument("--out", type=given_path, required=True, metavar="DIR|FILE",
                   help="a new (or empty) directory for --format tokenswift; a .safetensors file for longswift")
    add_config_flags(p, RuntimeConfig, skip=DECODING_ONLY, overrides={"pack_weights": (
        None, "run CPU linears on oneDNN-packed weight copies; off unless given: an export writes the state dict's "
              "weights, which packed copies would only add to")})


def cmd_export_heads(args: argparse.Namespace) -> int:
    from ..atomic import check_distinct
    from ..engine import load
    from ..runtime.loading import load_config
    from ..spec.heads import load_heads, save_heads, training_record
    from ..spec.released import (check_exportable, export_tokenswift, released_heads_as_stored,
                                 released_training_record)

    runtime = config_from_args(RuntimeConfig, args)
    check_heads_flag(args.heads, None)  # a heads file that is not there: said before loading
    refuse_non_utf8(args.out, "--out")  # (either format writes safetensors)
    if args.format is None:
        args.format = "longswift" if args.out.suffix.lower() == ".safetensors" else "tokenswift"
    if args.format == "tokenswift":  # before loading: a bad --out costs a second, not a load
        if args.out.suffix.lower() in FILE_SUFFIXES:
            raise LongswiftError(f"--format tokenswift writes a directory, and --out '{args.out}' names a file: give a "
                                 "directory name"
                                 + (", or drop --format for one heads file"
                                    if args.out.suffix.lower() == ".safetensors" else ""))
        check_new_dir(args.out)
        check_exportable(load_config(args.model, runtime.rope_scaling))
    elif args.out.suffix.lower() != ".safetensors":
        raise LongswiftError(f"--out '{args.out}' must end in .safetensors for --format longswift")
    else:
        check_writable(args.out)
        check_distinct([*model_inputs(args.model), ("--out", args.out)])  # never over the model
        _refuse_existing(args.out)  # heads files are hours of training: never replaced unasked, as train-heads' are not
    if runtime.pack_weights is None:
        runtime.pack_weights = False  # the exported weights are the state dict's; no packed copies needed
    engine = load(args.model, runtime, heads=args.heads)
    if engine.heads is None:
        raise LongswiftError("there are no draft heads to export for this model: pass --heads FILE_OR_DIR "
                             "(train some with `longswift train-heads`)")
    if engine.heads_file is not None:  # rewriting the file being exported would lose it if the write failed
        check_distinct([("--heads", engine.heads_file), ("--out", args.out)])
    # How the heads were made (train-heads' record), kept by either format and read from either
    training = (training_record(engine.heads_file) if engine.heads_file is not None
                else released_training_record(engine.heads_dir) if engine.heads_dir is not None else None)
    if args.format == "tokenswift":
        out = export_tokenswift(args.out, engine.cfg, engine.model.full_state(), engine.heads, engine.tokenizer,
                                engine.model.dtype, training, on_stale=note_stale)
        print(f"wrote {engine.heads_origin} with the base model to {out} "
              "(TokenSwift layout: model.medusa_layers.*)", file=sys.stderr)
    else:
        import torch

        heads = engine.heads
        if engine.model.dtype != torch.float32:
            # The engine holds them in the model's dtype (--dtype bfloat16 rounds them): a heads file or a released
            # directory exports its own values, read again at the precision it stores.
            if engine.heads_file is not None:
                heads = load_heads(engine.heads_file, engine.cfg, torch.empty(0), engine.fingerprint)
            elif engine.heads_dir is not None:
                heads = released_heads_as_stored(engine.heads_dir, engine.cfg, engine.fingerprint)
        with OutputLock([("--out", args.out)], note_stale):  # (and a killed export's temporary file goes)
            _refuse_existing(args.out)  # (made while the model loaded: still not replaced)
            save_heads(heads, engine.cfg, engine.fingerprint, args.out,
                       {"exported_from": engine.heads_origin, **({"training": training} if training else {})})
        print(f"wrote {engine.heads_origin} to {args.out}", file=sys.stderr)
    return 0


def _refuse_existing(out: Path) -> None:
    if out.exists():
        raise LongswiftError(f"'{out}' exists: choose a new --out, or remove that file first to replace it")
