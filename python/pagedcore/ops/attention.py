"""The paged KV-cache ops: write K/V into the cache, paged attention, block copy and swap.

Each function checks its arguments (dtype, shape, device, strides) and raises TypeError/ValueError
with the fix in the message, then hands data pointers, sizes and strides to the C++ kernels in
pagedcore._core (cpp/kernels/). Index contents (slots, block ids, sequence lengths) are checked in
C++ before anything is written, which is cheaper than reading them back through torch here.
Calls with CUDA tensors go to pagedcore.ops.attention_cuda (same signatures) when the extension has
the CUDA kernels and a GPU is visible; otherwise they raise NotImplementedError.

KV cache layout (one tensor for the whole model):
    kv_cache  [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size]
    kv_cache[layer, 0] = key_cache, kv_cache[layer, 1] = value_cache, each
              [num_blocks, num_kv_heads, block_size, head_size]
Slot of the token at position p: block_table[p // block_size] * block_size + p % block_size.
Padding: _core.PAD_SLOT in slot_mapping (nothing written), _core.NULL_BLOCK in block tables.
"""

from __future__ import annotations

import torch

from pagedcore import _core
from pagedcore.ops import checks
from pagedcore.ops.dtypes import CPU_CACHE_DTYPE_CODES, CPU_DTYPE_CODES, dtype_code

__all__ = ["reshape_and_cache", "paged_attention", "copy_blocks", "swap_blocks"]

MAX_HEAD_SIZE = 256


def _dtype_code(t: torch.Tensor, name: str) -> int:
    return dtype_code(t, name, CPU_DTYPE_CODES, "the CPU kernels")


def _cache_dtype_code(t: torch.Tensor, name: str) -> int:
    return dtype_code(t, name, CPU_CACHE_DTYPE_CODES, "the CPU kernels' caches")


def _describe(tensors: dict) -> str:
    return "; ".join(f"{name} {tuple(t.shape)} {t.dtype} strides {t.stride()} on {t.device}"
                     if isinstance(t, torch.Tensor) else f"{name} {type(t).__name__}"
                     for name, t in tensors.items())


def _check_cpu(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        checks.check_tensor(t, name)
    devices = {t.device.type for t in tensors.values()}
    if devices == {"cpu"}:
        return
    if "cuda" in devices:
        raise NotImplementedError(
            f"{op}: no CUDA kernels to run CUDA tensors here (pagedcore._core built with CUDA: "
            f"{_core.has_cuda}; torch sees a GPU: {torch.cuda.is_available()}); got "
            + ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
            + ". Rebuild with nvcc on the PATH (scripts/dev-build), or pass CPU tensors.")
    raise ValueError(f"{op}: all tensors must be on the CPU; got "
                     + ", ".join(f"{n} on {t.device}" for n, t in tensors.items()))


def _cuda_kernels(*tensors):
    """pagedcore.ops.attention_cuda when a tensor is on a CUDA device and those kernels are built
    and a GPU is visible; None otherwise (then _check_cpu explains what is wrong)."""
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        return None
    from pagedcore.ops import attention_cuda  # imported on first use: CPU-only processes never load it

    return attention_cuda if attention_cuda.is_available() else None


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Writes each token's K/V into the cache at its slot; slot _core.PAD_SLOT (-1) writes nothing.

    key, value:   [num_tokens, num_kv_heads, head_size] fp32/bf16, last stride 1, other strides any
    key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_size], the inner three dims
                  contiguous, blocks any distance apart (kv_cache[layer, 0/1] of either layout, see
                  checks.layer_block_stride); dtype may differ from key's (fp32 -> bf16 rounds to nearest even)
    slot_mapping: int64 [num_tokens]
    """
    # Fast path: each property read once (they cost ~0.1-0.5 us apiece); any doubt goes to the
    # detailed checks, which raise with the fix in the message.
    try:
        kshape, cshape = key.shape, key_cache.shape
        kstride, vstride = key.stride(), value.stride()
        src_code = CPU_DTYPE_CODES.get(key.dtype)
        cache_code = CPU_CACHE_DTYPE_CODES.get(key_cache.dtype)
        ok = (key.is_cpu and value.is_cpu and key_cache.is_cpu and value_cache.is_cpu and slot_mapping.is_cpu
              and src_code is not None and cache_code is not None and value.dtype is key.dtype
              and value_cache.dtype is key_cache.dtype and len(kshape) == 3 and len(cshape) == 4
              and value.shape == kshape and value_cache.shape == cshape
              and kshape[1] == cshape[1] and kshape[2] == cshape[3] and kstride[2] == 1 and vstride[2] == 1
              and (block_stride := checks.layer_block_stride(key_cache, value_cache)) is not None
              and slot_mapping.dtype is torch.int64 and slot_mapping.shape == kshape[:1]
              and slot_mapping.is_contiguous())
    except (AttributeError, TypeError, IndexError):
        ok = False
    if not ok:
        cuda = _cuda_kernels(key, value, key_cache, value_cache, slot_mapping)
        if cuda is not None:
            return cuda.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        _diagnose_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    num_tokens = kshape[0]
    if num_tokens == 0:
        return
    _core.reshape_and_cache_cpu(
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        slot_mapping.data_ptr(), num_tokens, cshape[1], cshape[3], cshape[0], cshape[2],
        kstride[0], kstride[1], vstride[0], vstride[1], src_code, cache_code, block_stride)


def _diagnose_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Raises the precise error for a call the fast path refused."""
    tensors = dict(key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping)
    _check_cpu("reshape_and_cache", **tensors)
    checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, _dtype_code, block_strided=True,
                                   cache_dtype_code=_cache_dtype_code)
    raise ValueError(f"reshape_and_cache does not support these arguments: {_describe(tensors)} "
                     "(see its docstring for the shapes, dtypes and strides it takes)")


def paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                    scale, max_query_len=None, max_seq_len=None) -> None:
    """Causal attention of every query row over its sequence's cached K/V; writes `out` in place.

    query, out:      [num_tokens, num_heads, head_size], same dtype (fp32/bf16), last stride 1
    key/value_cache: [num_blocks, num_kv_heads, block_size, head_size], as reshape_and_cache takes them
    block_tables:    int32 [num_seqs, max_blocks_per_seq], padded with _core.NULL_BLOCK (-1)
    seq_lens:        int32 [num_seqs], cached tokens including this step's new ones
    query_start_loc: int32 [num_seqs + 1]; sequence s owns query rows [qsl[s], qsl[s+1])
    Row j of sequence s sits at position seq_lens[s] - q_len + j and sees positions [0, it].
    max_query_len / max_seq_len are optional upper bounds (checked when given).
    """
    try:  # fast path, as in reshape_and_cache
        qshape, cshape, bshape = query.shape, key_cache.shape, block_tables.shape
        qstride, ostride = query.stride(), out.stride()
        q_code = CPU_DTYPE_CODES.get(query.dtype)
        cache_code = CPU_CACHE_DTYPE_CODES.get(key_cache.dtype)
        head_size = cshape[3]
        ok = (query.is_cpu and out.is_cpu and key_cache.is_cpu and value_cache.is_cpu and block_tables.is_cpu
              and seq_lens.is_cpu and query_start_loc.is_cpu
              and q_code is not None and cache_code is not None and out.dtype is query.dtype
              and value_cache.dtype is key_cache.dtype and len(qshape) == 3 and len(cshape) == 4
              and out.shape == qshape and value_cache.shape == cshape and qshape[2] == head_size
              and head_size % 8 == 0 and head_size <= MAX_HEAD_SIZE and qshape[1] % cshape[1] == 0
              and qstride[2] == 1 and ostride[2] == 1
              and (block_stride := checks.layer_block_stride(key_cache, value_cache)) is not None
              and block_tables.dtype is torch.int32 and len(bshape) == 2 and block_tables.is_contiguous()
              and seq_lens.dtype is torch.int32 and seq_lens.shape == bshape[:1] and seq_lens.is_contiguous()
              and query_start_loc.dtype is torch.int32 and query_start_loc.shape[0] == bshape[0] + 1
              and query_start_loc.dim() == 1 and query_start_loc.is_contiguous())
    except (AttributeError, TypeError, IndexError):
        ok = False
    if not ok:
        cuda = _cuda_kernels(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
        if cuda is not None:
            return cuda.paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens,
                                        query_start_loc, scale, max_query_len, max_seq_len)
        _diagnose_paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    scale = float(scale)
    max_query_len = -1 if max_query_len is None else int(max_query_len)
    max_seq_len = -1 if max_seq_len is None else int(max_seq_len)
    if max_query_len < -1 or max_seq_len < -1:
        raise ValueError(f"max_query_len ({max_query_len}) and max_seq_len ({max_seq_len}) must be >= 0")
    num_tokens, num_seqs = qshape[0], bshape[0]
    if num_tokens == 0:
        return
    _core.paged_attention_cpu(
        out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        block_tables.data_ptr(), seq_lens.data_ptr(), query_start_loc.data_ptr(),
        num_seqs, num_tokens, qshape[1], cshape[1], head_size, cshape[0], cshape[2], bshape[1],
        qstride[0], qstride[1], ostride[0], ostride[1], q_code, cache_code, scale, max_query_len, max_seq_len,
        block_stride)


def _diagnose_paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens,
                              query_start_loc) -> None:
    """Raises the precise error for a call the fast path refused."""
    tensors = dict(out=out, query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                   seq_lens=seq_lens, query_start_loc=query_start_loc)
    _check_cpu("paged_attention", **tensors)
    checks.check_cache_pair(key_cache, value_cache, block_strided=True)
    _cache_dtype_code(key_cache, "key_cache")
    num_blocks, num_kv_heads, block_size, head_size = key_cache.shape
    checks.check_rows(query, "query", None, head_size)
    num_tokens, num_heads, _ = query.shape
    _dtype_code(query, "query")
    if out.dtype != query.dtype:
        raise TypeError(f"out is {out.dtype} but query is {query.dtype}; allocate out with "
                        "torch.empty_like(query)")
    checks.check_rows(out, "out", num_heads, head_size)
    if out.shape[0] != num_tokens:
        raise ValueError(f"out has shape {tuple(out.shape)}; expected {tuple(query.shape)} like query")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"query has {num_heads} heads, not a multiple of the cache's {num_kv_heads} kv heads")
    if head_size % 8 != 0 or head_size > MAX_HEAD_SIZE:
        raise ValueError(f"head_size {head_size} is not supported; the CPU kernels take multiples of 8 "
                         f"up to {MAX_HEAD_SIZE}")
    if block_tables.dtype != torch.int32:
        raise TypeError(f"block_tables has dtype {block_tables.dtype}; expected torch.int32 "
                        "(use block_tables.to(torch.int32))")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables has shape {tuple(block_tables.shape)}; expected "
                         "[num_seqs, max_blocks_per_seq]")
    if not block_tables.is_contiguous():
        raise ValueError("block_tables must be contiguous (call block_tables.contiguous())")
    num_seqs = block_tables.shape[0]
    checks.check_int_vector(seq_lens, "seq_lens", torch.int32, num_seqs)
    checks.check_int_vector(query_start_loc, "query_start_loc", torch.int32, num_seqs + 1)
    raise ValueError(f"paged_attention does not support these arguments: {_describe(tensors)} "
                     "(see its docstring for the shapes, dtypes and strides it takes)")


def _check_block_mapping(block_mapping: torch.Tensor) -> torch.Tensor:
    checks.check_block_mapping(block_mapping)
    if block_mapping.dtype != torch.int32 or not block_mapping.is_contiguous():
        block_mapping = block_mapping.to(torch.int32).contiguous()  # a few rows: cheap
    return block_mapping


def copy_blocks(kv_cache, block_mapping) -> None:
    """Copies every layer's K and V block src -> dst for each (src, dst) row, in row order.

    kv_cache: [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size], contiguous or block-major
              (checks.kv_cache_strides)
    block_mapping: int32 [n, 2]
    """
    cuda = _cuda_kernels(kv_cache)
    if cuda is not None:
        return cuda.copy_blocks(kv_cache, block_mapping)
    _check_cpu("copy_blocks", kv_cache=kv_cache, block_mapping=block_mapping)
    checks.check_kv_cache(kv_cache, "kv_cache", block_major=True)
    _cache_dtype_code(kv_cache, "kv_cache")
    block_mapping = _check_block_mapping(block_mapping)
    if block_mapping.shape[0] == 0:
        return
    num_layers, _, num_blocks = kv_cache.shape[:3]
    plane_stride, block_stride = _plane_and_block_strides(kv_cache)
    _core.copy_blocks_cpu(kv_cache.data_ptr(), kv_cache.data_ptr(), block_mapping.data_ptr(),
                          block_mapping.shape[0], num_layers * 2, num_blocks, num_blocks,
                          kv_cache[0, 0, 0].numel() * kv_cache.element_size(),
                          plane_stride, block_stride, plane_stride, block_stride)


def _plane_and_block_strides(kv_cache: torch.Tensor) -> tuple[int, int]:
    """Bytes from plane (layer, K/V) p to p + 1 and from block b to b + 1 (checks.kv_cache_strides)."""
    _, kv_stride, block_stride = kv_cache.stride()[:3]
    return kv_stride * kv_cache.element_size(), block_stride * kv_cache.element_size()


def swap_blocks(src_kv_cache, dst_kv_cache, block_mapping) -> None:
    """Copies every layer's K and V block from one cache to another (e.g. GPU <-> CPU pool).

    src_kv_cache, dst_kv_cache: same dtype, num_blocks may differ; each contiguous or block-major
    block_mapping: int32 [n, 2] rows (src block in src_kv_cache, dst block in dst_kv_cache)
    """
    cuda = _cuda_kernels(src_kv_cache, dst_kv_cache)
    if cuda is not None:  # GPU <-> CPU pool, or within one GPU
        return cuda.swap_blocks(src_kv_cache, dst_kv_cache, block_mapping)
    _check_cpu("swap_blocks", src_kv_cache=src_kv_cache, dst_kv_cache=dst_kv_cache,
               block_mapping=block_mapping)
    checks.check_swap_caches(src_kv_cache, dst_kv_cache, block_major=True)
    _cache_dtype_code(src_kv_cache, "src_kv_cache")
    block_mapping = _check_block_mapping(block_mapping)
    if block_mapping.shape[0] == 0:
        return
    num_layers = src_kv_cache.shape[0]
    _core.copy_blocks_cpu(src_kv_cache.data_ptr(), dst_kv_cache.data_ptr(), block_mapping.data_ptr(),
                          block_mapping.shape[0], num_layers * 2, src_kv_cache.shape[2],
                          dst_kv_cache.shape[2], src_kv_cache[0, 0, 0].numel() * src_kv_cache.element_size(),
                          *_plane_and_block_strides(src_kv_cache), *_plane_and_block_strides(dst_kv_cache))
