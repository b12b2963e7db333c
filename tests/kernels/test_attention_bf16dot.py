"""The attention kernel's pair-dot tiles (attention_dot_tiles.h): a bf16 or fp32 query over a bf16
cache on AVX512-BF16 (vdpbf16ps) or its portable emulation (generic16_bf16, run on every CPU), against the
naive reference, over the shapes where the tiles have edges: key tails of 1..15 keys and odd key
counts (block sizes 1, 8, 24), 16-key groups inside one block (32, 64), a last 32-element group of a
head (96, 160), heads too narrow for pairs of 32 (80: the widening tiles), prefill rows beyond a
register tile, GQA groups of 1..7, and key ranges split into partitions. Unwritten cache slots hold
NaN, so a tile that reads past a block's last key (or multiplies it by a zero probability) fails.

Tolerance: the output is bf16 (2^-9 relative rounding), an fp32 query is rounded to bf16 for the
scores (as llama.cpp rounds it to its cache's type) and the probabilities are rounded to bf16 before
P . V (as in flash attention), so the kernel must agree with the fp32 reference to 8e-3.
"""

from __future__ import annotations

import pytest
import torch

import pagedcore._core as _core

from .conftest import PAIR_DOT_ISAS, available_isas, make_batch
from .test_paged_attention import run_both

DOT_ISAS = [isa for isa in available_isas() if isa in PAIR_DOT_ISAS]
TIGHT = dict(atol=8e-3, rtol=8e-3)
# (context before this step, new query rows)
SEQS = [(37, 1), (0, 21), (100, 1), (5, 40), (16, 16), (3, 1), (70, 33), (0, 1), (14, 2)]


@pytest.fixture(params=DOT_ISAS)
def dot_isa(request):
    saved = _core.kernel_isa()
    assert _core.set_kernel_isa(request.param)
    yield request.param
    _core.set_kernel_isa(saved)


def check(batch, **kw):
    out, want = run_both(batch, **kw)
    assert out.dtype == batch.query.dtype
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want.float(), **TIGHT)


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_size", [1, 8, 16, 24, 32, 64, 128])
def test_block_sizes_and_key_tails(dot_isa, block_size, q_dtype):
    check(make_batch(SEQS, num_heads=9, num_kv_heads=3, head_size=64, block_size=block_size,
                     cache_dtype=torch.bfloat16, q_dtype=q_dtype, seed=block_size))


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_size", [32, 64, 80, 96, 128, 160, 256])
def test_head_sizes(dot_isa, head_size, q_dtype):
    check(make_batch(SEQS, num_heads=4, num_kv_heads=2, head_size=head_size, block_size=16,
                     cache_dtype=torch.bfloat16, q_dtype=q_dtype, seed=head_size))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (7, 1), (14, 2)])
def test_gqa_groups(dot_isa, num_heads, num_kv_heads):
    check(make_batch(SEQS, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=64, block_size=16,
                     cache_dtype=torch.bfloat16, q_dtype=torch.bfloat16, seed=num_heads))


@pytest.mark.parametrize("knobs", [dict(max_tile_rows=3), dict(max_tile_rows=8, min_partition_keys=1,
                                                                  items_per_thread=64)])
def test_tiles_and_partitions(dot_isa, knobs):
    _core.set_attention_tuning(**knobs)
    try:
        check(make_batch(SEQS + [(700, 1), (300, 64)], num_heads=9, num_kv_heads=3, head_size=64,
                         block_size=16, cache_dtype=torch.bfloat16, q_dtype=torch.bfloat16, seed=11))
    finally:
        _core.set_attention_tuning()


def test_long_decode_and_large_prefill(dot_isa):
    check(make_batch([(2047, 1), (100, 512)], num_heads=9, num_kv_heads=3, head_size=64, block_size=16,
                     cache_dtype=torch.bfloat16, q_dtype=torch.bfloat16, seed=12))


def test_dot_tiles_agree_with_the_widening_tiles():
    # The same batch through the AVX-512 / generic16 widening tiles and through the pair-dot tiles:
    # they may differ only by the bf16 rounding of the probabilities and of the output.
    batch = make_batch(SEQS, num_heads=9, num_kv_heads=3, head_size=64, block_size=16,
                       cache_dtype=torch.bfloat16, q_dtype=torch.bfloat16, seed=13)
    saved = _core.kernel_isa()
    outs = {}
    try:
        for isa in ("generic16", "generic16_bf16"):
            assert _core.set_kernel_isa(isa)
            outs[isa], _ = run_both(batch)
    finally:
        _core.set_kernel_isa(saved)
    torch.testing.assert_close(outs["generic16_bf16"].float(), outs["generic16"].float(), **TIGHT)
    assert not torch.equal(outs["generic16_bf16"], outs["generic16"])  # the dot tiles did run
