"""Hugging Face model ids (`org/name[@revision]`) -> a local snapshot directory, through
huggingface_hub and its standard cache (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import LongswiftError

# What a model directory needs: config, safetensors weights (and their index), tokenizer files.
# Not *.bin / *.pt / *.gguf: longswift reads safetensors from HF directories.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.txt"]
# Mistral's repositories hold the model twice: transformers' shards and mistral-inference's consolidated file
# (14.5 GB more for Mistral-7B), which neither transformers nor longswift reads.
IGNORE_PATTERNS = ["consolidated*.safetensors"]

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")
_TRUE = {"1", "ON", "YES", "TRUE"}


def parse_hub_id(source: str) -> tuple[str, str | None] | None:
    """(repo_id, revision) if `source` reads as `org/name[@revision]`, else None."""
    m = _HUB_ID.match(source)
    if m is None or source.endswith((".gguf", ".safetensors")):
        return None
    return m["repo"], m["rev"]


def _env_true(*names: str) -> bool:
    return any(os.environ.get(n, "").strip().upper() in _TRUE for n in names)


def hub_cache_dir() -> str:
    """The hub cache as the environment says now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return constants.HF_HUB_CACHE


def hub_offline() -> bool:
    from huggingface_hub import constants

    if "HF_HUB_OFFLINE" in os.environ or "TRANSFORMERS_OFFLINE" in os.environ:
        return _env_true("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return bool(constants.HF_HUB_OFFLINE)


def download_command(repo_id: str, revision: str | None) -> str:
    """The command that puts a repository's snapshot in the cache, as the messages quote it."""
    return f"`hf download {repo_id}" + (f" --revision {revision}`" if revision else "`")


def resolve_hub_id(source: str, what: str = "model") -> Path:
    """The snapshot directory of `org/name[@revision]`: from the cache when offline (no network call),
    else downloaded (or updated) as transformers would. Refused in one line when it cannot be had;
    where `org` is a local folder, the refusal says first that the local path does not exist (a typo
    in `runs/heads` is likelier than a Hub id). `what` names the thing sought ("model", "heads")."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    parsed = parse_hub_id(source)
    assert parsed is not None
    repo_id, revision = parsed
    offline = hub_offline()
    cache = hub_cache_dir()
    get = download_command(repo_id, revision)
    folder = Path(source).expanduser().parent
    if folder.is_dir():
        local = f"'{source}' does not exist (folder '{folder}' has no '{Path(source).name}'), and as a Hugging Face id "
    else:
        local = ""
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
                                 allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        kind = "gated (log in with `hf auth login` and accept its terms)" if isinstance(exc, GatedRepoError) \
            else "not found on the Hugging Face Hub (or private)"
        if local:
            raise LongswiftError(f"{local}it is {kind}: check the path") from None
        raise LongswiftError(f"{what} '{repo_id}' is {kind}; pass a local .gguf file or model directory") from None
    except RevisionNotFoundError:
        raise LongswiftError(f"model '{repo_id}' has no revision '{revision}'") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        if local:
            raise LongswiftError(f"{local}it is not in the Hugging Face cache and {why}: check the path") from None
        raise LongswiftError(f"{what} '{source}' is no local path, and not in the Hugging Face cache ({cache}) and "
                             f"{why}: get it with {get} (online), or check the path") from None
    except (HFValidationError, ValueError) as exc:
        raise LongswiftError(f"'{source}' is neither a local path nor a valid Hugging Face model id "
                             f"({str(exc).splitlines()[0]})") from None
    except (HfHubHTTPError, OSError) as exc:
        raise LongswiftError(f"cannot download '{repo_id}': {str(exc).splitlines()[0]}; retry, or get it with "
                             f"{get}") from None
    return Path(path)


def check_model_snapshot(path: Path, source: str) -> None:
    """A model's snapshot in the Hugging Face cache (resolve_hub_id) has its config.json and safetensors
    weights. The cache keeps each file that finished downloading, so a snapshot without them is most likely
    an interrupted download, which the checks of a local directory would call a folder that is not a model."""
    missing = [what for what, there in (("config.json", (path / "config.json").is_file()),
                                        (".safetensors weights", any(path.glob("*.safetensors")))) if not there]
    if missing:
        repo_id, revision = parse_hub_id(source) or (source, None)
        raise LongswiftError(f"the Hugging Face cache's snapshot of '{source}' ({path}) has no "
                             f"{' and no '.join(missing)}: an interrupted download? get it again with "
                             f"{download_command(repo_id, revision)} (online); longswift reads config.json and "
                             "safetensors, so a repository without them cannot be loaded")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings held back (errors still show) while it reads a config or tokenizer that
    longswift checks itself: a config it refuses came with warning lines above the one-line error."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
