"""Damaged files, for every loader (GGUF, safetensors model directory, heads, checkpoint):
a truncated file is always refused with a one-line LongswiftError; a file with flipped bytes is
either refused that way or (where the damage hits raw weight bytes, which these formats do not
checksum) loads — it never escapes as another exception or a traceback."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import run_cli, tiny_hf_model
from test_loading import write_gguf

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig
from longswift.checkpoint import read_checkpoint


def cuts(size: int, text: bool) -> list[int]:
    """Truncation lengths; a text file keeps at least all but its last two bytes (a lost final
    newline is no damage)."""
    return sorted({0, 1, 7, 8, 24, size // 10, size // 3, size // 2, size - 100, size - (3 if text else 1)})


def flips(size: int) -> list[int]:
    """Offsets to damage: dense in the first kilobyte (headers, metadata), sparse after."""
    return sorted({*range(0, min(size, 1024), 37), *range(1024, size, max(1, size // 12))})


def refused(load, what: str) -> None:
    try:
        load()
    except LongswiftError as exc:
        assert "\n" not in str(exc) and str(exc), exc
        return
    except Exception as exc:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{what}: {type(exc).__name__} escaped: {exc}") from None
    raise AssertionError(f"{what}: damaged file loaded without an error")


def refused_or_loaded(load, what: str) -> None:
    try:
        load()
    except LongswiftError as exc:
        assert "\n" not in str(exc) and str(exc), exc
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{what}: {type(exc).__name__} escaped: {exc}") from None


def damage(tmp_path, good: bytes, name: str, text: bool = False):
    """Yield (description, path, must be refused) for every truncation and byte flip of `good`."""
    path = tmp_path / name
    for n in cuts(len(good), text):
        path.write_bytes(good[:n])
        yield f"truncated to {n} bytes", path, True
    for offset in flips(len(good)):
        b = bytearray(good)
        b[offset] ^= 0xFF
        path.write_bytes(bytes(b))
        yield f"byte {offset} flipped", path, False


def test_damaged_gguf(tmp_path):
    src = tmp_path / "good.gguf"
    write_gguf(src, tiny_hf_model("llama", seed=81), "llama")
    for what, path, must_fail in damage(tmp_path, src.read_bytes(), "bad.gguf"):
        check = refused if must_fail else refused_or_loaded
        check(lambda: longswift.load(str(path), dtype="float32"), what)


def test_a_missing_gguf_package_is_not_called_a_damaged_file(tmp_path, monkeypatch):
    """Without the gguf package (a bare GPU machine's Python) the error names the package, not the file."""
    from longswift.runtime.loading import gguf as ours

    path = tmp_path / "good.gguf"
    write_gguf(path, tiny_hf_model("llama", seed=81), "llama")
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(LongswiftError, match=r"needs the gguf package .*: pip install gguf$") as info:
        ours.open_gguf(path)
    assert "truncated" not in str(info.value)


def test_damaged_safetensors_directory(tmp_path):
    good_dir = tmp_path / "good"
    tiny_hf_model("llama", seed=82).save_pretrained(good_dir)
    bad_dir = tmp_path / "bad"
    shutil.copytree(good_dir, bad_dir)
    good = (good_dir / "model.safetensors").read_bytes()
    for what, _, must_fail in damage(bad_dir, good, "model.safetensors"):
        check = refused if must_fail else refused_or_loaded
        check(lambda: longswift.load(str(bad_dir), dtype="float32"), what)
    (bad_dir / "model.safetensors").write_bytes(good)
    config = (good_dir / "config.json").read_bytes()
    for what, _, must_fail in damage(bad_dir, config, "config.json", text=True):
        check = refused if must_fail else refused_or_loaded
        check(lambda: longswift.load(str(bad_dir), dtype="float32"), f"config.json {what}")


def test_damaged_heads_file(tmp_path):
    from longswift.spec.heads import save_heads

    engine = longswift.load(tiny_hf_model("llama", seed=83), dtype="float32", heads="random")
    src = tmp_path / "good.safetensors"
    save_heads(engine.heads, engine.cfg, engine.heads.base_fingerprint, src)
    for what, path, must_fail in damage(tmp_path, src.read_bytes(), "bad.safetensors"):
        check = refused if must_fail else refused_or_loaded
        check(lambda: engine.set_heads(str(path)), what)


@pytest.mark.parametrize("edit, match", [
    ("extra", "is damaged (unexpected extra): re-export"),
    ("missing", "is damaged (missing out_norms): re-export"),
    ("shape", "is damaged (its 'in_norms' tensor has shape [3, 10], not [3, 64]): re-export"),
    ("nan", "holds NaN or infinite values in 'weights'"),
    ("int32", "its 'weights' tensor holds torch.int32 values, where heads are float32, float16 or bfloat16"),  # loaded, truncated
])
def test_heads_file_with_wrong_tensors_names_them(tmp_path, capsys, edit, match):
    """A heads file whose metadata is intact but whose tensors are not DraftHeads' says which tensor is
    wrong (torch's first line alone, 'Error(s) in loading state_dict for DraftHeads:', says nothing); and
    `info` says what generate refuses, from the file's header (it said "made for this model" of each; NaN
    values are read by generate alone)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from longswift.spec.heads import save_heads

    engine = longswift.load(tiny_hf_model("llama", seed=83), dtype="float32", heads="random")
    src = tmp_path / "good.safetensors"
    save_heads(engine.heads, engine.cfg, engine.heads.base_fingerprint, src)
    with safe_open(str(src), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    if edit == "extra":
        tensors["extra"] = torch.zeros(2)
    elif edit == "missing":
        del tensors["out_norms"]
    elif edit == "nan":
        tensors["weights"][0, 0, 0] = float("nan")
    elif edit == "int32":
        tensors["weights"] = (tensors["weights"] * 100).to(torch.int32)
    else:
        tensors["in_norms"] = tensors["in_norms"][:, :10].contiguous()
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(LongswiftError) as err:
        engine.set_heads(str(tmp_path / "bad.safetensors"))
    assert "\n" not in str(err.value) and match in str(err.value), err.value
    model = tmp_path / "m"
    engine_hf = tiny_hf_model("llama", seed=83)
    engine_hf.save_pretrained(model)
    capsys.readouterr()
    code, out, err = run_cli(capsys, "info", "--model", str(model), "--heads", str(tmp_path / "bad.safetensors"))
    assert code == 0, err
    said = next(line for line in out.splitlines() if line.startswith("draft heads:"))
    if edit == "nan":
        assert "made for this model" in said, said
    else:
        assert match in said and said.endswith("generate refuses it"), said


def test_damaged_checkpoint(tmp_path):
    engine = longswift.load(tiny_hf_model("llama", seed=84, vocab=32), dtype="float32")
    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1),
                           generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    for _ in stream:
        if len(stream.token_ids) >= 8:
            break
    src = tmp_path / "good.json"
    stream.checkpoint().save(src)
    for what, path, _ in damage(tmp_path, src.read_bytes(), "bad.json", text=True):
        refused(lambda: engine.resume(read_checkpoint(path)), what)  # JSON + checksum: every damage is caught


@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_damaged_model_through_the_cli(tmp_path, capsys, kind):
    """The CLI turns the same refusals into one line and exit code 2."""
    from longswift.cli import main

    if kind == "gguf":
        path = tmp_path / "m.gguf"
        write_gguf(path, tiny_hf_model("llama", seed=85), "llama")
        path.write_bytes(path.read_bytes()[:-300])
    else:
        path = tmp_path / "m"
        tiny_hf_model("llama", seed=85).save_pretrained(path)
        f = path / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-300])
    capsys.readouterr()
    code = main(["generate", "--model", str(path), "--prompt", "hi", "--max-new-tokens", "4", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("longswift: error: "), err


def test_flipped_weights_really_change_the_model(tmp_path):
    """The flips the loaders cannot detect are real damage (so refusal is impossible, not skipped):
    a flipped weight byte loads and changes the logits."""
    good_dir = tmp_path / "good"
    tiny_hf_model("llama", seed=86).save_pretrained(good_dir)
    data = bytearray((good_dir / "model.safetensors").read_bytes())
    data[-5] ^= 0x40
    bad_dir = tmp_path / "bad"
    shutil.copytree(good_dir, bad_dir)
    (bad_dir / "model.safetensors").write_bytes(bytes(data))
    a = longswift.load(str(good_dir), dtype="float32").model.full_state()
    b = longswift.load(str(bad_dir), dtype="float32").model.full_state()
    assert any(not torch.equal(a[k], b[k]) for k in a)
