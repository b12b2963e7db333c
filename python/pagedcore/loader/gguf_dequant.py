"""Dequantisation of GGUF tensors to torch, vectorised over whole tensors (no per-block Python).

~10x faster than gguf.quants.dequantize (numpy) on the default model: 0.1 s against 1.2 s for its
135M weights on 2 cores. Block layouts (llama.cpp ggml-common.h), 32 weights per block:
    Q8_0  [d: f16][q: 32 x int8]                      w = d * q
    Q4_0  [d: f16][qs: 16 bytes]                      w = d * (nibble - 8)
    Q4_1  [d: f16][m: f16][qs: 16 bytes]              w = d * nibble + m
Nibbles: weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16].
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as T

# Plain floats: the file's bytes reinterpreted, no arithmetic.
_FLOAT_TYPES = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
_BLOCK_BYTES = {T.Q8_0: 34, T.Q4_0: 18, T.Q4_1: 20}
_BLOCK_SIZE = 32
SUPPORTED_TYPES = tuple(t.name for t in (*_FLOAT_TYPES, *_BLOCK_BYTES))


def is_supported(ggml_type: T) -> bool:
    return ggml_type in _FLOAT_TYPES or ggml_type in _BLOCK_BYTES


def dequantize(raw: torch.Tensor, ggml_type: T, shape: tuple[int, ...]) -> torch.Tensor:
    """raw uint8 [nbytes] -> a tensor of `shape`: float types as stored (a zero-copy view, copied into
    the model's dtype by the caller), block types as new fp32."""
    if ggml_type in _FLOAT_TYPES:
        return raw.view(_FLOAT_TYPES[ggml_type]).view(shape)
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(f"ggml type {ggml_type.name} cannot be dequantised; supported: {SUPPORTED_TYPES}")
    blocks = raw.view(-1, _BLOCK_BYTES[ggml_type])  # [num_blocks, block_bytes]
    scale = blocks[:, 0:2].view(torch.float16).float()  # [num_blocks, 1]
    if ggml_type == T.Q8_0:
        out = blocks[:, 2:].view(torch.int8).float()  # [num_blocks, 32]
        return out.mul_(scale).view(shape)
    qs = blocks[:, 4:] if ggml_type == T.Q4_1 else blocks[:, 2:]  # [num_blocks, 16] packed nibbles
    out = torch.empty(blocks.shape[0], _BLOCK_SIZE, dtype=torch.float32)  # [num_blocks, 32]
    out[:, :16] = qs & 0x0F  # uint8 -> fp32 on assignment
    out[:, 16:] = qs >> 4
    if ggml_type == T.Q4_0:
        out.sub_(8.0).mul_(scale)  # nibble - 8 is exact in fp32, then one rounding, like ggml
    else:
        minimum = blocks[:, 2:4].view(torch.float16).float()  # [num_blocks, 1]
        out.mul_(scale).add_(minimum)
    return out.view(shape)
