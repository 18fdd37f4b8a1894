"""Command-line flags built from the config dataclasses' fields, and configs built back from them."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any


def add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per dataclass field: `--field-name`, typed and documented from the field."""
    group = parser.add_argument_group(cls.__name__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        default_text = f" (default: {f.default})"
        if kind is bool or kind == (bool | None):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                               help=f.metadata["help"] + default_text)
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        group.add_argument(flag, dest=f.name, type=base, default=f.default, metavar=f.name.upper(),
                           help=f.metadata["help"] + default_text)


def config_from_args(cls: type, args: argparse.Namespace) -> Any:
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if "help" in f.metadata})
