"""The multi-LoRA op (pagedcore.lora.kernel, C++ kernel) against a naive torch loop over adapters,
through LoRALayerWeights and LoRAManager.prepare's token grouping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore.lora.kernel import lora_shrink_expand
from pagedcore.lora.layer_weights import LoRABatchRef, LoRALayerWeights


def reference(x, y, adapters, token_adapter, shard_rows):
    """y + per token: for each shard, scaled_B @ (A @ x) of the token's adapter (fp64, a plain loop)."""
    out = y.double().clone()
    for t, a in enumerate(token_adapter):
        if a < 0:
            continue
        for shard, (first, rows) in shard_rows.items():
            pair = adapters[a].get(shard)
            if pair is not None:
                A, B = pair
                out[t, first:first + rows] += B.double() @ (A.double() @ x[t].double())
    return out


def group(token_slot: np.ndarray):
    rows = np.flatnonzero(token_slot >= 0)
    rows = rows[np.argsort(token_slot[rows], kind="stable")]
    slots = token_slot[rows]
    if len(rows) == 0:
        return (torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    starts = np.concatenate(([0], np.flatnonzero(np.diff(slots)) + 1, [len(rows)])).astype(np.int32)
    return (torch.from_numpy(rows.astype(np.int32)), torch.from_numpy(slots[starts[:-1]].astype(np.int32)),
            torch.from_numpy(starts))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 7, 40])
def test_fused_layer_mixed_adapters_match_torch(dtype, num_tokens):
    g = torch.Generator().manual_seed(num_tokens)
    in_features, max_rank = 48, 16
    shard_rows = {"q": (0, 32), "k": (32, 8), "v": (40, 8)}
    ranks = [4, 16, 8]
    adapters = []
    for i, r in enumerate(ranks):  # adapter 0 leaves k alone, adapter 2 adapts q only
        shards = {"q": (torch.randn(r, in_features, generator=g), torch.randn(32, r, generator=g))}
        if i != 0:
            shards["v"] = (torch.randn(r, in_features, generator=g), torch.randn(8, r, generator=g))
        if i == 1:
            shards["k"] = (torch.randn(r, in_features, generator=g), torch.randn(8, r, generator=g))
        adapters.append(shards)
    layer = LoRALayerWeights(in_features, shard_rows, 48, num_slots=4, max_rank=max_rank, batch_ref=LoRABatchRef())
    slot_of = {0: 2, 1: 0, 2: 3}  # adapters sit in arbitrary slots
    for a, slot in slot_of.items():
        layer.set_slot(slot, adapters[a])
    token_adapter = torch.randint(-1, 3, (num_tokens,), generator=g).numpy()
    token_slot = np.array([slot_of[a] if a >= 0 else -1 for a in token_adapter], dtype=np.int32)
    x = torch.randn(num_tokens, in_features, generator=g).to(dtype)
    y0 = torch.randn(num_tokens, 48, generator=g).to(dtype)
    want = reference(x.float(), y0.float(), adapters, token_adapter, shard_rows)
    y = y0.clone()
    lora_shrink_expand(x, y, layer.a_t, layer.b_t, layer.ranks, layer.slice_starts, *group(token_slot))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol * 10)
    base_rows = torch.from_numpy(token_adapter < 0)
    assert torch.equal(y[base_rows], y0[base_rows])  # base-model rows untouched


def test_strided_x_rows_and_no_adapter_rows():
    g = torch.Generator().manual_seed(0)
    layer = LoRALayerWeights(16, {None: (0, 12)}, 12, num_slots=1, max_rank=4, batch_ref=LoRABatchRef())
    A, B = torch.randn(4, 16, generator=g), torch.randn(12, 4, generator=g)
    layer.set_slot(0, {None: (A, B)})
    wide = torch.randn(5, 40, generator=g)
    x = wide[:, 3:19]  # rows 40 apart
    y = torch.zeros(5, 12)
    lora_shrink_expand(x, y, layer.a_t, layer.b_t, layer.ranks, layer.slice_starts,
                       *group(np.array([0, -1, 0, 0, -1], dtype=np.int32)))
    torch.testing.assert_close(y[[0, 2, 3]], (x[[0, 2, 3]] @ A.t()) @ B.t(), rtol=1e-5, atol=1e-5)
    assert not y[[1, 4]].any()
    y2 = torch.ones(5, 12)
    lora_shrink_expand(x, y2, layer.a_t, layer.b_t, layer.ranks, layer.slice_starts,
                       *group(np.full(5, -1, dtype=np.int32)))
    assert torch.equal(y2, torch.ones(5, 12))


def test_bad_arguments_raise_and_write_nothing():
    layer = LoRALayerWeights(8, {None: (0, 8)}, 8, num_slots=2, max_rank=4, batch_ref=LoRABatchRef())
    x, y = torch.randn(3, 8), torch.zeros(3, 8)
    rows, slots, starts = group(np.array([0, 1, 0], dtype=np.int32))
    with pytest.raises(IndexError, match="slot 5 of 2"):
        lora_shrink_expand(x, y, layer.a_t, layer.b_t, layer.ranks, layer.slice_starts, rows,
                           torch.tensor([0, 5], dtype=torch.int32), starts)
    with pytest.raises(IndexError, match="outside"):
        lora_shrink_expand(x, y, layer.a_t, layer.b_t, layer.ranks, layer.slice_starts,
                           torch.tensor([0, 2, 7], dtype=torch.int32), slots, starts)
    with pytest.raises(ValueError, match="share fp32 or bf16"):
        lora_shrink_expand(x, y.double(), layer.a_t, layer.b_t, layer.ranks, layer.slice_starts, rows, slots, starts)
    with pytest.raises(ValueError, match="input features"):
        lora_shrink_expand(torch.randn(3, 9), y, layer.a_t, layer.b_t, layer.ranks, layer.slice_starts, rows, slots,
                           starts)
    assert not y.any()


def test_layer_forward_equals_the_checked_op_and_skips_without_a_batch():
    from pagedcore.lora.layer_weights import LoRABatch

    g = torch.Generator().manual_seed(4)
    ref = LoRABatchRef()
    layer = LoRALayerWeights(24, {"gate": (0, 16), "up": (16, 16)}, 32, num_slots=2, max_rank=8, batch_ref=ref)
    layer.set_slot(1, {"gate": (torch.randn(8, 24, generator=g), torch.randn(16, 8, generator=g)),
                       "up": (torch.randn(3, 24, generator=g), torch.randn(16, 3, generator=g))})
    x, y0 = torch.randn(6, 24, generator=g), torch.randn(6, 32, generator=g)
    assert torch.equal(layer(x, y0.clone()), y0)  # no batch: the base output as it was
    rows, slots, starts = group(np.array([1, -1, 1, 1, -1, 1], dtype=np.int32))
    ref.batch = LoRABatch(rows, slots, starts)
    want = lora_shrink_expand(x, y0.clone(), layer.a_t, layer.b_t, layer.ranks, layer.slice_starts, rows, slots, starts)
    assert torch.equal(layer(x, y0.clone()), want)
    assert not torch.equal(want, y0)
