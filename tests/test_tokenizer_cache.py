"""The tokenizer shortcut that makes loading fast: a tokenizer read from the cache behaves as the one
transformers converts from the file, whatever state the cache is in (the GGUF reader's own tests are
in test_gguf_reader.py)."""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest
import torch

from longswift.runtime.loading import tokenizer_cache
from longswift.runtime.loading.gguf import open_gguf
from longswift.runtime.loading import default_model_path, load_model
from longswift.runtime.loading.tokenizer_cache import MARKER, cache_root, gguf_tokenizer, metadata_key

pytestmark = pytest.mark.slow

TEXTS = [
    "Write a story about a lighthouse keeper.",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces, trailing tabs\t\t\nand ünïcödé: 東京, emoji 🙂, digits 1234567890",
    "def f(x):\n    return x ** 2  # code\n\n\n",
    "",
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a lighthouse?"},
        {"role": "assistant", "content": "A tower with a light."}, {"role": "user", "content": "Why?"}]


@pytest.fixture(scope="module")
def path():
    return default_model_path()


@pytest.fixture(scope="module")
def reader(path):
    return open_gguf(path)


@pytest.fixture(scope="module")
def converted(path):
    return tokenizer_cache._convert(path)


def assert_same_tokenizer(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    ids = list(range(len(theirs)))
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids", "chat_template"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    for text in TEXTS:
        assert ours(text).input_ids == theirs(text).input_ids, text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    rows = np.random.default_rng(0).integers(0, len(theirs), size=(8, 40)).tolist()
    rows.append(theirs.all_special_ids + theirs.encode(TEXTS[2]))
    for row in rows:
        for skip in (False, True):
            assert ours.decode(row, skip_special_tokens=skip) == theirs.decode(row, skip_special_tokens=skip)
    for prompt in (False, True):
        assert (ours.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=prompt)
                == theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=prompt))


def test_second_load_reads_the_cache_and_behaves_the_same(tmp_path, monkeypatch, path, reader, converted):
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path))
    first = gguf_tokenizer(path, reader)  # converts and writes the entry
    entry = tmp_path / "tokenizers" / metadata_key(reader)
    assert json.loads((entry / MARKER).read_text())["tokens"] == len(converted)
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary folder left behind

    def no_conversion(path):
        raise AssertionError("converted again although the cache holds this tokenizer")

    monkeypatch.setattr(tokenizer_cache, "_convert", no_conversion)
    second = gguf_tokenizer(path, reader)
    assert_same_tokenizer(first, converted)
    assert_same_tokenizer(second, converted)
    assert load_model(None, torch.float32, torch.device("cpu")).tokenizer.name_or_path == str(entry)  # the loader uses it


@pytest.fixture(scope="module")
def written_entry(tmp_path_factory, reader, converted):
    """A cache entry as a first load writes it (written once: each damage below starts from a copy)."""
    entry = tmp_path_factory.mktemp("cache") / "tokenizers" / metadata_key(reader)
    tokenizer_cache._write(converted, entry, replace=False)
    return entry


@pytest.mark.parametrize("damage", ["truncated json", "no marker", "a file missing", "marker of another vocabulary",
                                    "marker of another format", "two ids swapped", "template edited"])
def test_damaged_entry_is_rebuilt(tmp_path, monkeypatch, path, reader, converted, written_entry, damage):
    """(The rebuild's conversion is the module's one, `converted`: the second load's test above checks that a
    conversion written and read back behaves as transformers' own; each conversion took ~8 s here.)"""
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "tokenizers" / metadata_key(reader)
    shutil.copytree(written_entry, entry)
    assert tokenizer_cache._read(entry) is not None  # whole before the damage
    marker = json.loads((entry / MARKER).read_text())
    assert set(marker["files"]) >= {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    if damage == "truncated json":
        data = (entry / "tokenizer.json").read_bytes()
        (entry / "tokenizer.json").write_bytes(data[: len(data) // 2])
    elif damage == "no marker":
        (entry / MARKER).unlink()
    elif damage == "a file missing":
        (entry / "chat_template.jinja").unlink()  # would load, without its chat template
    elif damage == "marker of another vocabulary":
        (entry / MARKER).write_text(json.dumps(marker | {"tokens": 7}))
    elif damage == "two ids swapped":  # the file's size kept: it was served, and encoded to the wrong ids
        text = (entry / "tokenizer.json").read_text(encoding="utf-8")
        vocab = json.loads(text)["model"]["vocab"]
        one, two = vocab["Hello"], vocab["ĠHello"]  # (ids of as many digits: the size stays)
        assert len(str(one)) == len(str(two))
        text = text.replace(f'"Hello": {one}', "\0").replace(f'"ĠHello": {two}', f'"ĠHello": {one}')
        (entry / "tokenizer.json").write_text(text.replace("\0", f'"Hello": {two}'), encoding="utf-8")
        assert (entry / "tokenizer.json").stat().st_size == marker["files"]["tokenizer.json"][0]
    elif damage == "template edited":
        template = (entry / "chat_template.jinja").read_text()
        assert "SmolLM" in template
        (entry / "chat_template.jinja").write_text(template.replace("SmolLM", "EvilLM"))
    else:
        (entry / MARKER).write_text(json.dumps(marker | {"format": tokenizer_cache.FORMAT + 1}))
    assert tokenizer_cache._read(entry) is None
    calls = []
    monkeypatch.setattr(tokenizer_cache, "_convert", lambda p: calls.append(p) or converted)
    assert gguf_tokenizer(path, reader) is converted  # converted again, not served from the damaged entry
    assert calls == [path]
    assert_same_tokenizer(tokenizer_cache._read(entry), converted)  # rewritten whole
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # the damaged one is gone, no leftovers


def test_cache_that_cannot_be_written_or_is_off_still_loads(tmp_path, monkeypatch, path, reader, converted):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(blocker))
    assert_same_tokenizer(gguf_tokenizer(path, reader), converted)
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", "")
    assert cache_root() is None
    assert len(gguf_tokenizer(path, reader)) == len(converted)
    monkeypatch.delenv("LONGSWIFT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "longswift"


def test_key_follows_the_metadata_and_the_converting_libraries(tmp_path, monkeypatch, path, reader):
    copy = tmp_path / "renamed.gguf"
    shutil.copy(path, copy)
    assert metadata_key(open_gguf(copy)) == metadata_key(reader)  # copies share an entry
    edited = tmp_path / "edited.gguf"
    data = bytearray(path.read_bytes())
    at = data.index(b"<|im_end|>")  # inside the vocabulary
    data[at + 2 : at + 4] = b"IM"
    edited.write_bytes(bytes(data))
    assert metadata_key(open_gguf(edited)) != metadata_key(reader)
    key = metadata_key(reader)
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: real(name) + (".post9" if name == "transformers" else ""))
    assert metadata_key(reader) != key


def test_a_repair_keeps_an_entry_another_process_repaired_first(tmp_path, converted):
    entry = tmp_path / "tokenizers" / "4567"
    tokenizer_cache._write(converted, entry, replace=False)
    (entry / "theirs").write_text("a sound entry, renamed into place while we converted")
    tokenizer_cache._write(converted, entry, replace=True)  # we found it damaged before; it is sound now
    assert (entry / "theirs").exists() and tokenizer_cache._read(entry) is not None


def test_entries_are_readable_by_others_and_leftovers_are_swept(tmp_path, converted):
    entry = tmp_path / "tokenizers" / "89ab"
    entry.parent.mkdir(parents=True)
    old, recent = entry.parent / ".89ab.killed", entry.parent / ".89ab.writing"
    old.mkdir(), recent.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    tokenizer_cache._write(converted, entry, replace=False)
    assert entry.stat().st_mode & 0o055 == 0o055  # group and others may read and enter
    assert not old.exists() and recent.exists()  # another process may still be writing that one


def test_a_file_where_an_entry_belongs_is_replaced_by_the_entry(tmp_path, monkeypatch, path, reader, converted):
    """It was never repaired: each run converted the tokenizer again (6 s), without a word."""
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "tokenizers" / metadata_key(reader)
    entry.parent.mkdir(parents=True)
    entry.write_text("junk")
    assert_same_tokenizer(gguf_tokenizer(path, reader), converted)
    assert entry.is_dir()
    assert_same_tokenizer(tokenizer_cache._read(entry), converted)


def test_an_entry_another_process_wrote_meanwhile_stays(tmp_path, converted):
    entry = tmp_path / "tokenizers" / "0123"
    tokenizer_cache._write(converted, entry, replace=False)
    (entry / "theirs").write_text("written by the process that renamed first")
    tokenizer_cache._write(converted, entry, replace=False)  # our rename fails; nothing of theirs is removed
    assert (entry / "theirs").exists() and tokenizer_cache._read(entry) is not None
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]
