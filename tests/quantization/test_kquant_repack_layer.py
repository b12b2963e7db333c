"""A quantized linear layer's k-quant parts after loading (QuantLinearMethod.process_weights_after_loading):
parts of whole 16-row groups are repacked into q4_kx16 / q5_kx16 / q6_kx16 where the CPU has the
SIMD 16-lane kernels, a part of any other row count keeps the file layout (as the 32-weight formats
do), and the layer equals the float64 oracle on the file's bytes either way, and the same layer
left in the file layout (PAGEDCORE_QUANT_REPACK=0) to float tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore.layers.linear import Linear
from pagedcore.layers.linear_quant import QuantLinearMethod, QuantPart, _insert_part
from pagedcore.ops.quant_repack import repackable

from .blocks import as_tensor, random_blocks
from .reference_kernel import ReferenceQuantLinear

K = 512  # two super-blocks


def _layer(parts: list[tuple[str, T, int]], seed: int) -> tuple[Linear, list[torch.Tensor]]:
    """A layer of `parts` (format name, ggml type, rows) of random blocks, as the loader leaves it."""
    rows = sum(n for _, _, n in parts)
    layer = Linear(K, rows, False, QuantLinearMethod("gguf"))
    raw, start = [], 0
    for i, (fmt, ggml_type, n) in enumerate(parts):
        blocks = as_tensor(random_blocks(ggml_type, n, K, seed=seed + i))  # uint8 [n, row_bytes]
        raw.append(blocks.clone())
        _insert_part(layer, QuantPart(fmt, start, n, blocks))
        start += n
    return layer, raw


@pytest.mark.parametrize("parts", [
    [("q4_k", T.Q4_K, 48), ("q6_k", T.Q6_K, 40)],  # 40 rows: not whole groups of 16
    [("q5_k", T.Q5_K, 32), ("q4_k", T.Q4_K, 24), ("q6_k", T.Q6_K, 16)],
], ids=["q4_k48-q6_k40", "q5_k32-q4_k24-q6_k16"])
@pytest.mark.parametrize("M", [1, 3, 17, 64])
def test_kquant_parts_repack_in_whole_groups_and_equal_the_oracle(monkeypatch, parts, M):
    layer, raw = _layer(parts, seed=M)
    layer.method.process_weights_after_loading(layer)
    assert layer.method.formats(layer) == [repackable(fmt, n) or fmt for fmt, _, n in parts]
    file_layer, _ = _layer(parts, seed=M)
    monkeypatch.setenv("PAGEDCORE_QUANT_REPACK", "0")
    file_layer.method.process_weights_after_loading(file_layer)
    assert file_layer.method.formats(file_layer) == [fmt for fmt, _, _ in parts]

    x = torch.from_numpy(np.random.default_rng(M).standard_normal((M, K)).astype(np.float32))
    y, y_file = layer(x).double(), file_layer(x).double()
    start = 0
    for (fmt, _, n), blocks in zip(parts, raw):
        oracle = ReferenceQuantLinear(blocks, fmt, K)
        want = oracle(x).double()  # [M, n]
        size = x.double().abs() @ oracle.w.abs().T  # the sums' magnitude: the float tolerance's scale
        tol = 2e-5 * size + 1e-6
        for got in (y[:, start:start + n], y_file[:, start:start + n]):
            assert ((got - want).abs() <= tol).all(), (fmt, M, (got - want).abs().max().item())
        start += n
