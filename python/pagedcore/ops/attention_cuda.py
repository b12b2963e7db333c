"""The paged KV-cache ops on CUDA tensors: write K/V into the cache, paged attention, block copy and swap.

Same four functions, signatures and contract as pagedcore.ops.attention (the CPU ops), for tensors
on a CUDA device: each checks device, dtype, shape, strides and contiguity, raising TypeError or
ValueError with the fix in the message, then hands data pointers, sizes, strides and the current CUDA
stream to pagedcore._core (cuda/). Launches are asynchronous on torch.cuda.current_stream().

KV cache layout (one tensor for the whole model), fp32, bf16 or fp16:
    kv_cache  [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size]
    kv_cache[layer, 0] = key_cache, kv_cache[layer, 1] = value_cache, each
              [num_blocks, num_kv_heads, block_size, head_size]
Slot of the token at position p: block_table[p // block_size] * block_size + p % block_size.

Index contents (slots, block ids, lengths) stay on the GPU and are not read back: a slot or block id
outside the cache writes or reads nothing rather than faulting. Block mappings given on the CPU are
checked (IndexError), as in pagedcore.ops.attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedcore import _core
from pagedcore.ops import checks
from pagedcore.ops.dtypes import CUDA_DTYPE_CODES, dtype_code

__all__ = ["reshape_and_cache", "paged_attention", "copy_blocks", "swap_blocks", "set_attention_tuning",
           "is_available"]

HEAD_SIZES = (64, 128, 256)
MAX_BLOCK_SIZE = 256


def is_available() -> bool:
    """True when the extension has the CUDA kernels and torch sees a GPU."""
    return _core.has_cuda and torch.cuda.is_available()


@dataclass
class _Tuning:
    partition_size: int = 0  # decode: context tokens per CTA; 0 = planned per call
    prefill: str = "auto"  # "auto" | "tensor_cores" | "cuda_cores"
    decode: str = "decode_kernel"  # "decode_kernel" | "tile_kernel"


_PREFILL_CODE = {"auto": 0, "tensor_cores": 1, "cuda_cores": 2}
_DECODE_CODE = {"decode_kernel": 0, "tile_kernel": 1}
_tuning = _Tuning()


def set_attention_tuning(partition_size: int = 0, prefill: str = "auto", decode: str = "decode_kernel") -> None:
    """Picks paged_attention's implementations (tests, benchmarks); no arguments restores the defaults.

    partition_size: decode rows split their context into partitions of this many tokens (0 = planned
        from the batch and the GPU's SM count).
    prefill: "auto" (tensor cores for bf16/fp16 caches), "tensor_cores" or "cuda_cores".
    decode: "decode_kernel" (flash-decoding for q_len == 1) or "tile_kernel" (every row on the prefill kernel).
    """
    if partition_size < 0:
        raise ValueError(f"partition_size must be >= 0 (0 = planned), got {partition_size}")
    if prefill not in _PREFILL_CODE:
        raise ValueError(f"prefill must be one of {sorted(_PREFILL_CODE)}, got {prefill!r}")
    if decode not in _DECODE_CODE:
        raise ValueError(f"decode must be one of {sorted(_DECODE_CODE)}, got {decode!r}")
    global _tuning
    _tuning = _Tuning(int(partition_size), prefill, decode)


def _dtype_code(t: torch.Tensor, name: str) -> int:
    return dtype_code(t, name, CUDA_DTYPE_CODES, "the CUDA kernels")


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


class _OnDevice:
    """Makes `device` current for a launch when it is not already (the launch goes to the current device)."""

    def __init__(self, device: torch.device):
        self._guard = None if device.index == torch.cuda.current_device() else torch.cuda.device(device)

    def __enter__(self):
        if self._guard is not None:
            self._guard.__enter__()

    def __exit__(self, *exc):
        if self._guard is not None:
            self._guard.__exit__(*exc)


# ---- the four kernels ----

def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Writes each token's K/V into the cache at its slot; slot _core.PAD_SLOT (-1) writes nothing.

    key, value:   [num_tokens, num_kv_heads, head_size] fp32/bf16/fp16, last stride 1, other strides any
    key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_size], contiguous; dtype may
                  differ from key's (conversions round to nearest even, like .to())
    slot_mapping: int64 [num_tokens] on the same device
    """
    device = checks.check_cuda_tensors("reshape_and_cache", key=key, value=value, key_cache=key_cache,
                         value_cache=value_cache, slot_mapping=slot_mapping)
    num_tokens, src_code, cache_code = checks.check_reshape_and_cache(key, value, key_cache, value_cache,
                                                                      slot_mapping, _dtype_code)
    num_blocks, num_kv_heads, block_size, head_size = key_cache.shape
    if num_tokens == 0:
        return
    with _OnDevice(device):
        _core.reshape_and_cache_cuda(
            key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            slot_mapping.data_ptr(), num_tokens, num_kv_heads, head_size, num_blocks, block_size,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            src_code, cache_code, _stream(device))


# Decode partials need device scratch: one growing buffer per (device, stream), reused across calls
# (stream order makes the reuse safe). Warm up outside CUDA-graph capture with the largest batch.
_workspaces: dict[tuple[int, int], torch.Tensor] = {}


def _workspace(device: torch.device, stream: int, needed: int) -> torch.Tensor:
    key = (device.index, stream)
    buf = _workspaces.get(key)
    if buf is None or buf.numel() < needed:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"paged_attention needs {needed} more bytes of workspace while a CUDA graph is "
                               "being captured; run one eager call with the largest batch before capturing")
        buf = torch.empty(max(needed, 1 << 20), dtype=torch.uint8, device=device)
        _workspaces[key] = buf
    return buf


def paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                    scale, max_query_len=None, max_seq_len=None) -> None:
    """Causal attention of every query row over its sequence's cached K/V; writes `out` in place.

    query, out:      [num_tokens, num_heads, head_size], same dtype (fp32/bf16/fp16), last stride 1
    key/value_cache: [num_blocks, num_kv_heads, block_size, head_size], contiguous; head_size 64, 128
                     or 256; block_size a power of two up to 256
    block_tables:    int32 [num_seqs, max_blocks_per_seq], padded with _core.NULL_BLOCK (-1)
    seq_lens:        int32 [num_seqs], cached tokens including this step's new ones
    query_start_loc: int32 [num_seqs + 1]; sequence s owns query rows [qsl[s], qsl[s+1])
    Row j of sequence s sits at position seq_lens[s] - q_len + j and sees positions [0, it].
    max_query_len / max_seq_len: upper bounds known on the host (the scheduler has them); they size
    the launch (without them it is planned from num_tokens and the block-table width). They must hold.
    """
    device = checks.check_cuda_tensors("paged_attention", out=out, query=query, key_cache=key_cache, value_cache=value_cache,
                         block_tables=block_tables, seq_lens=seq_lens, query_start_loc=query_start_loc)
    checks.check_cache_pair(key_cache, value_cache)
    _dtype_code(key_cache, "key_cache")
    num_blocks, num_kv_heads, block_size, head_size = key_cache.shape
    checks.check_rows(query, "query", None, head_size)
    num_tokens, num_heads, _ = query.shape
    q_code = _dtype_code(query, "query")
    if out.dtype != query.dtype:
        raise TypeError(f"out is {out.dtype} but query is {query.dtype}; allocate out with "
                        "torch.empty_like(query)")
    checks.check_rows(out, "out", num_heads, head_size)
    if out.shape[0] != num_tokens:
        raise ValueError(f"out has shape {tuple(out.shape)}; expected {tuple(query.shape)} like query")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"query has {num_heads} heads, not a multiple of the cache's {num_kv_heads} kv heads")
    if head_size not in HEAD_SIZES:
        raise ValueError(f"head_size {head_size} is not supported by the CUDA kernels (they take {HEAD_SIZES}); "
                         "run this model's attention with pagedcore.ops.attention on the CPU")
    if block_size & (block_size - 1) or block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size {block_size} is not supported by the CUDA kernels: use a power of two "
                         f"up to {MAX_BLOCK_SIZE} (--block-size 16)")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start on a 16-byte boundary; slice it from a freshly allocated "
                             "kv_cache tensor")
    if block_tables.dtype != torch.int32:
        raise TypeError(f"block_tables has dtype {block_tables.dtype}; expected torch.int32 "
                        "(use block_tables.to(torch.int32))")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables has shape {tuple(block_tables.shape)}; expected "
                         "[num_seqs, max_blocks_per_seq]")
    if not block_tables.is_contiguous():
        raise ValueError("block_tables must be contiguous (call block_tables.contiguous())")
    num_seqs, max_blocks_per_seq = block_tables.shape
    checks.check_int_vector(seq_lens, "seq_lens", torch.int32, num_seqs)
    checks.check_int_vector(query_start_loc, "query_start_loc", torch.int32, num_seqs + 1)
    scale = float(scale)
    if max_query_len is not None and max_query_len < 0 or max_seq_len is not None and max_seq_len < 0:
        raise ValueError(f"max_query_len ({max_query_len}) and max_seq_len ({max_seq_len}) must be >= 0")
    if num_tokens == 0 or num_seqs == 0:
        return
    stream = _stream(device)
    args = [out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            block_tables.data_ptr(), seq_lens.data_ptr(), query_start_loc.data_ptr(),
            num_seqs, num_tokens, num_heads, num_kv_heads, head_size, num_blocks, block_size,
            max_blocks_per_seq, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            q_code, CUDA_DTYPE_CODES[key_cache.dtype], scale,
            -1 if max_query_len is None else int(max_query_len),
            -1 if max_seq_len is None else int(max_seq_len)]
    tuning = (_tuning.partition_size, _PREFILL_CODE[_tuning.prefill], _DECODE_CODE[_tuning.decode])
    buf = _workspaces.get((device.index, stream))
    with _OnDevice(device):
        needed = _core.paged_attention_cuda(*args, 0 if buf is None else buf.data_ptr(),
                                            0 if buf is None else buf.numel(), stream, *tuning)
        if needed:
            buf = _workspace(device, stream, needed)
            _core.paged_attention_cuda(*args, buf.data_ptr(), buf.numel(), stream, *tuning)


def copy_blocks(kv_cache, block_mapping) -> None:
    """Copies every layer's K and V block src -> dst for each (src, dst) row, in row order.

    kv_cache: [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size], contiguous, on CUDA
    block_mapping: int32 [n, 2] on the CPU (ids checked; rows that depend on earlier rows are ordered)
        or on kv_cache's device (no host round trip; the rows must then be independent, as
        copy-on-write lists are: distinct destinations that no other row reads)
    """
    checks.check_tensor(block_mapping, "block_mapping")
    device = checks.check_cuda_tensors("copy_blocks", kv_cache=kv_cache)
    checks.check_kv_cache(kv_cache, "kv_cache")
    _dtype_code(kv_cache, "kv_cache")
    checks.check_block_mapping(block_mapping)
    if block_mapping.shape[0] == 0:
        return
    num_layers, _, num_blocks = kv_cache.shape[:3]
    block_bytes = kv_cache[0, 0, 0].numel() * kv_cache.element_size()
    if block_mapping.device.type == "cpu":
        host = block_mapping.to(torch.int32).contiguous()
        rows = host.to(device)
        host_ptr = host.data_ptr()
    elif block_mapping.device == device:
        rows = block_mapping.to(torch.int32).contiguous()
        host, host_ptr = None, 0
    else:
        raise ValueError(f"block_mapping is on {block_mapping.device}; pass it on the CPU or on {device}")
    with _OnDevice(device):
        _core.copy_blocks_cuda(kv_cache.data_ptr(), rows.data_ptr(), host_ptr, block_mapping.shape[0],
                               num_layers * 2, num_blocks, block_bytes, _stream(device))
    del host


def swap_blocks(src_kv_cache, dst_kv_cache, block_mapping) -> None:
    """Copies every layer's K and V block from one cache to another (GPU <-> CPU pool).

    src_kv_cache, dst_kv_cache: same layout and dtype, num_blocks may differ; at least one on CUDA,
        the other on the same device or in CPU memory (pinned, pin_memory=True, for an asynchronous
        copy at full speed; pageable memory works and returns only once the copy is done)
    block_mapping: int32 [n, 2] rows (src block in src_kv_cache, dst block in dst_kv_cache); ids checked
    The copy runs on the current stream of the CUDA side: synchronise it before reading a pinned
    destination on the CPU.
    """
    for name, t in (("src_kv_cache", src_kv_cache), ("dst_kv_cache", dst_kv_cache)):
        checks.check_tensor(t, name)
    checks.check_block_mapping(block_mapping)
    cuda_sides = [t.device for t in (src_kv_cache, dst_kv_cache) if t.device.type == "cuda"]
    if not cuda_sides:
        raise ValueError("swap_blocks: neither cache is on CUDA; call pagedcore.ops.attention.swap_blocks for two CPU "
                         "caches")
    device = cuda_sides[0]
    for name, t in (("src_kv_cache", src_kv_cache), ("dst_kv_cache", dst_kv_cache)):
        if t.device.type not in ("cpu", "cuda") or (t.device.type == "cuda" and t.device != device):
            raise ValueError(f"swap_blocks: {name} is on {t.device}; one cache goes on {device}, the other on "
                             "the same device or the CPU")
    checks.require_cuda_kernels("swap_blocks")
    checks.check_swap_caches(src_kv_cache, dst_kv_cache)
    _dtype_code(src_kv_cache, "src_kv_cache")
    if block_mapping.shape[0] == 0:
        return
    rows = block_mapping.to(device="cpu", dtype=torch.int32).contiguous()
    block_bytes = src_kv_cache[0, 0, 0].numel() * src_kv_cache.element_size()
    with _OnDevice(device):
        _core.swap_blocks_cuda(src_kv_cache.data_ptr(), dst_kv_cache.data_ptr(), rows.data_ptr(), rows.shape[0],
                               src_kv_cache.shape[0] * 2, src_kv_cache.shape[2], dst_kv_cache.shape[2],
                               block_bytes, _stream(device))
