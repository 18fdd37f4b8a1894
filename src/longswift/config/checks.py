"""What every config shares: its fields' types checked, its checks' messages in the API's words and the
command line's, seeds, and how a field is spelled as a flag."""

from __future__ import annotations

import dataclasses
import functools
import numbers
import re
import types
import typing
from typing import Any

from ..errors import ConfigError, ConfigTypeError, LongswiftError

# Seeds torch.Generator.manual_seed takes (it reads a negative seed as seed + 2^64). Seeds derived
# from a user's seed (distill's per batch, training's per epoch) go through torch_seed, so they wrap
# the same way instead of overflowing at the edges of the range.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def seed_problem(seed: int | None, flag: str = "--seed") -> str | None:
    """Why `seed` cannot seed a generator, in a line naming `flag`; None when it can."""
    if seed is None or SEED_MIN <= seed <= SEED_MAX:
        return None
    return f"{flag} must be between {SEED_MIN} and {SEED_MAX}; got {seed}"


def torch_seed(value: int) -> int:
    """A derived seed as manual_seed reads it: the same generator as `value` for every value it takes."""
    return value % 2**64


def flag_name(field: str) -> str:
    """A config field as the command line spells it (max_new_tokens -> --max-new-tokens)."""
    return "--" + field.replace("_", "-")


def flag_help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


_EXPECTED = {int: (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "a whole number"),
             float: (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
             str: (lambda v: isinstance(v, str), "a string"), bool: (lambda v: isinstance(v, bool), "True or False")}


def check_types(config: Any) -> None:
    """Refuse a field value of the wrong type (SamplingConfig(seed='abc'), max_new_tokens=2.5) with
    a message that says what was expected, before any check compares or computes with it. A number
    of another numeric type (numpy.int64(5), numpy.float32(0.7)) is stored as the Python int or float
    it stands for: torch.Generator.manual_seed and the checkpoint's JSON take no other."""
    cls = type(config)
    for name, kind in typing.get_type_hints(cls).items():
        value = getattr(config, name)
        union = typing.get_origin(kind) in (typing.Union, types.UnionType)  # (dict[str, float]'s args are no union)
        options = [t for t in typing.get_args(kind) if t is not type(None)] if union else [kind]
        optional = union and type(None) in typing.get_args(kind)
        if optional and value is None:
            continue
        matched = next((t for t in options if t in _EXPECTED and _EXPECTED[t][0](value)), None)
        if matched is not None:
            if matched in (int, float) and type(value) not in (int, float):
                setattr(config, name, int(value) if matched is int else float(value))
            continue
        if not all(t in _EXPECTED for t in options):
            continue
        expected = " or ".join([_EXPECTED[t][1] for t in options] + (["None"] if optional else []))
        got = f"got {value!r} ({type(value).__name__})"
        raise ConfigTypeError(f"{cls.__name__}.{name} must be {expected}; {got}",
                              f"{flag_name(name)} must be {expected}; {got}")


def validated(post_init: Any) -> Any:
    """Wrap a config's __post_init__: types are checked first; its checks' messages, written with
    flags (--top-k), are raised naming the API field (SamplingConfig.top_k) and keep the flag form
    as `cli_message` for the command line."""

    @functools.wraps(post_init)
    def wrapper(self: Any) -> None:
        check_types(self)
        try:
            post_init(self)
        except ConfigError:
            raise
        except LongswiftError as exc:
            names = {f.name for f in dataclasses.fields(self)}

            def api(m: re.Match) -> str:
                name = m.group(1).replace("-", "_")
                return f"{type(self).__name__}.{name}" if name in names else m.group(0)

            raise ConfigError(re.sub(r"--([a-z][a-z0-9-]*)", api, str(exc)), str(exc)) from None

    return wrapper
