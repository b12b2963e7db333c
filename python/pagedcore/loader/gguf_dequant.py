"""Dequantisation of GGUF tensors to torch: vectorised, chunked, straight into the destination.

Block layouts (llama.cpp ggml-common.h), 32 weights per block:
    Q8_0  [d: f16][q: 32 x int8]                      w = d * q
    Q4_0  [d: f16][qs: 16 bytes]                      w = d * (nibble - 8)
    Q4_1  [d: f16][m: f16][qs: 16 bytes]              w = d * nibble + m
    Q5_0  [d: f16][qh: 4 bytes][qs: 16 bytes]         w = d * (q - 16), q = nibble + 16 * (bit j of qh)
    Q5_1  [d: f16][m: f16][qh: 4 bytes][qs: 16 bytes] w = d * q + m
Nibbles: weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16]. (Q5_0 / Q5_1
are what llama.cpp writes for a Q4_K / Q5_K tensor whose rows are not whole 256-weight super-blocks: most
of the linears of a small model's Q4_K_M / Q5_K_M file, e.g. SmolLM2-135M's 576-wide rows.)
The k-quants (Q4_K, Q5_K, Q6_K: super-blocks of 256 weights with 6- or 8-bit sub-block scales) are
decoded by gguf.quants (numpy): they are read here only for `--dtype float32|bfloat16` on a k-quant
file and for embedding rows; serving keeps them packed (layers/linear_quant.py).

Results equal gguf.quants.dequantize bit for bit, ~10x faster for the 32-weight formats. Blocks are
decoded a chunk at a time (512 KB of fp32, cache-resident), written straight into the parameter when
it is contiguous fp32, else through one reused scratch chunk and cast on copy (bf16): the weights
are written once, with no whole-tensor temporaries to allocate, page-fault and read back.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

# Plain floats: the file's bytes reinterpreted, no arithmetic.
FLOAT_TYPES = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
_BLOCK_BYTES = {T.Q8_0: 34, T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q5_1: 24}
_K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
# Decoded by gguf.quants (numpy) like the k-quants, and held by the kernels in another format (gguf_held_as.py).
_CONVERTED = (T.Q3_K, T.IQ4_NL)
_BLOCK_SIZE = 32
_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)  # the bits of a byte, for Q5_0 / Q5_1's qh
_CHUNK_BLOCKS = 4096  # 4096 x 32 fp32 = 512 KB per chunk
_K_CHUNK_ROWS = 256  # k-quant rows decoded per numpy call (bounded temporaries)
# ggml type -> the block format name the quantized linear kernels know (ops/quant_linear.py).
# (Q3_K and IQ4_NL: the format their blocks are converted into, exactly, at load: gguf_held_as.py.)
BLOCK_FORMATS = {T.Q8_0: "q8_0", T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q4_K: "q4_k",
                 T.Q5_K: "q5_k", T.Q6_K: "q6_k", T.Q3_K: "q6_k", T.IQ4_NL: "q8_0"}
SUPPORTED_TYPES = tuple(t.name for t in (*FLOAT_TYPES, *_BLOCK_BYTES, *_K_QUANTS, *_CONVERTED))


def is_supported(ggml_type: T) -> bool:
    return ggml_type in FLOAT_TYPES or ggml_type in _BLOCK_BYTES or ggml_type in _K_QUANTS or ggml_type in _CONVERTED


def row_bytes(ggml_type: T, num_cols: int) -> int:
    """Bytes of one row of num_cols weights (a whole number of blocks)."""
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    return num_cols // block_elems * block_bytes


def dequantize(raw: torch.Tensor, ggml_type: T, shape: tuple[int, ...]) -> torch.Tensor:
    """raw uint8 [nbytes] -> a new fp32 tensor of `shape`."""
    out = torch.empty(shape, dtype=torch.float32)
    dequantize_into(raw, ggml_type, out)
    return out


def dequantize_rows(rows: torch.Tensor, ggml_type: T) -> torch.Tensor:
    """rows uint8 [n, row_bytes] (whole rows of blocks, e.g. gathered embedding rows) -> fp32 [n, cols]."""
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    out = torch.empty(rows.shape[0], rows.shape[1] // block_bytes * block_elems, dtype=torch.float32)
    dequantize_into(rows.reshape(-1), ggml_type, out)
    return out


def dequantize_into(raw: torch.Tensor, ggml_type: T, out: torch.Tensor) -> None:
    """Decodes raw uint8 [nbytes] into out (a contiguous tensor of the logical shape, any float dtype)."""
    if ggml_type in FLOAT_TYPES:
        out.copy_(raw.view(FLOAT_TYPES[ggml_type]).view(out.shape))
        return
    if ggml_type in _K_QUANTS or ggml_type in _CONVERTED:
        _dequantize_k_quant(raw, ggml_type, out)
        return
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(f"ggml type {ggml_type.name} cannot be dequantised; supported: {SUPPORTED_TYPES}")
    blocks = raw.view(-1, _BLOCK_BYTES[ggml_type])  # [num_blocks, block_bytes]
    dst = out.view(-1, _BLOCK_SIZE)  # [num_blocks, 32]
    num_blocks = blocks.shape[0]
    direct = out.dtype == torch.float32
    scratch = None if direct else torch.empty(min(num_blocks, _CHUNK_BLOCKS), _BLOCK_SIZE)
    for start in range(0, num_blocks, _CHUNK_BLOCKS):
        chunk = blocks[start:start + _CHUNK_BLOCKS]  # [n, block_bytes]
        target = dst[start:start + chunk.shape[0]]  # [n, 32]
        if direct:
            _decode_blocks(chunk, ggml_type, target)
        else:
            _decode_blocks(chunk, ggml_type, scratch[:chunk.shape[0]])
            target.copy_(scratch[:chunk.shape[0]])  # fp32 -> bf16 (round to nearest even)


def _dequantize_k_quant(raw: torch.Tensor, ggml_type: T, out: torch.Tensor) -> None:
    """k-quants through gguf.quants, a few rows at a time: raw uint8 [nbytes] -> out [..., cols]."""
    cols = out.shape[-1] if out.dim() else 1
    dst = out.view(-1, cols)  # [rows, cols]
    src = raw.view(dst.shape[0], row_bytes(ggml_type, cols)).numpy()  # [rows, row_bytes]
    for start in range(0, dst.shape[0], _K_CHUNK_ROWS):
        values = gguf_quants.dequantize(np.ascontiguousarray(src[start:start + _K_CHUNK_ROWS]), ggml_type)
        dst[start:start + values.shape[0]].copy_(torch.from_numpy(values))  # [n, cols] fp32 -> out dtype


def _decode_blocks(blocks: torch.Tensor, ggml_type: T, out: torch.Tensor) -> None:
    """blocks uint8 [n, block_bytes] -> out fp32 [n, 32]."""
    scale = blocks[:, 0:2].view(torch.float16).float()  # [n, 1]
    if ggml_type == T.Q8_0:
        out.copy_(blocks[:, 2:].view(torch.int8))
        out.mul_(scale)
        return
    has_min = ggml_type in (T.Q4_1, T.Q5_1)
    fifth_bit = ggml_type in (T.Q5_0, T.Q5_1)
    first_qs = (4 if has_min else 2) + (4 if fifth_bit else 0)
    qs = blocks[:, first_qs:]  # [n, 16] packed nibbles
    torch.bitwise_and(qs, 0x0F, out=out[:, :16])  # uint8 results, stored as fp32
    torch.bitwise_right_shift(qs, 4, out=out[:, 16:])
    if fifth_bit:  # bit j of the little-endian qh word (byte j // 8, bit j % 8) adds 16 to weight j
        qh = blocks[:, first_qs - 4:first_qs]  # [n, 4]
        bits = torch.bitwise_and(torch.bitwise_right_shift(qh[:, :, None], _BIT_SHIFTS), 1)  # [n, 4, 8]
        out.add_(bits.reshape(-1, 32), alpha=16)  # exact: integers below 32
    if not has_min:
        out.sub_(16.0 if fifth_bit else 8.0).mul_(scale)  # q - offset is exact in fp32, then one rounding, like ggml
    else:
        out.mul_(scale).add_(blocks[:, 2:4].view(torch.float16).float())  # d * q + m
