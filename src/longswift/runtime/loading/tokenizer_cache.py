"""A GGUF's tokenizer, converted once and then read from disk.

transformers builds a fast tokenizer from a GGUF's vocabulary metadata by parsing the whole file
again and converting every token and merge: 4.4 s of each run on the embedded model (the model
itself loads in less). The converted tokenizer is saved with `save_pretrained` under the cache
directory and loaded from there (0.1 s) by every later run on a file with the same metadata.

- Key: SHA-256 of the file's metadata section (header, key-value pairs, tensor infos: everything
  before the tensor data), with the transformers, tokenizers and gguf versions, which decide the
  conversion. Copies and renames of a file share an entry; any edit to its vocabulary does not.
- Where: `$LONGSWIFT_CACHE_DIR/tokenizers/<key>`, by default `$XDG_CACHE_HOME/longswift` or
  `~/.cache/longswift`. An empty `LONGSWIFT_CACHE_DIR` turns the cache off.
- Entries are written to a temporary folder and renamed into place, so a reader never sees half
  of one; a marker lists its files with their sizes and SHA-256 digests. A cache that cannot be written
  is skipped; an entry that cannot be read, or whose files are not those listed (an edit that kept a file's
  size swapped two tokens' ids unseen before format 2), is rebuilt, and so is a file where an entry belongs. Entries of other
  library versions are not removed (about 3.5 MB each for the embedded model).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ...errors import LongswiftError, reason_of
from .hub import quiet_transformers

FORMAT = 2  # bump when what an entry holds changes (2: each file's digest in the marker)
MARKER = "longswift-tokenizer.json"


def cache_root() -> Path | None:
    """The cache directory, or None when `LONGSWIFT_CACHE_DIR` is set empty (cache off)."""
    env = os.environ.get("LONGSWIFT_CACHE_DIR")
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "longswift"


def metadata_key(reader: Any) -> str:
    """What identifies a GGUF's tokenizer: its metadata bytes and the converting libraries' versions."""
    digest = hashlib.sha256(f"{FORMAT}|{_versions()}|".encode())
    digest.update(memoryview(reader.data[: reader.data_offset]))  # [data_offset] uint8 view of the memmap
    return digest.hexdigest()[:32]


def _versions() -> str:
    from importlib import metadata

    return "|".join(f"{name} {metadata.version(name)}" for name in ("transformers", "tokenizers", "gguf"))


def gguf_tokenizer(path: Path, reader: Any) -> Any:
    """The tokenizer that transformers builds from the GGUF at `path` (`reader` is its parsed
    header), from the cache when an entry for its metadata is there."""
    root = cache_root()
    entry = root / "tokenizers" / metadata_key(reader) if root is not None else None
    damaged = False
    if entry is not None and entry.is_dir():
        cached = _read(entry)
        if cached is not None:
            return cached
        damaged = True
    elif entry is not None and entry.exists():  # a file where the entry belongs: never repaired, converted each run
        damaged = True
    tokenizer = _convert(path)
    if entry is not None:
        _write(tokenizer, entry, replace=damaged)
    return tokenizer


def _convert(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except KeyError as exc:  # transformers reads the metadata's fields by name
        raise LongswiftError(f"cannot build a tokenizer from the GGUF metadata of '{path}': it lacks the field "
                             f"{exc}; the file is damaged or was converted without its tokenizer's parts") from None
    except Exception as exc:
        raise LongswiftError(f"cannot build a tokenizer from the GGUF metadata of '{path}': {reason_of(exc)}") from None


def _read(entry: Path) -> Any | None:
    """The entry's tokenizer, or None if it is damaged: a file the marker lists is missing, of another size or
    another digest, or what loads has another vocabulary size (then the caller converts and rewrites)."""
    from transformers import AutoTokenizer

    try:
        marker = json.loads((entry / MARKER).read_text())
        if marker.get("format") != FORMAT:
            return None
        for name, (size, digest) in marker["files"].items():
            if (entry / name).stat().st_size != size or _digest(entry / name) != digest:
                return None
        tokenizer = AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
    except Exception:
        return None
    return tokenizer if marker.get("tokens") == len(tokenizer) else None


def _write(tokenizer: Any, entry: Path, replace: bool) -> None:
    """Save `tokenizer` as `entry`, whole or not at all, replacing a damaged one; never fails the load."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _sweep(entry.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would shut other users of a shared cache out
        tokenizer.save_pretrained(str(tmp))
        files = {p.name: (p.stat().st_size, _digest(p)) for p in tmp.iterdir()}
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT, "tokens": len(tokenizer), "files": files}))
        if replace and not entry.is_dir():  # a file in the entry's place
            entry.unlink(missing_ok=True)
        elif replace and _read(entry) is None:  # still damaged: no other process has repaired it meanwhile
            aside = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
            os.replace(entry, aside)  # out of the way in one step; removed below with the other leftovers
            shutil.rmtree(aside, ignore_errors=True)
        os.rename(tmp, entry)  # fails if another process renamed its copy first: theirs stays
        tmp = None
    except Exception:  # read-only home, full disk, a race: the next run converts again
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _digest(path: Path) -> str:
    """SHA-256 of a cache file (about 10 ms for the embedded model's 3.5 MB tokenizer)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sweep(folder: Path, older_than_s: float = 3600.0) -> None:
    """Remove temporary folders that a process killed while writing left behind (an hour old)."""
    now = time.time()
    for leftover in folder.glob(".*.*"):
        try:
            if leftover.is_dir() and now - leftover.stat().st_mtime > older_than_s:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass
