"""KV cache sizing and allocation: from a memory budget to a number of blocks, and the tensors.

Layout (one tensor for the whole model, see pagedcore.kernels):
    kv_cache [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim]
    kv_cache[layer, 0] = key_cache, kv_cache[layer, 1] = value_cache
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from pagedcore import _core
from pagedcore.config import EngineConfig, parse_memory_size
from pagedcore.model_config import SUPPORTED_DTYPES, ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3   # vLLM-CPU's default KV space
DEFAULT_CPU_KV_CACHE_FRACTION = 0.4        # ...but never more than this share of available memory
GiB = 1024**3


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
                   SUPPORTED_DTYPES[dtype])


def cpu_kv_cache_budget(config: EngineConfig) -> int:
    """Bytes for the device KV cache on the CPU: explicit bytes, a fraction of available memory,
    or the default (4 GiB, capped at 40% of what is available)."""
    available = available_memory_bytes()
    if config.kv_cache_memory is None:
        return min(DEFAULT_CPU_KV_CACHE_BYTES, int(available * DEFAULT_CPU_KV_CACHE_FRACTION))
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
    text = (f"KV cache: {spec.bytes_per_token_per_layer} B/token/layer x {spec.num_layers} layers = "
            f"{spec.bytes_per_token_per_layer * spec.num_layers / 1024:.1f} KiB/token; {num_blocks} blocks x "
            f"{spec.block_size} tokens = {tokens} tokens of context in {total / GiB:.2f} GiB")
    if budget_bytes is not None:
        text += f" (budget {budget_bytes / GiB:.2f} GiB)"
    return text


def gpu_kv_cache_budget(config: EngineConfig, spec: KVCacheSpec, model: torch.nn.Module) -> int:
    """Bytes for the KV cache on a GPU: gpu_memory_utilization of its memory, minus the peak of a
    profiled forward of the largest step (weights + activations + logits), as vLLM sizes it."""
    from pagedcore.engine.model_runner import ModelRunner

    device = torch.device(config.device)
    num_tokens = config.max_num_batched_tokens
    seq_len = min(num_tokens, config.max_model_len)
    num_seqs = -(-num_tokens // seq_len)
    scratch = allocate(spec, num_seqs * -(-seq_len // spec.block_size), device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    ModelRunner(model, scratch, None, device).profile_forward(num_tokens, num_seqs, seq_len,
                                                              min(config.max_num_seqs, num_tokens))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - scratch.numel() * scratch.element_size()
    del scratch
    torch.cuda.empty_cache()
    _, total = torch.cuda.mem_get_info(device)
    budget = int(total * config.gpu_memory_utilization) - peak
    logger.info("GPU memory: %.2f GiB total x %.2f utilization - %.2f GiB peak of a profiled %d-token step "
                "= %.2f GiB for the KV cache", total / GiB, config.gpu_memory_utilization, peak / GiB,
                num_tokens, budget / GiB)
    if budget <= 0:
        raise ValueError(f"no GPU memory left for the KV cache (peak {peak / GiB:.2f} GiB of {total / GiB:.2f} GiB); "
                         "raise --gpu-memory-utilization or lower --max-num-batched-tokens")
    return budget


def allocate(spec: KVCacheSpec, num_blocks: int, device: str | torch.device = "cpu",
             pin_memory: bool = False) -> torch.Tensor:
    """Uninitialised on purpose: every slot a kernel reads was written first (positions < seq_len),
    and not touching the pages keeps start-up fast and memory committed only as it is used.

    PAGEDCORE_KV_HUGE_PAGES=1 advises a CPU cache onto transparent huge pages while still
    untouched: attention reads 4 KB planes from blocks scattered over gigabytes, and with 4 KB pages
    nearly each one is a TLB miss; warm, the decode attention ran ~10% faster. Off by default: with
    THP defrag in "madvise" mode each first touch of a 2 MB page compacts memory synchronously, and
    the 64-request benchmark (`pagedcore bench throughput --num-prompts 64`) ran 3-9% slower end
    to end (163.2 and 153.6 vs 169.7 and 168.8 tok/s without). A long-running server pays that once."""
    cache = torch.empty(spec.shape(num_blocks), dtype=spec.dtype, device=device, pin_memory=pin_memory)
    if cache.is_cpu and not pin_memory and cache.numel() and os.environ.get("PAGEDCORE_KV_HUGE_PAGES") == "1":
        advise = getattr(_core, "advise_huge_pages", None)
        if advise is not None:
            advised = advise(cache.data_ptr(), cache.numel() * cache.element_size())
            logger.debug("KV cache: %.2f GiB advised onto huge pages", advised / GiB)
    return cache
