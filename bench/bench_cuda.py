"""CUDA paged attention: microseconds per call and achieved K/V bandwidth (decode) or TFLOP/s (prefill).

    python bench/bench_cuda.py            # a short table, ~1 minute on an H200

One layer of a Llama-3-8B-shaped model (32 query heads, 8 kv heads, head_size 128, bf16 cache, block
size 16) with shuffled block tables. Decode rows read every cached K/V byte once, so K/V bytes / time
is the figure to hold against the HBM bandwidth (an H200: about 4.8 TB/s by the datasheet, about
4.3 TB/s measured for a device-to-device copy). Times are CUDA-event means over many launches of the
same call, launch overhead included (what an eager engine pays; CUDA graphs remove most of it).
"""

from __future__ import annotations

import argparse
import sys

import torch

PEAK_GBPS = 4800.0  # H200 HBM3e, datasheet


def build(num_seqs, context_len, q_len, *, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
          dtype=torch.bfloat16, seed=0):
    """A batch of num_seqs sequences, each with context_len cached tokens and q_len new rows."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq_len = context_len + q_len
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    block_tables = perm.view(num_seqs, blocks_per_seq).contiguous()
    key_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_size, device="cuda", dtype=dtype,
                            generator=gen)
    value_cache = torch.randn_like(key_cache)
    num_tokens = num_seqs * q_len
    query = torch.randn(num_tokens, num_heads, head_size, device="cuda", dtype=dtype, generator=gen)
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda")
    qsl = torch.arange(0, num_tokens + 1, q_len, dtype=torch.int32, device="cuda")
    return dict(query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                seq_lens=seq_lens, query_start_loc=qsl, scale=head_size ** -0.5, max_query_len=q_len,
                max_seq_len=seq_len)


def time_call(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # microseconds


def bench_attention(kc, batch, iters):
    out = torch.empty_like(batch["query"])

    def call():
        kc.paged_attention(out, batch["query"], batch["key_cache"], batch["value_cache"], batch["block_tables"],
                           batch["seq_lens"], batch["query_start_loc"], batch["scale"], batch["max_query_len"],
                           batch["max_seq_len"])

    return time_call(call, iters)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 1
    from pagedcore.ops import attention_cuda as kc

    if not kc.is_available():
        print("pagedcore._core was built without CUDA", file=sys.stderr)
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'case':44s} {'us/call':>9s} {'K/V GB/s':>9s} {'% of 4.8TB/s':>12s} {'TFLOP/s':>8s}")
    kv_bytes_per_token = 2 * 8 * 128 * 2  # K and V, 8 kv heads, head_size 128, bf16
    for context_len in (512, 4096):
        for num_seqs in (1, 32, 256):
            batch = build(num_seqs, context_len - 1, 1)
            us = bench_attention(kc, batch, args.iters)
            gbps = num_seqs * context_len * kv_bytes_per_token / (us * 1e-6) / 1e9
            print(f"{f'decode batch {num_seqs:3d} context {context_len}':44s} {us:9.1f} {gbps:9.0f} "
                  f"{100 * gbps / PEAK_GBPS:11.1f}% {'':>8s}")
            del batch
    for context_len in (0, 2048):
        for impl in ("tensor_cores", "cuda_cores"):
            kc.set_attention_tuning(prefill=impl)
            batch = build(1, context_len, 2048)
            us = bench_attention(kc, batch, max(5, args.iters // 5))
            # causal: row j sees context_len + j + 1 keys; 2 matmuls x 2 flops per multiply-add
            keys_seen = 2048 * context_len + 2048 * 2049 / 2
            tflops = 4 * 32 * 128 * keys_seen / (us * 1e-6) / 1e12
            print(f"{f'prefill 2048 rows, context {context_len}, {impl}':44s} {us:9.1f} {'':>9s} {'':>12s} "
                  f"{tflops:8.1f}")
            del batch
    kc.set_attention_tuning()
    return 0


if __name__ == "__main__":
    sys.exit(main())
