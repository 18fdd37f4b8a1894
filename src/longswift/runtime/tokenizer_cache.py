"""A GGUF's tokenizer, converted once and then read from disk.

transformers builds a fast tokenizer from a GGUF's vocabulary metadata by parsing the whole file
again and converting every token and merge: 4.4 s of each run on the embedded model (the model
itself loads in less). The converted tokenizer is saved with `save_pretrained` under the cache
directory and loaded from there (0.1 s) by every later run on a file with the same metadata.

- Key: SHA-256 of the file's metadata section (header, key-value pairs, tensor infos: everything
  before the tensor data), with the transformers and tokenizers versions, which decide the
  conversion. Copies and renames of a file share an entry; any edit to its vocabulary does not.
- Where: `$LONGSWIFT_CACHE_DIR/tokenizers/<key>`, by default `$XDG_CACHE_HOME/longswift` or
  `~/.cache/longswift`. An empty `LONGSWIFT_CACHE_DIR` turns the cache off.
- Entries are written to a temporary folder and renamed into place, so a reader never sees half
  of one. A cache that cannot be written is skipped; an entry that cannot be read is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import LongswiftError

FORMAT = 1  # bump when what an entry holds changes
MARKER = "longswift-tokenizer.json"


def cache_root() -> Path | None:
    """The cache directory, or None when `LONGSWIFT_CACHE_DIR` is set empty (cache off)."""
    env = os.environ.get("LONGSWIFT_CACHE_DIR")
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "longswift"


def metadata_key(reader: Any) -> str:
    """What identifies a GGUF's tokenizer: its metadata bytes and the converting libraries' versions."""
    import tokenizers
    import transformers

    digest = hashlib.sha256(f"{FORMAT}|{transformers.__version__}|{tokenizers.__version__}|".encode())
    digest.update(memoryview(reader.data[: reader.data_offset]))  # [data_offset] uint8 view of the memmap
    return digest.hexdigest()[:32]


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
    tokenizer = _convert(path)
    if entry is not None:
        _write(tokenizer, entry, replace=damaged)
    return tokenizer


def _convert(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise LongswiftError(f"cannot build a tokenizer from the GGUF metadata of '{path}': {exc}") from None


def _read(entry: Path) -> Any | None:
    """The entry's tokenizer, or None if it is damaged (then the caller converts and rewrites)."""
    from transformers import AutoTokenizer

    try:
        marker = json.loads((entry / MARKER).read_text())
        tokenizer = AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
    except Exception:
        return None
    if marker.get("format") != FORMAT or marker.get("tokens") != len(tokenizer):
        return None
    return tokenizer


def _write(tokenizer: Any, entry: Path, replace: bool) -> None:
    """Save `tokenizer` as `entry`, whole or not at all, replacing a damaged one; never fails the load."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT, "tokens": len(tokenizer)}))
        if replace:  # _read refused it (a sound entry is never removed: a reader may be using it)
            shutil.rmtree(entry, ignore_errors=True)
        os.rename(tmp, entry)  # fails if another process renamed its copy first: theirs stays
        tmp = None
    except Exception:  # read-only home, full disk, a race: the next run converts again
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
