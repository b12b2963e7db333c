"""KV cache sizing and allocation: from a memory budget to a number of blocks, and the tensors.

Layout (one tensor for the whole model, see pagedcore.kernels):
    kv_cache [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim]
    kv_cache[layer, 0] = key_cache, kv_cache[layer, 1] = value_cache

That is the tensor's shape everywhere. In memory a GPU cache (and a pinned swap pool) is contiguous in
that order ("layer-major"); an unpinned CPU cache is block-major, [num_blocks, num_layers, 2, num_kv_heads,
block_size, head_dim] permuted to the shape above, so one block's K and V of every layer lie together
(block_bytes apart; the kernels take the block stride). Why: decode attention reads each sequence's
blocks once a layer, and where they are scattered over the cache (a long-running server's free list)
each 2 KB plane costs a page walk; with all layers of a block in one 368 KB run (default model, bf16)
layers 1..29 presumably find the page-table lines layer 0 loaded (bench/micro/kv_layout_reads.cc: a token's K/V
978-986 us against 1353-1403 layer-major). In the engine (Zen 5 VM, bench/bench_kv_layout.py): 1.01-1.09x
with the free list shuffled, the same with a fresh engine's ascending block ids. PAGEDCORE_KV_LAYOUT=
layer_major keeps the old layout.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from pagedcore.config import EngineConfig, parse_memory_size
from pagedcore.engine import host_memory
from pagedcore.model_config import SUPPORTED_DTYPES, ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3   # vLLM-CPU's default KV space
DEFAULT_CPU_KV_CACHE_FRACTION = 0.4        # ...but never more than this share of available memory
GiB = 1024**3
# --kv-cache-dtype names (EngineConfig.kv_cache_dtype, resolved) -> the cache tensor's dtype. The fp8 formats
# (vLLM's fp8 / fp8_e4m3 / fp8_e5m2, scale 1) are stored and read by the CPU kernels (cpp/kernels/fp8.h).
KV_CACHE_DTYPES: dict[str, torch.dtype] = {**SUPPORTED_DTYPES, "fp8_e4m3": torch.float8_e4m3fn,
                                           "fp8_e5m2": torch.float8_e5m2}


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else total RAM."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_token_per_layer(self) -> int:
        # K and V, every kv head, head_dim elements each.
        return 2 * self.num_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token_per_layer * self.num_layers * self.block_size

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, 2, num_blocks, self.num_kv_heads, self.block_size, self.head_dim)

    @classmethod
    def of(cls, model_config: ModelConfig, block_size: int, dtype: str) -> KVCacheSpec:
        return cls(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, block_size,
                   KV_CACHE_DTYPES[dtype])


def cpu_kv_cache_budget(config: EngineConfig, spec: KVCacheSpec | None = None) -> int:
    """Bytes for the device KV cache on the CPU: explicit bytes, a fraction of available memory,
    or the default (4 GiB, capped at 40% of what is available, and, given the spec, at what
    max_num_seqs sequences of max_model_len tokens can ever fill: the cache is committed at start,
    so a small model must not hold gigabytes it can never use)."""
    available = available_memory_bytes()
    if config.kv_cache_memory is None:
        budget = min(DEFAULT_CPU_KV_CACHE_BYTES, int(available * DEFAULT_CPU_KV_CACHE_FRACTION))
        if spec is not None and config.max_model_len:
            blocks_per_seq = -(-config.max_model_len // spec.block_size)
            budget = min(budget, config.max_num_seqs * blocks_per_seq * spec.bytes_per_block)
        return budget
    size = parse_memory_size(config.kv_cache_memory)
    budget = int(available * size) if isinstance(size, float) else size
    if budget > available:
        raise ValueError(f"kv_cache_memory asks for {budget / GiB:.2f} GiB but only {available / GiB:.2f} GiB "
                         f"is available; lower --kv-cache-memory")
    return budget


def num_blocks_for(spec: KVCacheSpec, budget_bytes: int) -> int:
    return budget_bytes // spec.bytes_per_block


def describe(spec: KVCacheSpec, num_blocks: int, budget_bytes: int | None = None) -> str:
    tokens = num_blocks * spec.block_size
    total = num_blocks * spec.bytes_per_block
    text = (f"KV cache ({str(spec.dtype).removeprefix('torch.')}): {spec.bytes_per_token_per_layer} B/token/layer x {spec.num_layers} layers = "
            f"{spec.bytes_per_token_per_layer * spec.num_layers / 1024:.1f} KiB/token; {num_blocks} blocks x "
            f"{spec.block_size} tokens = {tokens} tokens of context in {total / GiB:.2f} GiB")
    if budget_bytes is not None:
        text += f" (budget {budget_bytes / GiB:.2f} GiB)"
    return text


@dataclass(frozen=True)
class ProfileShape:
    """The largest step the scheduler can build: num_seqs sequences of seq_len tokens, num_tokens in
    all, and logits for num_logits_rows of them. Its forward's peak memory sizes the GPU KV cache."""
    num_tokens: int
    num_seqs: int
    seq_len: int
    num_logits_rows: int

    @classmethod
    def largest_step(cls, config: EngineConfig) -> ProfileShape:
        num_tokens = config.max_num_batched_tokens
        seq_len = min(num_tokens, config.max_model_len)
        return cls(num_tokens, -(-num_tokens // seq_len), seq_len, min(config.max_num_seqs, num_tokens))

    def num_blocks(self, block_size: int) -> int:
        """Blocks of the scratch cache the profiled forward writes into."""
        return self.num_seqs * -(-self.seq_len // block_size)


def gpu_kv_cache_budget(config: EngineConfig, total_bytes: int, peak_bytes: int, shape: ProfileShape) -> int:
    """Bytes for the KV cache on a GPU: gpu_memory_utilization of its memory (total_bytes), minus the
    peak of a profiled forward of the largest step (weights + activations + logits; the worker
    measures it, see Worker.profile_memory), as vLLM sizes it."""
    budget = int(total_bytes * config.gpu_memory_utilization) - peak_bytes
    logger.info("GPU memory: %.2f GiB total x %.2f utilization - %.2f GiB peak of a profiled %d-token step "
                "= %.2f GiB for the KV cache", total_bytes / GiB, config.gpu_memory_utilization, peak_bytes / GiB,
                shape.num_tokens, budget / GiB)
    if budget <= 0:
        raise ValueError(f"no GPU memory left for the KV cache (peak {peak_bytes / GiB:.2f} GiB of "
                         f"{total_bytes / GiB:.2f} GiB); raise --gpu-memory-utilization or lower "
                         "--max-num-batched-tokens")
    return budget


def block_major_default(device: str | torch.device, pin_memory: bool = False) -> bool:
    """Whether allocate lays a cache out block-major: unpinned CPU caches, unless
    PAGEDCORE_KV_LAYOUT=layer_major (the CUDA kernels and their pinned swap pools are layer-major)."""
    layout = os.environ.get("PAGEDCORE_KV_LAYOUT", "block_major")
    if layout not in ("block_major", "layer_major"):
        raise ValueError(f"PAGEDCORE_KV_LAYOUT={layout!r}; use block_major or layer_major")
    return torch.device(device).type == "cpu" and not pin_memory and layout == "block_major"


def allocate(spec: KVCacheSpec, num_blocks: int, device: str | torch.device = "cpu",
             pin_memory: bool = False, background_commit: bool = False,
             block_major: bool | None = None) -> torch.Tensor:
    """Uninitialised (every slot a kernel reads was written first: positions < seq_len) but committed:
    a CPU cache's pages are made resident here (host_memory.commit_pages), so the process holds at
    start what it reserved and its RSS stays flat under load. Left to first touch, the pages came in
    one block at a time as the LRU free list walked the pool, and RSS grew under load until the whole
    cache was resident (issue "Memory grows without bound under load"). Pinned caches are resident
    already.

    PAGEDCORE_KV_HUGE_PAGES=1 advises a CPU cache onto 2 MB transparent huge pages before the
    commit: attention reads 4 KB planes from blocks scattered over gigabytes, and with 4 KB pages
    nearly each one is a TLB miss (warm, decode attention ran ~10% faster). Off by default: committing
    4 GiB onto huge pages took 12-13 s at start-up against ~1-2 s in 4 KB pages (THP compaction, AMD
    EPYC Zen 5 KVM guest), and the 64-request benchmark ran no faster (216 vs 215 / 209 output tok/s),
    as it ran 3-9% slower when the huge pages were faulted in inside the step loop (AVX2 EPYC).

    background_commit (EngineConfig.kv_cache_commit="background", the default) returns at once and
    commits on a thread (host_memory.commit_in_background): the same resident cache seconds later, without
    holding start-up for it (4 GiB: 21.9 of `LLM()`'s 22.9 s on a cold Zen 5 VM, 2026-12-04).

    block_major (None: block_major_default) returns the [num_layers, 2, num_blocks, ...] view of a
    contiguous [num_blocks, num_layers, 2, ...] tensor (see the module docstring)."""
    if block_major is None:
        block_major = block_major_default(device, pin_memory)
    if block_major:
        if pin_memory or torch.device(device).type != "cpu":
            raise ValueError("a block-major KV cache is for unpinned CPU memory only (the CUDA kernels read "
                             "layer-major caches)")
        num_layers, two, *rest = spec.shape(num_blocks)
        physical = torch.empty((rest[0], num_layers, two, *rest[1:]), dtype=spec.dtype)
        _commit(physical, background_commit)
        return physical.permute(1, 2, 0, 3, 4, 5)                    # [num_layers, 2, num_blocks, ...]
    cache = torch.empty(spec.shape(num_blocks), dtype=spec.dtype, device=device, pin_memory=pin_memory)
    if cache.is_cpu and not pin_memory:
        _commit(cache, background_commit)
    return cache


def _commit(cache: torch.Tensor, background_commit: bool) -> None:
    """Makes a contiguous CPU cache resident: now, or on a thread (allocate's docstring)."""
    huge_pages = os.environ.get("PAGEDCORE_KV_HUGE_PAGES") == "1"
    if background_commit and not huge_pages:
        what = f"KV cache [{', '.join(map(str, cache.shape))}]"
        if host_memory.commit_in_background(cache, what) is not None:
            logger.info("%s: committing %.2f GiB in the background", what, cache.nbytes / GiB)
            return
    t0 = time.perf_counter()
    committed, advised = host_memory.commit_pages(cache, huge_pages=huge_pages)
    logger.info("KV cache: %.2f GiB committed in %.2f s (%.2f GiB advised onto huge pages)",
                committed / GiB, time.perf_counter() - t0, advised / GiB)
