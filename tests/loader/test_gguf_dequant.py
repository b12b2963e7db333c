"""Our vectorised dequantisation against the gguf package's reference, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize

from pagedcore.loader.gguf_dequant import SUPPORTED_TYPES, dequantize, dequantize_into, dequantize_rows

from ..quantization.blocks import random_blocks

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
K_QUANTS = [T.Q4_K, T.Q5_K, T.Q6_K]


def quantised(ggml_type: T, shape=(300, 256), seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    packed = np.ascontiguousarray(quantize(values, ggml_type))
    return torch.from_numpy(packed).view(torch.uint8).reshape(-1), reference_dequantize(packed, ggml_type)


def test_supported_types_are_the_documented_ones():
    assert set(SUPPORTED_TYPES) == {t.name for t in TYPES + K_QUANTS + [T.Q3_K, T.IQ4_NL]}


@pytest.mark.parametrize("ggml_type, held_type", [(T.Q3_K, T.Q6_K), (T.IQ4_NL, T.Q8_0)], ids=["Q3_K", "IQ4_NL"])
def test_converted_types_hold_the_same_weights(ggml_type, held_type):
    """Q3_K -> Q6_K and IQ4_NL -> Q8_0 (loader/gguf_held_as.py): every weight dequantises to the same bits, and our
    decoder of the file type (for --dtype float32) is gguf's."""
    from pagedcore.loader.gguf_held_as import held_rows

    blocks = random_blocks(ggml_type, 40, 512, seed=5)
    blocks.reshape(-1, blocks.shape[1] // (512 // 256 if ggml_type == T.Q3_K else 512 // 32))[:3, :] = 0xFF  # extremes
    expected = reference_dequantize(blocks, ggml_type)  # fp32 [40, 512]
    held = held_rows(torch.from_numpy(blocks), ggml_type).numpy()
    got = reference_dequantize(held, held_type)
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(got), finite)
    np.testing.assert_array_equal(got[finite].view(np.int32), expected[finite].view(np.int32))
    np.testing.assert_array_equal(dequantize(torch.from_numpy(blocks).reshape(-1), ggml_type, (40, 512)).numpy(),
                                  expected)


@pytest.mark.parametrize("ggml_type", K_QUANTS + [T.Q8_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_rows_and_k_quants_equal_the_gguf_reference(ggml_type):
    """k-quants (gguf.quants cannot quantize them: random blocks) into fp32 and bf16, past one
    chunk of rows; and dequantize_rows on gathered rows, as the blocked embedding uses it."""
    blocks = random_blocks(ggml_type, 300, 512, seed=2)  # uint8 [300, row_bytes]
    expected = reference_dequantize(blocks, ggml_type)  # fp32 [300, 512]
    raw = torch.from_numpy(blocks).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw, ggml_type, (300, 512)).numpy(), expected)
    out = torch.empty(300, 512, dtype=torch.bfloat16)
    dequantize_into(raw, ggml_type, out)
    assert torch.equal(out, torch.from_numpy(expected).to(torch.bfloat16))
    picked = [7, 0, 299, 7]
    rows = torch.from_numpy(blocks)[picked]  # uint8 [4, row_bytes]
    np.testing.assert_array_equal(dequantize_rows(rows, ggml_type).numpy(), expected[picked])


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_equals_the_gguf_reference(ggml_type):
    raw, expected = quantised(ggml_type)  # 300 rows x 8 blocks
    np.testing.assert_array_equal(dequantize(raw, ggml_type, (300, 256)).numpy(), expected)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_1, T.Q5_1], ids=lambda t: t.name)
def test_many_chunks_and_a_bfloat16_target(ggml_type):
    raw, expected = quantised(ggml_type, shape=(1100, 128), seed=1)  # 4400 blocks: two chunks
    out = torch.empty(1100, 128, dtype=torch.bfloat16)
    dequantize_into(raw, ggml_type, out)
    assert torch.equal(out, torch.from_numpy(expected).to(torch.bfloat16))
    np.testing.assert_array_equal(dequantize(raw, ggml_type, (1100, 128)).numpy(), expected)
