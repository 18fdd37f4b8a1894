"""Files that are either complete or absent: write to a temporary sibling, fsync, rename."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import LongswiftError


def check_writable(path: str | os.PathLike) -> Path:
    """Fail early (before a long run) if `path` cannot be created."""
    p = Path(path).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise LongswiftError(f"output path '{p}' is a directory: give a file name")
    if not parent.is_dir():
        raise LongswiftError(f"cannot write '{p}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        raise LongswiftError(f"cannot write '{p}': directory '{parent}' is not writable")
    return p


class AtomicFile:
    """A text file written as it goes to `<name>.partial` (so it can be followed with `tail -f`)
    and renamed over `<name>` only by `commit()`; `discard()` removes the partial file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = check_writable(path)
        self.tmp = self.path.with_name(self.path.name + ".partial")
        self.file: IO[str] = open(self.tmp, "w", encoding="utf-8")

    def write(self, text: str) -> None:
        self.file.write(text)
        self.file.flush()

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a whole text file atomically."""
    f = AtomicFile(path)
    try:
        f.write(text)
        f.commit()
    except BaseException:
        f.discard()
        raise


def append_atomic(path: str | os.PathLike, text: str) -> None:
    """Append to a text file by rewriting it atomically: readers see the old file or the new one."""
    path = Path(path)
    write_atomic(path, (path.read_text() if path.exists() else "") + text)


def replace_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Have `write` create a file at a temporary sibling path, fsync it and rename it over `path`
    (for writers that want a path, such as safetensors and torch.save); nothing is left on failure."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
