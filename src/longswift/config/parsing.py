"""Settings written as text (comma lists, --tree, --rope-scaling) and the names --dtype and --heads take."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import LongswiftError

if TYPE_CHECKING:  # (torch is imported where it is used: the command line parses its flags without it)
    import torch

ROPE_SCALINGS = ("yarn", "linear", "dynamic")
MAX_ROPE_FACTOR = 1024  # far past any published extension; larger factors overflow the context arithmetic


def parse_number_list(text: str, flag: str, kind: type = int) -> tuple:
    """A comma list of numbers from the command line ('2048,4096' -> (2048, 4096)); a one-line
    error names the flag when an item is not a number of `kind`, is empty ('64,,128': a number
    left out, as --tree refuses it) or the list is."""
    items = [v.strip() for v in text.split(",")]
    what = "whole numbers" if kind is int else "numbers"
    if not any(items):
        raise LongswiftError(f"{flag} is empty")
    if not all(items):
        raise LongswiftError(f"{flag} has an empty item (a number left out?): give comma-separated {what}, "
                             f"e.g. 2048,4096; got '{text}'")
    try:
        return tuple(kind(v) for v in items)
    except ValueError:
        raise LongswiftError(f"{flag} takes comma-separated {what}, e.g. 2048,4096; got '{text}'") from None


def parse_rope_scaling(text: str) -> tuple[str, float]:
    """'yarn:4' -> ('yarn', 4.0); a one-line error for anything else."""
    kind, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if kind not in ROPE_SCALINGS or not 1 < value <= MAX_ROPE_FACTOR:  # also refuses nan
        raise LongswiftError(f"--rope-scaling must be TYPE:FACTOR with TYPE one of {', '.join(ROPE_SCALINGS)} "
                             f"and FACTOR in (1, {MAX_ROPE_FACTOR}] (e.g. yarn:4); got '{text}'")
    return kind, value


def same_rope_scaling(a: Any, b: Any) -> bool:
    """Whether two rope-scaling settings (None: none) are one, as 'yarn:2' and 'yarn:2.0' are; a setting that does
    not parse (a record edited by hand) is compared as written."""
    def parsed(setting: Any) -> Any:
        try:
            return None if setting is None else parse_rope_scaling(setting)
        except (LongswiftError, TypeError, AttributeError):
            return setting

    return parsed(a) == parsed(b)


DTYPES = ("float32", "bfloat16", "float16", "float64")  # the names of torch's dtypes --dtype takes


# What --heads and heads= take besides a heads file, a directory or a hub id (Engine.set_heads).
HEADS_WORDS = ("auto", "default", "random", "none")


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16', the name --dtype and the reports use."""
    return str(dtype).removeprefix("torch.")


def parse_tree(spec: str) -> tuple[int, ...]:
    """'1,3,3,3' -> (1, 3, 3, 3): the number of candidates taken at each depth."""
    try:
        ks = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise LongswiftError(f"--tree must be comma-separated positive integers like 1,3,3,3; got '{spec}'") from None
    if not ks or any(k <= 0 for k in ks):
        raise LongswiftError(f"--tree must be comma-separated positive integers like 1,3,3,3; got '{spec}'")
    return ks
