"""A GGUF file, memory-mapped: its metadata (key -> value) and where each tensor's bytes lie.

Our own header parser rather than gguf.GGUFReader: the reader builds a numpy memmap view for every
element of every metadata array, and the default model's 49k-token vocabulary plus 49k merges take
it ~2.5 s to walk; struct over an mmap reads the same header in ~0.1 s. The gguf package still
supplies the format's constants (value types, block sizes). Tensor bytes are never read here: each
tensor is a zero-copy uint8 view of the map until it is dequantised.

File layout (all little-endian):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x  (string key, u32 value_type, value)          string = u64 length + utf-8 bytes
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims] (fastest first), u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32)
    tensor data; each tensor at data_start + offset
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from pagedcore.loader.errors import ModelLoadError

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
# Fixed-size metadata value types -> struct format. STRING and ARRAY are walked by hand.
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
_SCALAR_SIZES = {value_type: struct.calcsize(fmt) for value_type, fmt in _SCALAR_FORMATS.items()}


@dataclasses.dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (slowest first): [out_features, in_features] for a weight
    ggml_type: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


class GGUFFile:
    """Parses the header on construction; tensor bytes stay on disk until `raw` views are read."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if os.path.getsize(self.path) < 24:  # smaller than the fixed header (and mmap refuses empty files)
            raise ModelLoadError(f"{self.path} is not a GGUF file: {os.path.getsize(self.path)} bytes, "
                                 "shorter than a GGUF header; re-download it")
        with open(self.path, "rb") as f:
            # ACCESS_COPY: a writable (copy-on-write) map, so torch.frombuffer has no read-only
            # warning; nothing is ever written back to the file.
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, ValueError, OverflowError, IndexError) as error:
            raise ModelLoadError(f"{self.path} is not a readable GGUF file (truncated or corrupt: "
                                 f"{error}); re-download or re-convert it") from None

    def _parse(self) -> None:
        buf = self._map
        if buf[:4] != _MAGIC:
            raise ModelLoadError(f"{self.path} is not a GGUF file: it starts with {bytes(buf[:4])!r}, "
                                 f"not {_MAGIC!r}")
        version, num_tensors, num_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in _VERSIONS:
            raise ModelLoadError(f"{self.path} is GGUF version {version}; pagedcore reads versions {_VERSIONS}")
        pos = 24
        for _ in range(num_kv):
            key, pos = self._read_string(pos)
            (value_type,) = struct.unpack_from("<I", buf, pos)
            self.metadata[key], pos = self._read_value(pos + 4, value_type)
        infos = []
        for _ in range(num_tensors):
            name, pos = self._read_string(pos)
            (num_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{num_dims}Q", buf, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * num_dims)
            pos += 4 + 8 * num_dims + 12
            infos.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        data_start = (pos + alignment - 1) // alignment * alignment
        for name, shape, ggml_type, offset in infos:
            self.tensors[name] = self._tensor_info(name, shape, ggml_type, data_start + offset)

    def _tensor_info(self, name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> GGUFTensorInfo:
        try:
            qtype = GGMLQuantizationType(ggml_type)
        except ValueError:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has unknown ggml type {ggml_type}") from None
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        num_elems = 1
        for dim in shape:
            num_elems *= dim
        if shape and shape[-1] % block_elems:
            raise ModelLoadError(f"{self.path}: tensor {name!r} rows of {shape[-1]} do not split into "
                                 f"{qtype.name} blocks of {block_elems}")
        nbytes = num_elems // block_elems * block_bytes
        if offset + nbytes > len(self._map):
            raise ModelLoadError(f"{self.path} is truncated: tensor {name!r} ends at byte {offset + nbytes} "
                                 f"but the file has {len(self._map)}; re-download it")
        return GGUFTensorInfo(name, shape, qtype, offset, nbytes)

    def _read_string(self, pos: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", self._map, pos)
        end = pos + 8 + length
        if end > len(self._map):
            raise ValueError(f"a string at byte {pos} runs past the end of the file")
        return self._map[pos + 8:end].decode("utf-8"), end

    def _read_value(self, pos: int, value_type: int) -> tuple[Any, int]:
        if value_type in _SCALAR_FORMATS:
            (value,) = struct.unpack_from("<" + _SCALAR_FORMATS[value_type], self._map, pos)
            return value, pos + _SCALAR_SIZES[value_type]
        if value_type == GGUFValueType.STRING:
            return self._read_string(pos)
        if value_type == GGUFValueType.ARRAY:
            item_type, count = struct.unpack_from("<IQ", self._map, pos)
            pos += 12
            if item_type in _SCALAR_FORMATS:  # one unpack for the whole array (token types: 49k ints)
                values = list(struct.unpack_from(f"<{count}{_SCALAR_FORMATS[item_type]}", self._map, pos))
                return values, pos + count * _SCALAR_SIZES[item_type]
            values = []
            for _ in range(count):  # strings (vocabulary, merges) or nested arrays
                value, pos = self._read_value(pos, item_type)
                values.append(value)
            return values, pos
        raise ValueError(f"unknown metadata value type {value_type} at byte {pos}")

    def raw(self, info: GGUFTensorInfo) -> torch.Tensor:
        """The tensor's bytes as a zero-copy uint8 [nbytes] view of the map (pages load on first touch)."""
        return torch.frombuffer(self._map, dtype=torch.uint8, count=info.nbytes, offset=info.offset)
