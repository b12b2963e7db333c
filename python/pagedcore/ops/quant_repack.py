"""GGUF 32-weight blocks (Q4_0, Q4_1, Q8_0) repacked once at load into the 16-row layout of the
x16 kernels (cpp/kernels/quant_blocks.h BlockQ*x16, quant_x16_impl.h): the same bytes per weight,
arranged so one vector of integer products holds 16 output columns.

    rows   = repack_x16(weight, "q4_1", K)         # uint8 [N, row_bytes] ggml rows -> the same shape
    kernel = QuantLinearKernel(rows, "q4_1x16", K)
    assert torch.equal(unpack_x16(rows, "q4_1x16", K), weight)

Per group of 16 rows and block of 32 weights (ggml block: d, [m], qs):
    d[16] (fp16) | m[16] (Q4_1) | qs chunks, chunk j = 4 bytes of each of the 16 rows
    Q4_0 / Q4_1: chunk j (0..3) = ggml qs bytes 4 j .. 4 j + 3 (low nibbles weights 4 j + t, high 16 + 4 j + t)
    Q8_0:        chunk j (0..7) = weights 4 j .. 4 j + 3, stored as q + 128 (unsigned for vpdpbusd)
"""

from __future__ import annotations

import functools

import torch

from pagedcore import _core
from pagedcore.ops.quant_linear import FORMAT_ENUMS, row_bytes

ROWS = 16  # weight rows per group
# ggml format -> (its repacked format, bytes of one block, bytes of the scale fields, chunks of 4 bytes)
_LAYOUTS = {"q4_0": ("q4_0x16", 18, 2, 4), "q4_1": ("q4_1x16", 20, 4, 4), "q8_0": ("q8_0x16", 34, 2, 8)}
REPACKED = {fmt: layout[0] for fmt, layout in _LAYOUTS.items()}  # ggml format -> repacked format
_GGML_OF = {repacked: fmt for fmt, repacked in REPACKED.items()}


def repackable(fmt: str, num_rows: int, isa: str = "auto") -> str | None:
    """The repacked format a `fmt` weight of num_rows rows should run as on this CPU, or None: only the
    32-weight formats, row counts in whole groups of 16, and ISAs with a SIMD 16-lane kernel (AVX2 and
    AVX-512; Q8_0 needs VNNI). Elsewhere the ggml-layout kernels run the file's rows as they are."""
    repacked = REPACKED.get(fmt)
    if repacked is None or num_rows % ROWS or num_rows == 0:
        return None
    from pagedcore.ops.linear_isa import isa_code

    kernel_isa = _core.quant_kernel_isa_for(FORMAT_ENUMS[repacked], isa_code(isa))
    return repacked if kernel_isa in ("avx2", "avx512", "avx512_vnni") else None


def _check(weight: torch.Tensor, fmt: str, K: int) -> tuple[int, int, int, int]:
    ggml = _GGML_OF.get(fmt, fmt)
    if ggml not in _LAYOUTS:
        raise ValueError(f"{fmt!r} has no 16-row layout; repacked formats: {sorted(REPACKED)} -> "
                         f"{sorted(REPACKED.values())}")
    _, block_bytes, scale_bytes, chunks = _LAYOUTS[ggml]
    N = weight.shape[0] if weight.dim() == 2 else -1
    if (weight.dtype != torch.uint8 or weight.dim() != 2 or N % ROWS
            or weight.shape[1] != row_bytes(ggml, K)):
        raise ValueError(f"a {fmt} weight of K = {K} is uint8 [N, {row_bytes(ggml, K)}] with N a multiple of "
                         f"{ROWS}; got {weight.dtype} {tuple(weight.shape)}")
    return N, K // 32, block_bytes, scale_bytes


def repack_x16(weight: torch.Tensor, fmt: str, K: int) -> torch.Tensor:
    """ggml rows uint8 [N, row_bytes] of `fmt` (q4_0, q4_1, q8_0) -> the same bytes in 16-row groups."""
    N, nb, block_bytes, scale_bytes = _check(weight, fmt, K)
    chunks = _LAYOUTS[fmt][3]
    blocks = weight.reshape(N // ROWS, ROWS, nb, block_bytes).transpose(1, 2)  # [groups, nb, 16, block_bytes]
    fields = [blocks[..., i:i + 2] for i in range(0, scale_bytes, 2)]  # d (and m): [groups, nb, 16, 2] each
    qs = blocks[..., scale_bytes:]  # [groups, nb, 16, 16 or 32]
    if fmt == "q8_0":
        qs = qs + 128  # int8 q stored as q + 128 (uint8 arithmetic wraps exactly)
    qs = qs.reshape(N // ROWS, nb, ROWS, chunks, 4).transpose(2, 3)  # [groups, nb, chunks, 16, 4]
    flat = [f.reshape(N // ROWS, nb, -1) for f in fields] + [qs.reshape(N // ROWS, nb, -1)]
    return torch.cat(flat, dim=-1).reshape(N, -1).contiguous()


def unpack_x16(weight: torch.Tensor, fmt: str, K: int) -> torch.Tensor:
    """The inverse of repack_x16: repacked rows of `fmt` (q4_0x16, q4_1x16, q8_0x16) -> ggml rows."""
    ggml = _GGML_OF.get(fmt)
    if ggml is None:
        raise ValueError(f"{fmt!r} is not a repacked format ({sorted(_GGML_OF)})")
    N, nb, block_bytes, scale_bytes = _check(weight, fmt, K)
    chunks = _LAYOUTS[ggml][3]
    blocks = weight.reshape(N // ROWS, nb, ROWS * block_bytes)
    fields = [blocks[..., i * ROWS:(i + 2) * ROWS].reshape(N // ROWS, nb, ROWS, 2)
              for i in range(0, scale_bytes, 2)]
    qs = blocks[..., scale_bytes * ROWS:].reshape(N // ROWS, nb, chunks, ROWS, 4).transpose(2, 3)
    qs = qs.reshape(N // ROWS, nb, ROWS, chunks * 4)
    if ggml == "q8_0":
        qs = qs - 128
    rows = torch.cat([*fields, qs], dim=-1)  # [groups, nb, 16, block_bytes]
    return rows.transpose(1, 2).reshape(N, -1).contiguous()


@functools.lru_cache(maxsize=None)
def _lane_offsets(fmt: str) -> torch.Tensor:
    """int64 [16, block_bytes]: where each byte of lane (row) l's ggml block sits inside a repacked
    16-row block of `fmt` (the inverse map of repack_x16 for one block)."""
    ggml = _GGML_OF[fmt]
    _, block_bytes, scale_bytes, chunks = _LAYOUTS[ggml]
    lanes = torch.arange(ROWS)[:, None]  # [16, 1]
    fields = [i * ROWS + 2 * lanes + torch.arange(2) for i in range(0, scale_bytes, 2)]  # d (and m) bytes
    k = torch.arange(chunks * 4)  # the quant bytes of a ggml block, in order
    qs = scale_bytes * ROWS + (k // 4) * (ROWS * 4) + lanes * 4 + k % 4  # [16, chunks * 4]
    return torch.cat([*fields, qs], dim=1)


def gather_rows_x16(weight: torch.Tensor, rows: torch.Tensor, fmt: str, K: int) -> torch.Tensor:
    """The ggml rows uint8 [n, row_bytes] of weight rows `rows` (int64 [n]) of a repacked tensor: what
    an embedding lookup decodes. Reads only those rows' bytes."""
    N, nb, block_bytes, _ = _check(weight, fmt, K)
    group_bytes = ROWS * block_bytes  # one repacked block (16 rows x 32 weights)
    block_start = ((rows // ROWS) * nb)[:, None] + torch.arange(nb)  # [n, nb]: repacked block index
    offsets = block_start[..., None] * group_bytes + _lane_offsets(fmt)[rows % ROWS][:, None, :]  # [n, nb, bb]
    out = weight.view(-1)[offsets]  # uint8 [n, nb, block_bytes]
    if fmt == "q8_0x16":
        out[..., 2:] -= 128  # stored q + 128 (uint8 arithmetic wraps exactly)
    return out.reshape(rows.shape[0], -1)
