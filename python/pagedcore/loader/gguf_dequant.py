"""Dequantisation of GGUF tensors to torch: vectorised, chunked, straight into the destination.

Block layouts (llama.cpp ggml-common.h), 32 weights per block:
    Q8_0  [d: f16][q: 32 x int8]                      w = d * q
    Q4_0  [d: f16][qs: 16 bytes]                      w = d * (nibble - 8)
    Q4_1  [d: f16][m: f16][qs: 16 bytes]              w = d * nibble + m
Nibbles: weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16].

Results equal gguf.quants.dequantize bit for bit, ~10x faster. Blocks are decoded a chunk at a time
(512 KB of fp32, cache-resident), written straight into the parameter when it is contiguous fp32,
else through one reused scratch chunk and cast on copy (bf16): the weights are written once, with
no whole-tensor temporaries to allocate, page-fault and read back.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as T

# Plain floats: the file's bytes reinterpreted, no arithmetic.
_FLOAT_TYPES = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
_BLOCK_BYTES = {T.Q8_0: 34, T.Q4_0: 18, T.Q4_1: 20}
_BLOCK_SIZE = 32
_CHUNK_BLOCKS = 4096  # 4096 x 32 fp32 = 512 KB per chunk
SUPPORTED_TYPES = tuple(t.name for t in (*_FLOAT_TYPES, *_BLOCK_BYTES))


def is_supported(ggml_type: T) -> bool:
    return ggml_type in _FLOAT_TYPES or ggml_type in _BLOCK_BYTES


def dequantize(raw: torch.Tensor, ggml_type: T, shape: tuple[int, ...]) -> torch.Tensor:
    """raw uint8 [nbytes] -> a new fp32 tensor of `shape`."""
    out = torch.empty(shape, dtype=torch.float32)
    dequantize_into(raw, ggml_type, out)
    return out


def dequantize_into(raw: torch.Tensor, ggml_type: T, out: torch.Tensor) -> None:
    """Decodes raw uint8 [nbytes] into out (a contiguous tensor of the logical shape, any float dtype)."""
    if ggml_type in _FLOAT_TYPES:
        out.copy_(raw.view(_FLOAT_TYPES[ggml_type]).view(out.shape))
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


def _decode_blocks(blocks: torch.Tensor, ggml_type: T, out: torch.Tensor) -> None:
    """blocks uint8 [n, block_bytes] -> out fp32 [n, 32]."""
    scale = blocks[:, 0:2].view(torch.float16).float()  # [n, 1]
    if ggml_type == T.Q8_0:
        out.copy_(blocks[:, 2:].view(torch.int8))
        out.mul_(scale)
        return
    qs = blocks[:, 4:] if ggml_type == T.Q4_1 else blocks[:, 2:]  # [n, 16] packed nibbles
    torch.bitwise_and(qs, 0x0F, out=out[:, :16])  # uint8 results, stored as fp32
    torch.bitwise_right_shift(qs, 4, out=out[:, 16:])
    if ggml_type == T.Q4_0:
        out.sub_(8.0).mul_(scale)  # nibble - 8 is exact in fp32, then one rounding, like ggml
    else:
        out.mul_(scale).add_(blocks[:, 2:4].view(torch.float16).float())  # d * q + m
