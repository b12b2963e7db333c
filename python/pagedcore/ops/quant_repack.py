"""GGUF blocks repacked once at load into the 16-row layouts of the x16 kernels (cpp/kernels/
quant_blocks.h BlockQ*x16, quant_x16_impl.h, quant_kx16_impl.h): arranged so one vector of integer
products holds 16 output columns.

    rows   = repack_x16(weight, "q4_k", K)         # uint8 [N, row_bytes("q4_k", K)] ggml rows
    kernel = QuantLinearKernel(rows, "q4_kx16", K)  # rows: uint8 [N, row_bytes("q4_kx16", K)]
    assert torch.equal(unpack_x16(rows, "q4_kx16", K), weight)

Each ggml block of a row becomes a *lane record* (the block's fields, reordered; the k-quants'
12 packed bytes of 6-bit scales and minimums unpacked to one byte each: lossless), and the 16 lane
records of a row group's block are interleaved field by field in chunks: chunk c of a field holds
the c-th `unit` bytes of each of the 16 rows (row r's at unit * r).

    format   lane record (bytes: field / unit)                                   ggml block
    q4_0     d 2/2, qs 16/4                                                        18
    q4_1     d 2/2, m 2/2, qs 16/4                                                 20
    q5_0     d 2/2, qh 4/4, qs 16/4 (qh regrouped: bit 2 j / 2 j + 1 of byte t = the fifth    22
             bit of weight 4 j + t / 16 + 4 j + t, beside the nibbles of the qs[j] vector)
    q5_1     d 2/2, m 2/2, qh 4/4, qs 16/4 (qh as q5_0)                                 24
    q8_0     d 2/2, qs 32/4 (stored q + 128: unsigned for vpdpbusd)                34
    q4_k     d 2/2, dmin 2/2, sc 8/2, mn 8/2, qs 128/4                   148       144
    q5_k     d 2/2, dmin 2/2, sc 8/2, mn 8/2, qh 32/4, qs 128/4          180       176
    q6_k     d 2/2, sc 16/2, ql 128/4, qh 64/4                           210       210
    int8_per_channel  q 4/4 (stored q + 128), a "block" of 4 weights; scales stay     4
                      a separate fp32 [N] (int8 [N, K] in and out, K a multiple of 4)
    fp8_e4m3          q 1/1, a "block" of one weight: [N][K] -> [N/16][K][16], a pure    1
                      permutation (kDenseF32x16's layout at a byte per weight); scales stay a separate
                      fp32 [N]. Run by the dense kernels (x not quantized), which every ISA has.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

from pagedcore import _core
from pagedcore.ops.quant_linear import FORMAT_ENUMS, row_bytes

ROWS = 16  # weight rows per group


def _same(blocks: torch.Tensor) -> torch.Tensor:
    return blocks


def _q8_0_to_lanes(blocks: torch.Tensor) -> torch.Tensor:
    return torch.cat([blocks[..., :2], blocks[..., 2:] + 128], dim=-1)  # uint8 arithmetic wraps exactly


def _q8_0_from_lanes(lanes: torch.Tensor) -> torch.Tensor:
    return torch.cat([lanes[..., :2], lanes[..., 2:] - 128], dim=-1)


def _plus_128(blocks: torch.Tensor) -> torch.Tensor:
    return blocks + 128  # int8 q viewed as uint8 (q mod 256): q + 128 in 0..255, uint8 wraps exactly


def _minus_128(lanes: torch.Tensor) -> torch.Tensor:
    return lanes - 128


# Q5_0 / Q5_1's qh regrouped (quant_blocks.h BlockQ5_0x16): bit b of the ggml word (weight b) -> bit
# _QH_LANE_BIT[b] of lane byte _QH_LANE_BYTE[b]: weight 4 j + t -> byte t, bit 2 j; 16 + 4 j + t -> byte t, bit 2 j + 1.
_QH_WEIGHT = torch.arange(32)
_QH_LANE_BYTE = _QH_WEIGHT % 4
_QH_LANE_BIT = 2 * ((_QH_WEIGHT % 16) // 4) + _QH_WEIGHT // 16


def _qh_bits(qh: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4] (a little-endian word) -> its 32 bits [..., 32], bit b at index b."""
    return ((qh[..., :, None] >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(*qh.shape[:-1], 32)


def _bits_to_bytes(bits: torch.Tensor) -> torch.Tensor:
    """[..., 32] bits, index 8 i + k = bit k of byte i -> uint8 [..., 4]."""
    weights = torch.tensor([1 << k for k in range(8)], dtype=torch.uint8)
    return (bits.reshape(*bits.shape[:-1], 4, 8) * weights).sum(-1, dtype=torch.uint8)


def _regroup_qh(qh: torch.Tensor) -> torch.Tensor:
    """ggml qh [..., 4] -> the lane record's qh [..., 4] (bit 8 byte + bit of the result = weight's bit)."""
    bits = _qh_bits(qh)
    out = torch.zeros_like(bits)
    out[..., _QH_LANE_BYTE * 8 + _QH_LANE_BIT] = bits
    return _bits_to_bytes(out)


def _ungroup_qh(lanes_qh: torch.Tensor) -> torch.Tensor:
    return _bits_to_bytes(_qh_bits(lanes_qh)[..., _QH_LANE_BYTE * 8 + _QH_LANE_BIT])


def _q5_0_to_lanes(blocks: torch.Tensor) -> torch.Tensor:
    return torch.cat([blocks[..., :2], _regroup_qh(blocks[..., 2:6]), blocks[..., 6:]], dim=-1)


def _q5_0_from_lanes(lanes: torch.Tensor) -> torch.Tensor:
    return torch.cat([lanes[..., :2], _ungroup_qh(lanes[..., 2:6]), lanes[..., 6:]], dim=-1)


def _q5_1_to_lanes(blocks: torch.Tensor) -> torch.Tensor:
    return torch.cat([blocks[..., :4], _regroup_qh(blocks[..., 4:8]), blocks[..., 8:]], dim=-1)


def _q5_1_from_lanes(lanes: torch.Tensor) -> torch.Tensor:
    return torch.cat([lanes[..., :4], _ungroup_qh(lanes[..., 4:8]), lanes[..., 8:]], dim=-1)


def _unpack_scales(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's 12 bytes of Q4_K / Q5_K scales [..., 12] -> (scales [..., 8], minimums [..., 8]), 0..63."""
    sc = torch.cat([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], dim=-1)
    mn = torch.cat([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], dim=-1)
    return sc, mn


def _pack_scales(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """The inverse of _unpack_scales: [..., 8] x 2 (6-bit values) -> [..., 12]."""
    return torch.cat([sc[..., :4] | ((sc[..., 4:] >> 4) << 6), mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
                      (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], dim=-1)


def _q45_k_to_lanes(blocks: torch.Tensor) -> torch.Tensor:
    """[d dmin scales(12) rest] -> [d dmin sc(8) mn(8) rest] (rest: Q4_K qs; Q5_K qh qs)."""
    sc, mn = _unpack_scales(blocks[..., 4:16])
    return torch.cat([blocks[..., :4], sc, mn, blocks[..., 16:]], dim=-1)


def _q45_k_from_lanes(lanes: torch.Tensor) -> torch.Tensor:
    return torch.cat([lanes[..., :4], _pack_scales(lanes[..., 4:12], lanes[..., 12:20]), lanes[..., 20:]], dim=-1)


def _q6_k_to_lanes(blocks: torch.Tensor) -> torch.Tensor:
    """[ql(128) qh(64) scales(16) d] -> [d scales ql qh]."""
    return torch.cat([blocks[..., 208:210], blocks[..., 192:208], blocks[..., :192]], dim=-1)


def _q6_k_from_lanes(lanes: torch.Tensor) -> torch.Tensor:
    return torch.cat([lanes[..., 18:210], lanes[..., 2:18], lanes[..., :2]], dim=-1)


@dataclasses.dataclass(frozen=True)
class _Layout:
    repacked: str
    block: int  # weights per block along K
    ggml_bytes: int  # bytes of one ggml block
    fields: tuple[tuple[int, int], ...]  # the lane record: (bytes per row, bytes per chunk) per field
    to_lanes: Callable[[torch.Tensor], torch.Tensor]  # uint8 [..., ggml_bytes] -> [..., lane_bytes]
    from_lanes: Callable[[torch.Tensor], torch.Tensor]  # the inverse

    @property
    def lane_bytes(self) -> int:
        return sum(width for width, _ in self.fields)


_LAYOUTS = {
    "q4_0": _Layout("q4_0x16", 32, 18, ((2, 2), (16, 4)), _same, _same),
    "q4_1": _Layout("q4_1x16", 32, 20, ((2, 2), (2, 2), (16, 4)), _same, _same),
    "q5_0": _Layout("q5_0x16", 32, 22, ((2, 2), (4, 4), (16, 4)), _q5_0_to_lanes, _q5_0_from_lanes),
    "q5_1": _Layout("q5_1x16", 32, 24, ((2, 2), (2, 2), (4, 4), (16, 4)), _q5_1_to_lanes, _q5_1_from_lanes),
    "q8_0": _Layout("q8_0x16", 32, 34, ((2, 2), (32, 4)), _q8_0_to_lanes, _q8_0_from_lanes),
    "q4_k": _Layout("q4_kx16", 256, 144, ((2, 2), (2, 2), (8, 2), (8, 2), (128, 4)), _q45_k_to_lanes,
                    _q45_k_from_lanes),
    "q5_k": _Layout("q5_kx16", 256, 176, ((2, 2), (2, 2), (8, 2), (8, 2), (32, 4), (128, 4)), _q45_k_to_lanes,
                    _q45_k_from_lanes),
    "q6_k": _Layout("q6_kx16", 256, 210, ((2, 2), (16, 2), (128, 4), (64, 4)), _q6_k_to_lanes, _q6_k_from_lanes),
    "int8_per_channel": _Layout("int8_per_channelx16", 4, 4, ((4, 4),), _plus_128, _minus_128),
}
_INT8 = ("int8_per_channel", "int8_per_channelx16")  # int8 tensors (viewed as bytes while repacking)
# Rows longer than this stay in the row layout: the x16 int8 kernel's int32 sums of (q + 128) x.
_MAX_INT8_K = 65536
REPACKED = {fmt: layout.repacked for fmt, layout in _LAYOUTS.items()}  # ggml format -> repacked format
# fp8 rows (not integer blocks: the dense kernels run them, on every ISA, the portable ones too).
_FP8_LAYOUTS = {"fp8_e4m3": _Layout("fp8_e4m3x16", 1, 1, ((1, 1),), _same, _same)}
FP8_REPACKED = {fmt: layout.repacked for fmt, layout in _FP8_LAYOUTS.items()}
_ALL_LAYOUTS = {**_LAYOUTS, **_FP8_LAYOUTS}
_GGML_OF = {layout.repacked: fmt for fmt, layout in _ALL_LAYOUTS.items()}  # repacked format -> row format


def repackable(fmt: str, num_rows: int, isa: str = "auto", K: int | None = None) -> str | None:
    """The repacked format a `fmt` weight of num_rows rows (of K weights, when given) should run as on
    this CPU, or None: row counts in whole groups of 16 (a part of another count keeps the file
    layout), and ISAs with a SIMD 16-lane kernel (AVX2 and AVX-512; int8_per_channel also K a multiple
    of 4, at most 65536). Elsewhere the ggml-layout / row kernels run the rows as they are. fp8_e4m3
    repacks wherever the dense kernels run (every ISA: its x16 kernel is the f32x16 one's loop)."""
    repacked = REPACKED.get(fmt) or FP8_REPACKED.get(fmt)
    if repacked is None or num_rows % ROWS or num_rows == 0:
        return None
    if fmt in _INT8 and K is not None and (K % 4 or K > _MAX_INT8_K):
        return None
    from pagedcore.ops.linear_isa import isa_code

    if fmt in FP8_REPACKED:
        return repacked if _core.dense_kernel_isa_for(FORMAT_ENUMS[repacked], isa_code(isa)) else None
    kernel_isa = _core.quant_kernel_isa_for(FORMAT_ENUMS[repacked], isa_code(isa))
    return repacked if kernel_isa in ("avx2", "avx512", "avx512_vnni") else None


def _check(weight: torch.Tensor, fmt: str, K: int) -> tuple[_Layout, int, int]:
    """(layout, N, blocks per row) of a `fmt` weight (ggml or repacked), checked."""
    ggml = _GGML_OF.get(fmt, fmt)
    if ggml not in _ALL_LAYOUTS:
        raise ValueError(f"{fmt!r} has no 16-row layout; repacked formats: {sorted(_ALL_LAYOUTS)} -> "
                         f"{sorted(_GGML_OF)}")
    layout = _ALL_LAYOUTS[ggml]
    N = weight.shape[0] if weight.dim() == 2 else -1
    nbytes = row_bytes(fmt, K)
    dtype = torch.int8 if fmt in _INT8 else torch.uint8
    if weight.dtype != dtype or weight.dim() != 2 or N % ROWS or weight.shape[1] != nbytes:
        raise ValueError(f"a {fmt} weight of K = {K} is {str(dtype).removeprefix('torch.')} [N, {nbytes}] with N a "
                         f"multiple of {ROWS}; got {weight.dtype} {tuple(weight.shape)}")
    return layout, N, K // layout.block


def repack_x16(weight: torch.Tensor, fmt: str, K: int) -> torch.Tensor:
    """ggml rows uint8 [N, row_bytes(fmt, K)] of `fmt` (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k) -> the
    16-row groups uint8 [N, row_bytes(repacked, K)]; int8_per_channel rows int8 [N, K] -> int8 [N, K];
    fp8_e4m3 rows uint8 [N, K] -> uint8 [N, K] holding the bytes [N/16][K][16]."""
    if fmt not in _ALL_LAYOUTS:
        raise ValueError(f"{fmt!r} is not a row format with a 16-row layout ({sorted(_ALL_LAYOUTS)})")
    layout, N, nb = _check(weight, fmt, K)
    if fmt in _INT8:  # int8 in, int8 out: the bytes are repacked
        return _repack(weight.view(torch.uint8), layout, N, nb).view(torch.int8)
    return _repack(weight, layout, N, nb)


def _repack(weight: torch.Tensor, layout: _Layout, N: int, nb: int) -> torch.Tensor:
    groups = N // ROWS
    lanes = layout.to_lanes(weight.reshape(groups, ROWS, nb, layout.ggml_bytes).transpose(1, 2))  # [G, nb, 16, L]
    chunks, start = [], 0
    for width, unit in layout.fields:  # field [G, nb, 16, width] -> chunks [G, nb, width / unit, 16, unit]
        field = lanes[..., start:start + width].reshape(groups, nb, ROWS, width // unit, unit)
        chunks.append(field.transpose(2, 3).reshape(groups, nb, -1))
        start += width
    return torch.cat(chunks, dim=-1).reshape(N, -1).contiguous()


def unpack_x16(weight: torch.Tensor, fmt: str, K: int) -> torch.Tensor:
    """The inverse of repack_x16: repacked rows of `fmt` (q4_0x16, ..., q6_kx16, fp8_e4m3x16) -> file rows."""
    if fmt not in _GGML_OF:
        raise ValueError(f"{fmt!r} is not a repacked format ({sorted(_GGML_OF)})")
    layout, N, nb = _check(weight, fmt, K)
    if fmt in _INT8:
        return _unpack(weight.view(torch.uint8), layout, N, nb).view(torch.int8)
    return _unpack(weight, layout, N, nb)


def _unpack(weight: torch.Tensor, layout: _Layout, N: int, nb: int) -> torch.Tensor:
    groups = N // ROWS
    blocks = weight.reshape(groups, nb, ROWS * layout.lane_bytes)
    fields, start = [], 0
    for width, unit in layout.fields:  # chunks [G, nb, width / unit, 16, unit] -> field [G, nb, 16, width]
        chunk = blocks[..., ROWS * start:ROWS * (start + width)].reshape(groups, nb, width // unit, ROWS, unit)
        fields.append(chunk.transpose(2, 3).reshape(groups, nb, ROWS, width))
        start += width
    rows = layout.from_lanes(torch.cat(fields, dim=-1))  # [G, nb, 16, ggml_bytes]
    return rows.transpose(1, 2).reshape(N, -1).contiguous()


@functools.lru_cache(maxsize=None)
def _lane_offsets(fmt: str) -> torch.Tensor:
    """int64 [16, lane_bytes]: where each byte of lane (row) l's lane record sits inside a repacked
    16-row block of `fmt` (the inverse map of repack_x16 for one block)."""
    layout = _ALL_LAYOUTS[_GGML_OF[fmt]]
    lanes = torch.arange(ROWS)[:, None]  # [16, 1]
    parts, start = [], 0
    for width, unit in layout.fields:
        k = torch.arange(width)  # the field's bytes in the lane record
        parts.append(ROWS * start + (k // unit) * (ROWS * unit) + lanes * unit + k % unit)  # [16, width]
        start += width
    return torch.cat(parts, dim=1)


def gather_rows_x16(weight: torch.Tensor, rows: torch.Tensor, fmt: str, K: int) -> torch.Tensor:
    """The ggml rows uint8 [n, row_bytes(ggml format, K)] of weight rows `rows` (int64 [n]) of a
    repacked tensor: what an embedding lookup decodes. Reads only those rows' bytes."""
    layout, N, nb = _check(weight, fmt, K)
    group_bytes = ROWS * layout.lane_bytes  # one repacked block (16 rows x one block of weights)
    block_start = ((rows // ROWS) * nb)[:, None] + torch.arange(nb)  # [n, nb]: repacked block index
    offsets = block_start[..., None] * group_bytes + _lane_offsets(fmt)[rows % ROWS][:, None, :]  # [n, nb, L]
    lanes = weight.view(-1)[offsets]  # uint8 [n, nb, lane_bytes]
    return layout.from_lanes(lanes).reshape(rows.shape[0], -1)
