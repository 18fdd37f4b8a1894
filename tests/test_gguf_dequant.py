"""The block types longswift dequantizes in torch (runtime/gguf_quants.py) give the gguf package's float32
values, bit for bit: those are the weights transformers' GGUF loader computes with."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from longswift.errors import LongswiftError  # noqa: E402
from longswift.runtime.loading.gguf import gguf_dequantize  # noqa: E402
from longswift.runtime.loading.gguf_quants import DEQUANTIZE  # noqa: E402

# The float16 scales at the start of a block.
SCALE_BYTES = {"Q4_0": (0, 2), "Q4_1": (0, 4), "Q8_0": (0, 2), "Q4_K": (0, 4), "Q5_K": (0, 4), "Q6_K": (208, 210)}


def sizes(kind: str) -> tuple[int, int]:
    """(values, bytes) of one block."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]


def test_every_torch_type_is_tested():
    assert set(DEQUANTIZE) == set(SCALE_BYTES)


def random_blocks(kind: str, blocks: int, seed: int, finite: bool) -> np.ndarray:
    """[blocks * bytes] uint8 of random blocks. Random scale bytes include float16 infinities, NaNs and
    subnormals; `finite` redraws the float16 scales from ordinary numbers instead."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(blocks, sizes(kind)[1]), dtype=np.uint8)
    if finite:
        start, end = SCALE_BYTES[kind]
        values = rng.normal(0, 0.05, size=(blocks, (end - start) // 2)).astype(np.float16)
        data[:, start:end] = values.view(np.uint8).reshape(blocks, end - start)
    return data.reshape(-1)


@pytest.mark.parametrize("finite", [True, False], ids=["finite", "any-bytes"])
@pytest.mark.parametrize("kind", sorted(SCALE_BYTES))
def test_torch_dequantizing_gives_the_gguf_packages_values(kind, finite):
    blocks = 4099 if sizes(kind)[0] == 32 else 515
    data = random_blocks(kind, blocks, seed=len(kind) + finite, finite=finite)
    with np.errstate(all="ignore"):  # (gguf-py's products of infinities and NaNs)
        expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind]).reshape(-1)
    ours = DEQUANTIZE[kind](data).numpy().reshape(-1)
    assert ours.dtype == expected.dtype == np.float32 and ours.shape == expected.shape == (blocks * sizes(kind)[0],)
    assert np.array_equal(ours, expected, equal_nan=True)
    if finite:
        assert np.isfinite(ours).all() and ours.std() > 0


def test_the_torch_types_do_not_go_through_the_gguf_package(monkeypatch):
    """Else the test above compares the package with itself wherever longswift loads a file."""
    def refuse(data, qtype):
        raise AssertionError("dequantized by the gguf package")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    for kind in DEQUANTIZE:
        data = random_blocks(kind, 3, seed=1, finite=True).reshape(3, -1)  # as the reader gives it: [rows, bytes]
        tensor = SimpleNamespace(name="w", tensor_type=gguf.GGMLQuantizationType[kind], data=data)
        assert gguf_dequantize(tensor).shape == (3 * sizes(kind)[0],)


def test_a_block_cut_short_is_one_line():
    tensor = SimpleNamespace(name="blk.0.ffn_up.weight", tensor_type=gguf.GGMLQuantizationType.Q4_1,
                             data=np.zeros(30, dtype=np.uint8))
    with pytest.raises(LongswiftError, match="cannot dequantize GGUF tensor 'blk.0.ffn_up.weight': ") as info:
        gguf_dequantize(tensor)
    assert "\n" not in str(info.value)
