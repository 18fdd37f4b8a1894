"""The block types longswift dequantizes in torch (Q8_0, Q4_0, Q4_1) give the gguf package's float32 values,
bit for bit: those are the weights transformers' GGUF loader computes with."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from longswift.errors import LongswiftError  # noqa: E402
from longswift.runtime.gguf import _TORCH_TYPES, gguf_dequantize  # noqa: E402

BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def random_blocks(kind: str, blocks: int, seed: int, finite: bool) -> np.ndarray:
    """[blocks * bytes] uint8 of random blocks. Random scale bytes include float16 infinities, NaNs and
    subnormals; `finite` redraws the scales from ordinary numbers instead."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(blocks, BLOCK_BYTES[kind]), dtype=np.uint8)
    if finite:
        scales = 2 if kind == "Q4_1" else 1
        values = rng.normal(0, 0.05, size=(blocks, scales)).astype(np.float16)
        data[:, : 2 * scales] = values.view(np.uint8).reshape(blocks, 2 * scales)
    return data.reshape(-1)


@pytest.mark.parametrize("finite", [True, False], ids=["finite", "any-bytes"])
@pytest.mark.parametrize("kind", sorted(_TORCH_TYPES))
def test_torch_dequantizing_gives_the_gguf_packages_values(kind, finite):
    data = random_blocks(kind, 4099, seed=len(kind) + finite, finite=finite)
    qtype = gguf.GGMLQuantizationType[kind]
    expected = gguf.quants.dequantize(data, qtype).reshape(-1)
    ours = _TORCH_TYPES[kind](data).numpy().reshape(-1)
    assert ours.dtype == expected.dtype == np.float32 and ours.shape == expected.shape == (4099 * 32,)
    assert np.array_equal(ours, expected, equal_nan=True)
    if finite:
        assert np.isfinite(ours).all() and ours.std() > 0


def test_the_torch_types_do_not_go_through_the_gguf_package(monkeypatch):
    """Else the test above compares the package with itself wherever longswift loads a file."""
    def refuse(data, qtype):
        raise AssertionError("dequantized by the gguf package")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    for kind in _TORCH_TYPES:
        data = random_blocks(kind, 3, seed=1, finite=True).reshape(3, -1)  # as the reader gives it: [rows, bytes]
        tensor = SimpleNamespace(name="w", tensor_type=gguf.GGMLQuantizationType[kind], data=data)
        assert gguf_dequantize(tensor).shape == (96,)


def test_a_block_cut_short_is_one_line():
    tensor = SimpleNamespace(name="blk.0.ffn_up.weight", tensor_type=gguf.GGMLQuantizationType.Q4_1,
                             data=np.zeros(30, dtype=np.uint8))
    with pytest.raises(LongswiftError, match="cannot dequantize GGUF tensor 'blk.0.ffn_up.weight': ") as info:
        gguf_dequantize(tensor)
    assert "\n" not in str(info.value)
