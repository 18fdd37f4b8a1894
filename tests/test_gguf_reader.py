"""longswift's GGUF reader gives what the gguf package's reader gives: every metadata field, every
tensor's entry and bytes, for the embedded model and for small files of every value type in both
byte orders; damaged headers raise rather than read past the file."""

from __future__ import annotations

import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from longswift.errors import LongswiftError  # noqa: E402
from longswift.runtime.loading.gguf import open_gguf  # noqa: E402
from longswift.runtime.loading.gguf_reader import GGUFHeader, StringArray  # noqa: E402
from longswift.runtime.loading import default_model_path  # noqa: E402


def assert_same_parse(ours: GGUFHeader, theirs) -> None:
    assert type(ours.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert ours.data_offset == theirs.data_offset and ours.alignment == theirs.alignment
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        value = ours.fields[key]
        expected = field.contents()
        assert (list(value) if isinstance(value, StringArray) else value) == expected, key
        assert type(value) is type(expected) or isinstance(value, StringArray), key
    assert [(t.name, t.tensor_type, list(t.shape), t.n_elements, t.n_bytes, t.data_offset) for t in ours.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), t.n_elements, t.n_bytes, t.data_offset) for t in theirs.tensors]
    for mine, t in zip(ours.tensors, theirs.tensors):
        assert mine.data.shape == t.data.shape and mine.data.dtype == t.data.dtype, t.name
        assert np.array_equal(mine.data, t.data, equal_nan=True), t.name


@pytest.mark.slow
def test_the_embedded_model_parses_as_the_gguf_package_parses_it():
    path = default_model_path()
    ours = open_gguf(path)
    tokens = ours.fields["tokenizer.ggml.tokens"]
    assert isinstance(tokens, StringArray) and tokens._decoded is None  # walked past, not decoded
    assert len(tokens) == 49152
    assert_same_parse(ours, gguf.GGUFReader(str(path)))


SCALARS = [("uint8", 200), ("int8", -100), ("uint16", 60000), ("int16", -30000), ("uint32", 4_000_000_000),
           ("int32", -2_000_000_000), ("uint64", 2**63 + 5), ("int64", -(2**62)), ("float32", 0.1),
           ("float64", 0.1), ("bool", True), ("string", "ünïcödé 東京")]
ARRAYS = {"ints": [1, -2, 3], "floats": [0.5, -1.25], "bools": [True, False], "strings": ["a", "", "🙂 b"],
          "nested": [[1, 2], [3]], "nested-strings": [["x", "yz"], ["w"]]}


def write_every_type(path, endian) -> None:
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for kind, value in SCALARS:
        getattr(w, f"add_{kind}")(f"t.{kind}", value)
    for name, values in ARRAYS.items():
        w.add_array(f"t.{name}", values)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.normal(size=(3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.normal(size=(2, 4, 8)).astype(np.float16))
    w.add_tensor("i32", np.arange(7, dtype=np.int32))
    blocks = rng.integers(0, 256, size=(4, 2 * 34), dtype=np.uint8)  # 4 rows of 64 Q8_0 values
    w.add_tensor("q8", blocks, raw_shape=(4, 68), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        write()


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG], ids=["little", "big"])
def test_every_value_type_parses_as_the_gguf_package_parses_it(tmp_path, endian):
    path = tmp_path / "t.gguf"
    write_every_type(path, endian)
    ours = GGUFHeader(path)
    assert ours.order == ("<" if endian == gguf.GGUFEndian.LITTLE else ">")
    assert ours.fields["t.strings"][2] == "🙂 b" and ours.fields["t.uint64"] == 2**63 + 5
    assert ours.fields["t.nested"] == [1, 2, 3] and ours.fields["t.nested-strings"] == ["x", "yz", "w"]  # flattened
    assert [t.name for t in ours.tensors] == ["f32", "f16", "i32", "q8"] and ours.tensors[3].data.shape == (4, 68)
    assert_same_parse(ours, gguf.GGUFReader(str(path)))


def test_a_header_cut_anywhere_is_refused_in_one_line(tmp_path):
    """Cut inside the string array, the tensor table or a tensor's bytes: an error, never a read past the end."""
    good = tmp_path / "t.gguf"
    write_every_type(good, gguf.GGUFEndian.LITTLE)
    raw = good.read_bytes()
    header = GGUFHeader(good)
    last = header.tensors[-1].data_offset + header.tensors[-1].n_bytes  # (the file pads past it)
    cut = tmp_path / "cut.gguf"
    for end in sorted({10, 30, raw.index(b"t.strings") + 20, raw.index(b"f16") + 2, header.data_offset - 1,
                       header.data_offset + 10, last - 1}):
        cut.write_bytes(raw[:end])
        with pytest.raises((ValueError, struct.error)):
            GGUFHeader(cut)
        with pytest.raises(LongswiftError) as info:
            open_gguf(cut)
        assert "\n" not in str(info.value) and "ends early or is damaged" in str(info.value), end


def test_a_string_arrays_length_past_the_file_is_refused(tmp_path):
    good = tmp_path / "t.gguf"
    write_every_type(good, gguf.GGUFEndian.LITTLE)
    raw = bytearray(good.read_bytes())
    at = raw.index(b"\x03\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00a")  # count 3, then "a"
    raw[at + 8: at + 16] = (2**40).to_bytes(8, "little")  # the first string's length
    (tmp_path / "bad.gguf").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="t.strings's strings run past the end of the file"):
        GGUFHeader(tmp_path / "bad.gguf")


def raw_gguf(entries: list[bytes], tensors: int = 0, tail: int = 0) -> bytes:
    """A little-endian GGUF v3 of metadata entries built by hand (GGUFWriter skips empty arrays), no tensor
    entries however many `tensors` says, and `tail` zero bytes after."""
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(entries)) + b"".join(entries) + bytes(tail)


def entry(key: str, value_type: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", value_type) + payload


def test_empty_arrays_parse_as_the_gguf_package_parses_them(tmp_path):
    path = tmp_path / "e.gguf"
    path.write_bytes(raw_gguf([entry("a", 9, struct.pack("<IQ", 4, 0)), entry("b", 9, struct.pack("<IQ", 8, 0)),
                               entry("c", 9, struct.pack("<IQ", 9, 0))]))
    ours = GGUFHeader(path)
    assert ours.fields["a"] == [] and list(ours.fields["b"]) == [] and ours.fields["c"] == []
    assert_same_parse(ours, gguf.GGUFReader(str(path)))


@pytest.mark.parametrize("build", [
    lambda: b"GGUF" + struct.pack("<IQQ", 3, 0, 2**62) + bytes(1 << 20),
    lambda: raw_gguf([], tensors=2**40, tail=1 << 20),
    lambda: raw_gguf([entry("s", 9, struct.pack("<IQ", 8, 2**40))], tail=1 << 20),  # strings
    lambda: raw_gguf([entry("n", 9, struct.pack("<IQ", 9, 2**40))], tail=1 << 20),  # arrays of arrays
], ids=["metadata", "tensors", "strings", "arrays"])
def test_a_damaged_count_is_refused_before_walking_the_file(tmp_path, build):
    """A count no file could hold, over a tail of zeros: refused at once, not walked over the whole file (an
    array of 2^40 empty arrays would build a list as long as the file allows)."""
    path = tmp_path / "c.gguf"
    path.write_bytes(build())
    with pytest.raises(ValueError, match="cannot fit in the rest of the file"):
        GGUFHeader(path)


def test_a_string_array_reads_as_a_list_in_messages(tmp_path):
    path = tmp_path / "s.gguf"
    words = [f"w{i}" for i in range(20)]
    path.write_bytes(raw_gguf([entry("few", 9, struct.pack("<IQ", 8, 2) + b"".join(
        struct.pack("<Q", 1) + w.encode() for w in "ab")), entry("many", 9, struct.pack("<IQ", 8, 20) + b"".join(
            struct.pack("<Q", len(w)) + w.encode() for w in words))]))
    fields = GGUFHeader(path).fields
    assert repr(fields["few"]) == "['a', 'b']"
    assert repr(fields["many"]) == "['w0', 'w1', 'w2', 'w3', 'w4', 'w5', 'w6', 'w7', ... (20 strings)]"
