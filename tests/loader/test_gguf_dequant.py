"""Our vectorised dequantisation against the gguf package's reference, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize

from pagedcore.loader.gguf_dequant import SUPPORTED_TYPES, dequantize, dequantize_into

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1]


def quantised(ggml_type: T, shape=(300, 256), seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    packed = np.ascontiguousarray(quantize(values, ggml_type))
    return torch.from_numpy(packed).view(torch.uint8).reshape(-1), reference_dequantize(packed, ggml_type)


def test_supported_types_are_the_documented_ones():
    assert set(SUPPORTED_TYPES) == {t.name for t in TYPES}


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_equals_the_gguf_reference(ggml_type):
    raw, expected = quantised(ggml_type)  # 300 rows x 8 blocks
    np.testing.assert_array_equal(dequantize(raw, ggml_type, (300, 256)).numpy(), expected)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_1], ids=lambda t: t.name)
def test_many_chunks_and_a_bfloat16_target(ggml_type):
    raw, expected = quantised(ggml_type, shape=(1100, 128), seed=1)  # 4400 blocks: two chunks
    out = torch.empty(1100, 128, dtype=torch.bfloat16)
    dequantize_into(raw, ggml_type, out)
    assert torch.equal(out, torch.from_numpy(expected).to(torch.bfloat16))
    np.testing.assert_array_equal(dequantize(raw, ggml_type, (1100, 128)).numpy(), expected)
