"""A GGUF file's metadata and tensor table, read in one pass over its header.

The gguf package's reader makes numpy views of every value it meets, two per string of an array:
0.7 s for the embedded model's 49K tokens and 49K merges, which no run of ours reads (the tokenizer
comes from its cache, or from transformers' own parse). This reader walks past a string array's
strings (20 ms) and decodes them only if they are asked for. It gives what the package's reader
gives (tests/test_gguf_reader.py compares every field and tensor with it; an array of arrays is
flattened, as the package's `contents()` flattens it), and keeps the package's type tables:
`GGMLQuantizationType`, `GGML_QUANT_SIZES`. A count in a damaged header is checked against the
bytes left before anything is walked or built for it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

MAGIC = b"GGUF"  # a GGUF file's first four bytes
SUPPORTED_VERSIONS = (2, 3)  # the gguf package's reader reads these; version 1 had 32-bit counts
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
_STRUCT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUFValueType
_NUMPY = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8", 11: "i8", 12: "f8"}
# Tensor types stored as numbers (the rest are blocks of bytes): GGMLQuantizationType name -> numpy dtype.
_PLAIN_TENSORS = {"F32": "f4", "F16": "f2", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4", "I64": "i8"}


class StringArray(Sequence[str]):
    """An array of strings in the file, decoded the first time one is read."""

    def __init__(self, raw: memoryview, start: int, count: int, order: str) -> None:
        self._raw, self._start, self._count, self._order = raw, start, count, order
        self._decoded: list[str] | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if self._decoded is None:
            unpack, raw, o, out = struct.Struct(self._order + "Q").unpack_from, self._raw, self._start, []
            for _ in range(self._count):
                (n,) = unpack(raw, o)
                out.append(str(raw[o + 8: o + 8 + n], encoding="utf-8"))
                o += 8 + n
            self._decoded = out
        return self._decoded[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self[:])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:  # as a list; a long one cut short (error messages quote values)
        shown = repr(self[:8])
        return shown if self._count <= 8 else f"{shown[:-1]}, ... ({self._count:,} strings)]"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's entry, as the gguf package's reader gives it: `shape` in ggml's order (innermost
    first), `data` a read-only view of the file in numpy's order (bytes of blocks for block types)."""
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class UnknownTensorType(ValueError):
    """A tensor type id the installed gguf package does not list: a newer quantization than it knows (llama.cpp
    adds types), or damage."""

    def __init__(self, name: str, raw_type: int) -> None:
        super().__init__(f"tensor {name} has type id {raw_type}, which gguf does not list")
        self.name, self.raw_type = name, raw_type


class GGUFHeader:
    """`fields`: every metadata key's value (numbers, strings, lists; a string array as StringArray),
    led by the header's GGUF.version, GGUF.tensor_count and GGUF.kv_count as in the gguf package;
    `tensors`, `alignment`, `data_offset`; `data`: the file's bytes ([size] uint8, a plain view of
    its read-only memory map, which it keeps alive)."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        self.data = np.memmap(path, mode="r").view(np.ndarray)
        self._raw = memoryview(self.data)  # type: ignore[arg-type]  # (numpy: ndarray.__buffer__ typed from 3.12 on)
        if bytes(self._raw[:4]) != MAGIC:
            raise ValueError("GGUF magic invalid")
        version = struct.unpack_from("<I", self._raw, 4)[0]
        self.order: Literal["<", ">"] = "<" if version & 0xFFFF else ">"  # a big-endian file's version reads as n << 16
        version = struct.unpack_from(self.order + "I", self._raw, 4)[0]
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"file appears to be GGUF version {version}, which this reader cannot handle")
        tensor_count, kv_count = struct.unpack_from(self.order + "QQ", self._raw, 8)
        self.fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": tensor_count,
                                       "GGUF.kv_count": kv_count}
        self._offset = 24
        # at least: a key's length, a type and a 1-byte value; a name's length, a dimension count, a type, an offset
        self._room(kv_count * 13 + tensor_count * 24, 1, "bytes of metadata and tensor entries")
        for _ in range(kv_count):
            key = self._string()
            if key in self.fields:
                raise ValueError(f"duplicate metadata key {key}")  # (not KeyError: its str() quotes the message)
            kind = self._unpack("I")
            self.fields[key] = self._value(kind, key)
        table = [self._tensor_info() for _ in range(tensor_count)]
        if len({name for name, *_ in table}) != len(table):
            raise ValueError("the file lists a tensor twice")
        self.alignment = self._alignment()
        self.data_offset = -(-self._offset // self.alignment) * self.alignment
        self.tensors = [self._tensor(*info, gguf) for info in table]
        self._check_layout()

    def _check_layout(self) -> None:
        """Each tensor's bytes start at a multiple of the alignment and overlap no other tensor's, as writers lay them
        out and llama.cpp's reader requires: a damaged or edited offset otherwise loads another tensor's bytes."""
        spans = sorted((t.data_offset, t.data_offset + t.n_bytes, t.name) for t in self.tensors)
        for start, _, name in spans:
            if (start - self.data_offset) % self.alignment:
                raise ValueError(f"tensor {name}'s data starts at offset {start - self.data_offset:,}, not a multiple "
                                 f"of the file's alignment ({self.alignment})")
        for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
            if start < end:
                raise ValueError(f"tensors {name} and {other} share bytes of the file")

    def _room(self, count: int, least: int, what: str) -> None:
        """Refuse `count` items of at least `least` bytes each where fewer bytes are left (a damaged count)."""
        if count * least > len(self._raw) - self._offset:
            raise ValueError(f"{count:,} {what} at offset {self._offset:,} cannot fit in the rest of the file")

    def _unpack(self, code: str) -> Any:
        (value,) = struct.unpack_from(self.order + code, self._raw, self._offset)
        self._offset += struct.calcsize(code)
        return value

    def _bytes(self, n: int) -> memoryview:
        if self._offset + n > len(self._raw):
            raise ValueError(f"a value of {n:,} bytes at offset {self._offset:,} runs past the end of the file")
        out = self._raw[self._offset: self._offset + n]
        self._offset += n
        return out

    def _string(self) -> str:
        return str(self._bytes(self._unpack("Q")), encoding="utf-8")

    def _value(self, kind: int, key: str) -> Any:
        if kind == STRING:
            return self._string()
        if kind in _STRUCT:
            return self._unpack(_STRUCT[kind])
        if kind != ARRAY:
            raise ValueError(f"metadata {key} has unknown value type {kind}")
        item, count = self._unpack("I"), self._unpack("Q")
        if item in _NUMPY:
            dtype = np.dtype(_NUMPY[item]).newbyteorder(self.order)
            return np.frombuffer(self._bytes(count * dtype.itemsize), dtype=dtype).tolist()
        if item == STRING:
            self._room(count, 8, f"strings of {key}")
            start, unpack, raw, o, end = self._offset, struct.Struct(self.order + "Q").unpack_from, self._raw, \
                self._offset, len(self._raw)
            for _ in range(count):  # walked past, not decoded (each string is at least its 8-byte length)
                o += 8 + unpack(raw, o)[0]
                if o > end:
                    raise ValueError(f"metadata {key}'s strings run past the end of the file")
            self._offset = o
            return StringArray(raw, start, count, self.order)
        self._room(count, 12 if item == ARRAY else 1, f"values of {key}")  # (an array: item type and count)
        flat: list[Any] = []  # an array of arrays: flattened, as gguf-py's contents() gives it
        for _ in range(count):
            inner = self._value(item, key)
            if isinstance(inner, Sequence) and not isinstance(inner, str):
                flat.extend(inner)
            else:
                flat.append(inner)
        return flat

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        dims = self._unpack("I")
        shape = struct.unpack_from(f"{self.order}{dims}Q", self._bytes(8 * dims))
        return name, tuple(shape), self._unpack("I"), self._unpack("Q")

    def _alignment(self) -> int:
        if "general.alignment" not in self.fields:
            return DEFAULT_ALIGNMENT
        value = self.fields["general.alignment"]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
            raise ValueError(f"general.alignment is {value!r}: must be a power of two")
        return value

    def _tensor(self, name: str, shape: tuple[int, ...], raw_type: int, offset: int, gguf: Any) -> GGUFTensor:
        try:
            kind = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            raise UnknownTensorType(name, raw_type) from None
        n_elements = math.prod(shape)
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        n_bytes = n_elements * block_bytes // block
        start = self.data_offset + offset
        if start + n_bytes > len(self.data):
            raise ValueError(f"tensor {name} ends past the end of the file")
        rows = tuple(reversed(shape))
        if kind.name in _PLAIN_TENSORS:
            data = self.data[start: start + n_bytes].view(np.dtype(_PLAIN_TENSORS[kind.name]).newbyteorder(self.order))
        else:
            data, rows = self.data[start: start + n_bytes], gguf.quant_shape_to_byte_shape(rows, kind)
        return GGUFTensor(name, kind, shape, n_elements, n_bytes, start, data.reshape(rows))
