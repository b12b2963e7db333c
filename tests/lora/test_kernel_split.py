"""The multi-LoRA kernel's split path: with fewer tiles of tokens than threads (decode, one token per
adapter) and big enough stacks, each tile's shrink and expand are shared out over column ranges
(cpp/kernels/lora_impl.h run_split). Every element sums the same terms in the same order as the one-
thread-per-tile path, so a token's result is the same bits either way; both against fp64 torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore import _core
from pagedcore.lora.kernel import lora_shrink_expand
from pagedcore.lora.layer_weights import LoRABatchRef, LoRALayerWeights

from .test_kernel import group, reference

IN, HALF, RANK = 1024, 1000, 16  # a gate_up-like layer: 2 slices of 1000 columns (not a multiple of 16)
SHARDS = {"gate": (0, HALF), "up": (HALF, HALF)}


def _layer(g):
    layer = LoRALayerWeights(IN, SHARDS, 2 * HALF, num_slots=2, max_rank=RANK, batch_ref=LoRABatchRef())
    adapters = [
        {"gate": (torch.randn(RANK, IN, generator=g) * 0.05, torch.randn(HALF, RANK, generator=g) * 0.05),
         "up": (torch.randn(RANK, IN, generator=g) * 0.05, torch.randn(HALF, RANK, generator=g) * 0.05)},
        {"up": (torch.randn(8, IN, generator=g) * 0.05, torch.randn(HALF, 8, generator=g) * 0.05)},  # gate unadapted
    ]
    for slot, shards in enumerate(adapters):
        layer.set_slot(slot, shards)
    return layer, adapters


@pytest.mark.skipif(_core.kernel_max_threads() < 2, reason="one kernel thread: every call takes the tiled path")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("adapter", [0, 1])
def test_split_equals_the_tiled_path_and_torch(dtype, adapter):
    g = torch.Generator().manual_seed(3 + adapter)
    layer, adapters = _layer(g)
    x = torch.randn(17, IN, generator=g).to(dtype)
    y0 = torch.randn(17, 2 * HALF, generator=g).to(dtype)
    args = (layer.a_t, layer.b_t, layer.ranks, layer.slice_starts)
    # Alone: one tile (the split path on a 2-thread build).
    alone = y0[:1].clone()
    lora_shrink_expand(x[:1], alone, *args, *group(np.array([adapter], dtype=np.int32)))
    # With 16 more rows on the other slot: three tiles, one thread each.
    slots = np.array([adapter] + [1 - adapter] * 16, dtype=np.int32)
    batch = y0.clone()
    lora_shrink_expand(x, batch, *args, *group(slots))
    assert torch.equal(alone[0], batch[0])
    want = reference(x.float(), y0.float(), adapters, slots, SHARDS)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(batch.double(), want, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(alone.double(), want[:1], rtol=tol, atol=tol * 10)
