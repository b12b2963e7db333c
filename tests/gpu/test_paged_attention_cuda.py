"""CUDA paged attention against tests.kernels.reference and the CPU kernels."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import make_batch, requires_cuda, tolerances

pytestmark = [pytest.mark.gpu, requires_cuda]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def run(kc, b, *, known_bounds=True):
    out = b.out_like_query()
    kc.paged_attention(out, b.query, b.key_cache, b.value_cache, b.block_tables, b.seq_lens, b.query_start_loc,
                       b.scale, b.max_query_len if known_bounds else None, b.max_seq_len if known_bounds else None)
    torch.cuda.synchronize()
    return out


def check(out, b, dtype):
    want = b.reference()
    got = out.float().cpu()
    torch.testing.assert_close(got, want, **tolerances(dtype))
    # the spare head after the out slice (out_like_query) is never written
    assert bool((out._base[:, -1].float() == 4096.0).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (12, 1)], ids=["mha", "gqa4", "gqa12"])
def test_decode_matches_reference(kernels_cuda, dtype, head_size, block_size, heads):
    seqs = [(0, 1), (16, 1), (200, 1), (700, 1), (33, 1)]
    b = make_batch(seqs, num_heads=heads[0], num_kv_heads=heads[1], head_size=head_size, block_size=block_size,
                   cache_dtype=dtype, seed=head_size + block_size)
    check(run(kernels_cuda, b), b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefill", ["tensor_cores", "cuda_cores"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_mixed_decode_and_prefill_chunks(kernels_cuda, dtype, prefill, head_size):
    kernels_cuda.set_attention_tuning(prefill=prefill)
    # prefill chunks with and without cached context, decode rows, a sequence with no new rows
    seqs = [(0, 37), (20, 1), (50, 19), (0, 1), (5, 0), (70, 5), (300, 64), (0, 130)]
    b = make_batch(seqs, num_heads=8, num_kv_heads=2, head_size=head_size, block_size=16, cache_dtype=dtype, seed=3)
    check(run(kernels_cuda, b), b, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("partition_size", [0, 128, 512, 1000])
def test_long_contexts_use_several_partitions(kernels_cuda, dtype, partition_size):
    kernels_cuda.set_attention_tuning(partition_size=partition_size)
    seqs = [(4095, 1), (8191, 1), (1000, 1), (3, 1)]
    b = make_batch(seqs, num_heads=32, num_kv_heads=8, head_size=128, block_size=16, cache_dtype=dtype, seed=5)
    check(run(kernels_cuda, b), b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unknown_bounds_plan_from_the_table(kernels_cuda, dtype):
    seqs = [(0, 9), (45, 1), (17, 1), (600, 3)]
    b = make_batch(seqs, num_heads=4, num_kv_heads=1, head_size=128, block_size=32, cache_dtype=dtype,
                   extra_columns=40, seed=7)
    check(run(kernels_cuda, b, known_bounds=False), b, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_rows_on_the_tile_kernel(kernels_cuda, dtype):
    kernels_cuda.set_attention_tuning(decode="tile_kernel")
    seqs = [(0, 1), (45, 1), (17, 4), (300, 1)]
    b = make_batch(seqs, num_heads=16, num_kv_heads=2, head_size=64, block_size=16, cache_dtype=dtype, seed=11)
    check(run(kernels_cuda, b), b, dtype)


@pytest.mark.parametrize("heads", [(16, 1), (80, 1), (28, 4)], ids=["gqa16", "mqa80", "gqa7"])
def test_wide_groups(kernels_cuda, heads):
    seqs = [(12, 11), (0, 6), (90, 1), (40, 1)]
    b = make_batch(seqs, num_heads=heads[0], num_kv_heads=heads[1], head_size=64, block_size=16,
                   cache_dtype=torch.bfloat16, seed=13)
    check(run(kernels_cuda, b), b, torch.bfloat16)


def test_fp32_query_over_a_bf16_cache(kernels_cuda):
    seqs = [(30, 20), (64, 1)]
    b = make_batch(seqs, num_heads=8, num_kv_heads=4, head_size=128, block_size=16, cache_dtype=torch.bfloat16,
                   q_dtype=torch.float32, seed=17)
    check(run(kernels_cuda, b), b, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_the_cpu_kernels(kernels_cuda, dtype):
    from pagedcore.ops import attention as kernels

    seqs = [(0, 23), (40, 1), (130, 17), (511, 1)]
    b = make_batch(seqs, num_heads=8, num_kv_heads=2, head_size=128, block_size=16, cache_dtype=dtype, seed=19)
    got = run(kernels_cuda, b).cpu()
    want = torch.empty(b.query.shape, dtype=dtype)
    kernels.paged_attention(want, b.query.cpu(), b.key_cache.cpu(), b.value_cache.cpu(), b.block_tables.cpu(),
                            b.seq_lens.cpu(), b.query_start_loc.cpu(), b.scale)
    torch.testing.assert_close(got.float(), want.float(), **tolerances(dtype))


def test_batched_equals_one_request_at_a_time(kernels_cuda):
    seqs = [(0, 37), (20, 1), (50, 19), (300, 1)]
    b = make_batch(seqs, num_heads=8, num_kv_heads=2, head_size=64, block_size=16, cache_dtype=torch.float32,
                   seed=23)
    batched = run(kernels_cuda, b)
    qsl = b.query_start_loc.tolist()
    for s in range(len(seqs)):
        rows = slice(qsl[s], qsl[s + 1])
        one = torch.empty_like(b.query[rows])
        kernels_cuda.paged_attention(one, b.query[rows], b.key_cache, b.value_cache, b.block_tables[s:s + 1],
                                     b.seq_lens[s:s + 1], b.query_start_loc.new_tensor([0, qsl[s + 1] - qsl[s]]),
                                     b.scale)
        torch.testing.assert_close(one, batched[rows], atol=1e-5, rtol=1e-5)


def test_decode_replays_under_a_cuda_graph(kernels_cuda):
    seqs = [(100, 1), (3000, 1), (7, 1)]
    b = make_batch(seqs, num_heads=32, num_kv_heads=8, head_size=128, block_size=16, seed=29)
    out = torch.empty_like(b.query)

    def step():
        kernels_cuda.paged_attention(out, b.query, b.key_cache, b.value_cache, b.block_tables, b.seq_lens,
                                     b.query_start_loc, b.scale, 1, b.max_seq_len)

    step()  # eager warm-up sizes the workspace outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float().cpu(), b.reference(), **tolerances(torch.bfloat16))


def test_bad_block_ids_give_numbers_not_faults(kernels_cuda):
    b = make_batch([(40, 1), (10, 5)], num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=31)
    b.block_tables[0, 1] = 1 << 20  # outside the cache
    b.block_tables[1, 0] = -7
    run(kernels_cuda, b)  # completes; the context stays usable
    torch.cuda.synchronize()
    assert torch.ones(1, device="cuda").item() == 1.0


# ---- misuse: clear errors, nothing launched ----

def small_batch():
    return make_batch([(5, 3), (9, 1)], num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=37)


def call(kc, b, **override):
    args = dict(out=torch.empty_like(b.query), query=b.query, key_cache=b.key_cache, value_cache=b.value_cache,
                block_tables=b.block_tables, seq_lens=b.seq_lens, query_start_loc=b.query_start_loc, scale=b.scale)
    args.update(override)
    kc.paged_attention(**args)


def test_cpu_tensors_are_refused(kernels_cuda):
    b = small_batch()
    with pytest.raises(ValueError, match="CUDA tensors.*block_tables on cpu"):
        call(kernels_cuda, b, block_tables=b.block_tables.cpu())


def test_unsupported_head_size_and_block_size(kernels_cuda):
    b = make_batch([(5, 3)], num_heads=2, num_kv_heads=1, head_size=96, block_size=16)
    with pytest.raises(ValueError, match="head_size 96"):
        call(kernels_cuda, b)
    b = make_batch([(5, 3)], num_heads=2, num_kv_heads=1, head_size=64, block_size=24)
    with pytest.raises(ValueError, match="power of two"):
        call(kernels_cuda, b)


def test_wrong_dtypes_and_shapes(kernels_cuda):
    b = small_batch()
    with pytest.raises(TypeError, match="torch.int32"):
        call(kernels_cuda, b, block_tables=b.block_tables.long())
    with pytest.raises(TypeError, match="empty_like"):
        call(kernels_cuda, b, out=torch.empty_like(b.query, dtype=torch.float32))
    with pytest.raises(ValueError, match="multiple"):
        call(kernels_cuda, b, query=torch.randn(4, 3, 64, device="cuda", dtype=torch.bfloat16),
             out=torch.empty(4, 3, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        call(kernels_cuda, b, key_cache=b.key_cache.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(TypeError, match="float16"):
        call(kernels_cuda, b, key_cache=b.key_cache.double(), value_cache=b.value_cache.double())


def test_tuning_is_checked(kernels_cuda):
    with pytest.raises(ValueError, match="prefill"):
        kernels_cuda.set_attention_tuning(prefill="fast")
    with pytest.raises(ValueError, match="partition_size"):
        kernels_cuda.set_attention_tuning(partition_size=-1)
