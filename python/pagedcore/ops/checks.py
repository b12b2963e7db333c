"""Argument checks shared by the ops: each raises TypeError / ValueError with a message that names the
fix, so a wrong call is a Python exception and never reaches a kernel. Index contents (slots, block
ids, lengths) are checked in C++, which reads them anyway."""

from __future__ import annotations

import torch

from pagedcore import _core


def check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_int_vector(t: torch.Tensor, name: str, dtype: torch.dtype, length: int) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}; expected {dtype} (use {name}.to({dtype}))")
    if t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected ({length},)")
    if length > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (call {name}.contiguous())")


def layer_block_stride(key_cache: torch.Tensor, value_cache: torch.Tensor) -> int | None:
    """Elements between a layer cache's blocks when the CPU kernels can read the pair: both with the same
    strides, [num_kv_heads, block_size, head_size] contiguous, blocks at least a block apart (a layer of a
    layer-major cache: exactly a block; of the CPU's block-major cache: num_layers * 2 blocks). Else None."""
    strides = key_cache.stride()
    if len(strides) != 4 or value_cache.stride() != strides:
        return None
    _, num_kv_heads, block_size, head_size = key_cache.shape
    if strides[1:] != (block_size * head_size, head_size, 1) or strides[0] < num_kv_heads * block_size * head_size:
        return None
    return strides[0]


def check_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor, block_strided: bool = False) -> None:
    """Shapes and layout of one layer's [num_blocks, num_kv_heads, block_size, head_size] caches:
    contiguous, or with block_strided (the CPU kernels) blocks any distance apart (layer_block_stride)."""
    if key_cache.dim() != 4:
        raise ValueError(f"key_cache has shape {tuple(key_cache.shape)}; expected 4 dims "
                         "[num_blocks, num_kv_heads, block_size, head_size] (kv_cache[layer, 0])")
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache ({tuple(value_cache.shape)}, {value_cache.dtype}) must match "
                         f"key_cache ({tuple(key_cache.shape)}, {key_cache.dtype})")
    if block_strided:
        if layer_block_stride(key_cache, value_cache) is None:
            raise ValueError(f"key_cache (strides {key_cache.stride()}) and value_cache (strides "
                             f"{value_cache.stride()}) must have equal strides, contiguous [num_kv_heads, "
                             "block_size, head_size] and blocks at least a block apart; pass kv_cache[layer, 0/1] "
                             "of a cache from pagedcore.engine.kv_cache.allocate")
        return
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous; pass kv_cache[layer, 0/1] of a contiguous "
                             "[num_layers, 2, num_blocks, num_kv_heads, block_size, head_size] tensor")


def check_rows(t: torch.Tensor, name: str, num_heads: int | None = None, head_size: int | None = None) -> None:
    """A [num_tokens, num_heads, head_size] activation: any non-negative strides but a unit last one."""
    if t.dim() != 3:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [num_tokens, num_heads, head_size]"
                         " (view a flat projection with .view(num_tokens, num_heads, head_size))")
    if num_heads is not None and t.shape[1] != num_heads:
        raise ValueError(f"{name} has {t.shape[1]} heads (shape {tuple(t.shape)}); expected {num_heads}")
    if head_size is not None and t.shape[2] != head_size:
        raise ValueError(f"{name} has head_size {t.shape[2]} (shape {tuple(t.shape)}); expected {head_size}")
    if (t.shape[2] > 1 and t.stride(2) != 1) or min(t.stride()) < 0:
        raise ValueError(f"{name} must have a unit stride in its last dim and no negative strides "
                         f"(strides {t.stride()}); call {name}.contiguous()")


def kv_cache_strides(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(layer, K->V, block) strides in elements of a whole-model cache in one of the two layouts the CPU
    kernels take, else None: layer-major (contiguous) or block-major ([num_blocks, num_layers, 2, ...] in
    memory, kv_cache.allocate's CPU layout; a [:n] slice of it keeps its block stride)."""
    strides = t.stride()
    if t.dim() != 6:
        return None
    num_layers, _, num_blocks, num_kv_heads, block_size, head_size = t.shape
    block = num_kv_heads * block_size * head_size
    if strides[3:] != (block_size * head_size, head_size, 1) or strides[0] != 2 * strides[1]:
        return None
    layer_major = strides[2] == block and strides[1] >= num_blocks * block
    block_major = strides[1] == block and strides[2] >= 2 * num_layers * block
    return strides[:3] if layer_major or block_major else None


def check_kv_cache(t: torch.Tensor, name: str, block_major: bool = False) -> None:
    """The whole-model [num_layers, 2, num_blocks, num_kv_heads, block_size, head_size] cache: contiguous,
    or with block_major (the CPU kernels) also kv_cache.allocate's block-major CPU layout."""
    if t.dim() != 6:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected "
                         "[num_layers, 2, num_blocks, num_kv_heads, block_size, head_size]")
    if t.shape[1] != 2:
        raise ValueError(f"{name} has {t.shape[1]} in dim 1; expected 2 (key, value)")
    if block_major and kv_cache_strides(t) is None:
        raise ValueError(f"{name} (strides {t.stride()}) is neither contiguous nor block-major; allocate it "
                         "with pagedcore.engine.kv_cache.allocate or torch.empty/zeros")
    if not block_major and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (allocate it with torch.empty/zeros)")


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, dtype_code,
                            block_strided: bool = False, cache_dtype_code=None) -> tuple[int, int, int]:
    """The arguments of reshape_and_cache (CPU or CUDA; dtype_code(t, name) is the backend's dtype
    check, cache_dtype_code the cache's where it differs; block_strided as in check_cache_pair).
    Returns (num_tokens, key's dtype code, cache's dtype code)."""
    check_cache_pair(key_cache, value_cache, block_strided)
    cache_code = (cache_dtype_code or dtype_code)(key_cache, "key_cache")
    num_blocks, num_kv_heads, block_size, head_size = key_cache.shape
    check_rows(key, "key", num_kv_heads, head_size)
    check_rows(value, "value", num_kv_heads, head_size)
    num_tokens = key.shape[0]
    if value.shape[0] != num_tokens:
        raise ValueError(f"key has {num_tokens} tokens but value has {value.shape[0]}")
    if value.dtype != key.dtype:
        raise TypeError(f"key is {key.dtype} but value is {value.dtype}; give both the same dtype")
    src_code = dtype_code(key, "key")
    check_int_vector(slot_mapping, "slot_mapping", torch.int64, num_tokens)
    return num_tokens, src_code, cache_code


def check_swap_caches(src_kv_cache: torch.Tensor, dst_kv_cache: torch.Tensor, block_major: bool = False) -> None:
    """The two caches of swap_blocks (CPU or CUDA): each a whole KV cache (check_kv_cache), the same dtype,
    shapes that differ only in num_blocks (dim 2), and not the same storage."""
    check_kv_cache(src_kv_cache, "src_kv_cache", block_major)
    check_kv_cache(dst_kv_cache, "dst_kv_cache", block_major)
    if src_kv_cache.dtype != dst_kv_cache.dtype:
        raise TypeError(f"src_kv_cache is {src_kv_cache.dtype} but dst_kv_cache is {dst_kv_cache.dtype}; "
                        "both caches must have the same dtype")
    src_shape, dst_shape = tuple(src_kv_cache.shape), tuple(dst_kv_cache.shape)
    if src_shape[:2] + src_shape[3:] != dst_shape[:2] + dst_shape[3:]:
        raise ValueError(f"src_kv_cache {src_shape} and dst_kv_cache {dst_shape} may differ only in "
                         "num_blocks (dim 2)")
    if src_kv_cache.data_ptr() == dst_kv_cache.data_ptr():
        raise ValueError("swap_blocks got the same cache twice; use copy_blocks within one cache")


def check_block_mapping(block_mapping) -> None:
    check_tensor(block_mapping, "block_mapping")
    if block_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_mapping has dtype {block_mapping.dtype}; expected torch.int32")
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping has shape {tuple(block_mapping.shape)}; expected [n, 2] "
                         "rows of (src, dst)")


def require_cuda_kernels(op: str) -> None:
    if not _core.has_cuda:
        raise RuntimeError(f"{op}: pagedcore._core was built without CUDA (no CUDA toolkit was found at build "
                           "time); rebuild with nvcc on the PATH (scripts/dev-build)")


def check_cuda_tensors(op: str, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one CUDA device and the extension built with CUDA; returns the device."""
    for name, t in tensors.items():
        check_tensor(t, name)
    off = [f"{name} on {t.device}" for name, t in tensors.items() if t.device.type != "cuda"]
    if off:
        raise ValueError(f"{op}: the CUDA kernels take CUDA tensors; got {', '.join(off)}. Move them with "
                         f".cuda(), or call pagedcore.ops.attention.{op} for CPU tensors")
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"{op}: all tensors must be on one device; got "
                         + ", ".join(f"{name} on {t.device}" for name, t in tensors.items()))
    require_cuda_kernels(op)
    return devices.pop()
