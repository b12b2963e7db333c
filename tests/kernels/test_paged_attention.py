"""paged_attention (C++) against the naive torch reference, over mixed batches and every ISA."""

from __future__ import annotations

import pytest
import torch

import pagedcore._core as _core
from pagedcore.ops import attention as kernels

from . import reference
from .conftest import attention_tolerances, make_batch, tolerances

# (context before this step, new query rows): decode rows, prefill chunks starting mid-block and
# straddling block boundaries, a chunk starting at 0, and a long decode.
MIXED = [(37, 1), (0, 21), (100, 1), (5, 40), (16, 16), (250, 1), (3, 1), (70, 33)]


def run_both(batch, **kw):
    out = torch.full_like(batch.query, float("nan"))
    want = torch.zeros_like(batch.query)
    args = (batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc,
            batch.scale)
    kernels.paged_attention(out, batch.query, *args, **kw)
    reference.paged_attention(want, batch.query, *args)
    return out, want


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 2)])  # GQA 1, 3, 4
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32, 128])  # 128: the engine's CPU default
def test_mixed_batch_matches_reference(isa, cache_dtype, num_heads, num_kv_heads, head_size, block_size):
    batch = make_batch(MIXED, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                       block_size=block_size, cache_dtype=cache_dtype)
    out, want = run_both(batch)
    assert not out.isnan().any()
    torch.testing.assert_close(out, want, **attention_tolerances(torch.float32, cache_dtype, head_size))


@pytest.mark.parametrize("q_dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                 (torch.float32, torch.bfloat16)])
def test_dtype_combinations(isa, q_dtype, cache_dtype):
    batch = make_batch(MIXED, num_heads=6, num_kv_heads=2, head_size=64, block_size=16,
                       cache_dtype=cache_dtype, q_dtype=q_dtype)
    out, want = run_both(batch)
    assert out.dtype == q_dtype
    torch.testing.assert_close(out.float(), want.float(), **attention_tolerances(q_dtype, cache_dtype))


@pytest.mark.parametrize("head_size", [8, 40, 72, 80, 96, 256])
def test_other_head_sizes(isa, head_size):
    batch = make_batch([(9, 1), (20, 13), (1, 1)], num_heads=4, num_kv_heads=2, head_size=head_size,
                       block_size=16, seed=head_size)
    out, want = run_both(batch)
    torch.testing.assert_close(out, want, **tolerances(torch.float32))


@pytest.mark.parametrize("block_size", [1, 8, 24, 64, 256])
def test_other_block_sizes(isa, block_size):
    batch = make_batch([(50, 1), (7, 30), (0, 1)], num_heads=6, num_kv_heads=3, head_size=64,
                       block_size=block_size, seed=block_size)
    out, want = run_both(batch)
    torch.testing.assert_close(out, want, **tolerances(torch.float32))


@pytest.fixture(params=["default", "tiny_tiles", "many_partitions"])
def tuning(request):
    knobs = {"default": {}, "tiny_tiles": dict(max_tile_rows=3),
             "many_partitions": dict(max_tile_rows=8, min_partition_keys=1, items_per_thread=64)}[request.param]
    _core.set_attention_tuning(**knobs)
    yield request.param
    _core.set_attention_tuning()


@pytest.mark.parametrize("threading", ["openmp", "pool"])
def test_tiling_partitions_and_threads(isa, tuning, threading):
    saved = _core.kernel_threading()
    _core.set_kernel_threading(threading)
    try:
        batch = make_batch(MIXED, num_heads=9, num_kv_heads=3, head_size=64, block_size=16,
                           cache_dtype=torch.bfloat16, seed=3)
        out, want = run_both(batch)
    finally:
        _core.set_kernel_threading(saved)
    torch.testing.assert_close(out, want, **attention_tolerances(torch.float32, torch.bfloat16))


def test_long_decode_at_batch_one_is_partitioned_and_exact():
    # 2048 positions, one sequence: split into partitions so both cores work; the merge must not
    # change the result.
    batch = make_batch([(2047, 1)], num_heads=9, num_kv_heads=3, head_size=64, block_size=16, seed=5)
    out, want = run_both(batch)
    torch.testing.assert_close(out, want, **tolerances(torch.float32))


def test_max_length_sequence_fills_its_block_table():
    # seq_len == max_blocks_per_seq * block_size exactly, as a prefill chunk and as decode.
    batch = make_batch([(448, 64), (511, 1)], num_heads=4, num_kv_heads=1, head_size=128, block_size=32,
                       extra_columns=0, seed=6)
    assert batch.block_tables.shape[1] * 32 == 512 and (batch.block_tables != -1).all()
    out, want = run_both(batch)
    torch.testing.assert_close(out, want, **tolerances(torch.float32))


def test_large_prefill_chunk():
    batch = make_batch([(100, 512)], num_heads=9, num_kv_heads=3, head_size=64, block_size=16,
                       cache_dtype=torch.bfloat16, seed=7)
    out, want = run_both(batch)
    torch.testing.assert_close(out, want, **attention_tolerances(torch.float32, torch.bfloat16))


def test_batched_equals_loop_of_single_requests(isa):
    batch = make_batch(MIXED, num_heads=8, num_kv_heads=2, head_size=64, block_size=16, seed=8)
    out = torch.empty_like(batch.query)
    kernels.paged_attention(out, batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                            batch.seq_lens, batch.query_start_loc, batch.scale)
    qsl = batch.query_start_loc.tolist()
    for s in range(len(MIXED)):
        rows = slice(qsl[s], qsl[s + 1])
        single = torch.empty_like(batch.query[rows])
        kernels.paged_attention(single, batch.query[rows], batch.key_cache, batch.value_cache,
                                batch.block_tables[s:s + 1].contiguous(), batch.seq_lens[s:s + 1].contiguous(),
                                torch.tensor([0, qsl[s + 1] - qsl[s]], dtype=torch.int32), batch.scale)
        torch.testing.assert_close(single, out[rows], atol=1e-6, rtol=1e-6)


def test_non_contiguous_out_and_empty_sequences(isa):
    # A sequence with no rows this step (q_len 0) is skipped; out may be a strided view.
    seqs = [(10, 1), (30, 0), (5, 6)]
    batch = make_batch(seqs, num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=9)
    big = torch.zeros(batch.query.shape[0], 2 * 4, 64)
    out = big[:, ::2]
    assert not out.is_contiguous()
    kernels.paged_attention(out, batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                            batch.seq_lens, batch.query_start_loc, batch.scale)
    want = torch.zeros_like(batch.query)
    reference.paged_attention(want, batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                              batch.seq_lens, batch.query_start_loc, batch.scale)
    torch.testing.assert_close(out, want, **tolerances(torch.float32))
    assert (big[:, 1::2] == 0).all()


def test_max_hints_are_checked():
    batch = make_batch([(10, 2)], num_heads=4, num_kv_heads=2, head_size=64, block_size=16)
    out = torch.empty_like(batch.query)
    args = (out, batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, batch.scale)
    kernels.paged_attention(*args, max_query_len=2, max_seq_len=12)
    with pytest.raises(ValueError, match="max_seq_len"):
        kernels.paged_attention(*args, max_query_len=2, max_seq_len=11)
    with pytest.raises(ValueError, match="max_query_len"):
        kernels.paged_attention(*args, max_query_len=1)
