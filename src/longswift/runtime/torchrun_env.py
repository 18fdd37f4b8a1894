"""What torchrun tells a process through its environment (world size, rank), read without importing torch: the
command line's errors name a rank before anything heavy is imported."""

from __future__ import annotations

import os

from ..errors import LongswiftError


def _env_int(name: str, default: int, least: int) -> int:
    """A whole number torchrun sets in the environment, or a one-line error naming the variable."""
    text = os.environ.get(name, str(default))
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise LongswiftError(f"environment variable {name}='{text}' must be a whole number >= {least}: "
                             "unset it, or launch with torchrun, which sets it")
    return value


def env_world_size() -> int:
    """The world size torchrun gave this process (1 outside torchrun)."""
    return _env_int("WORLD_SIZE", 1, 1)


def env_rank() -> int:
    """This process's rank under torchrun (WORLD_SIZE above 1); 0 for a single process, whatever RANK says: a
    RANK that another launcher set for its own job made a plain run a "rank 1" that took no output lock,
    wrote over another run's --output, and hid its notes."""
    return _env_int("RANK", 0, 0) if env_world_size() > 1 else 0


def env_local_rank() -> int:
    """This process's rank on its machine, which torchrun sets (its GPU: cuda:LOCAL_RANK); 0 if unset."""
    return _env_int("LOCAL_RANK", 0, 0)
