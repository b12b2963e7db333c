"""Random GGUF block bytes for tests: every format the kernels read, including the k-quants that
gguf.quants cannot quantize (it only decodes them). Quantized bits are random (every pattern is a
valid block); the fp16 scale fields are set to small normal values so products stay finite."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

# Byte offsets of the fp16 scale fields in one block (llama.cpp ggml-common.h), and the largest
# |quant * sub-scale| of the format, so d can be drawn for weights of about `scale` in magnitude.
_F16_FIELDS = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q4_K: (0, 2),
               T.Q5_K: (0, 2), T.Q6_K: (208,), T.Q3_K: (108,), T.IQ4_NL: (0,)}
_MAX_QUANT = {T.Q8_0: 127, T.Q4_0: 8, T.Q4_1: 15, T.Q5_0: 16, T.Q5_1: 31, T.Q4_K: 15 * 3, T.Q5_K: 31 * 3,
              T.Q6_K: 32 * 3, T.Q3_K: 4 * 32, T.IQ4_NL: 127}
# k-quant sub-block scale bytes, drawn in 1..3 (packed 6-bit scales / mins decode to 0..3; Q6_K's
# int8 scales to 1..3) so the super-block scale d sets the magnitude.
_SUB_SCALES = {T.Q4_K: (4, 16), T.Q5_K: (4, 16), T.Q6_K: (192, 208)}
FORMATS = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q4_k": T.Q4_K,
           "q5_k": T.Q5_K, "q6_k": T.Q6_K}


def random_blocks(ggml_type: T, rows: int, cols: int, seed: int = 0, scale: float = 0.1) -> np.ndarray:
    """uint8 [rows, row_bytes] of random blocks of ggml_type (cols weights per row), weights of up
    to about `scale` in magnitude."""
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block_elems, block_bytes), dtype=np.uint8)
    if ggml_type in _SUB_SCALES:
        start, end = _SUB_SCALES[ggml_type]
        blocks[:, start:end] = rng.integers(1, 4, size=(blocks.shape[0], end - start), dtype=np.uint8)
    for offset in _F16_FIELDS[ggml_type]:
        values = (np.abs(rng.standard_normal(blocks.shape[0])) * scale / _MAX_QUANT[ggml_type]).astype(np.float16)
        blocks[:, offset:offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def as_tensor(blocks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(blocks))
