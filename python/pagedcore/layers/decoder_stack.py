"""Every decoder layer of a Llama-family model in one C++ call: the small-batch forward path.

At a few tokens per step a layer is a pass over its weights, and the ~15 torch ops per layer of
the Python forward cost as much in dispatch as they do in work (bench/bench_decode.py measures
both). cpp/kernels/decoder_stack.h runs the same ops in the same order and rounding from C++ (the
linear kernel, fused RMSNorm and RoPE, reshape_and_cache, paged_attention), one call per step.

The model builds a DecoderStack from its layers' tensors once (weights must stay put: `matches`
tells when they moved) and calls it for steps of at most `max_rows` tokens.
"""

from __future__ import annotations

import dataclasses

import torch

from pagedcore import kernels_linear
from pagedcore.layers.attention import AttentionMetadata

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}


@dataclasses.dataclass
class LayerTensors:
    """One layer's weights, as DecoderStack reads them (all contiguous, one dtype)."""

    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden]
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3) or None
    k_norm: torch.Tensor | None
    qkv: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None  # [(heads + 2 kv_heads) * head_dim] or None
    o_proj: torch.Tensor  # [hidden, heads * head_dim]
    gate_up: torch.Tensor  # [2 * intermediate, hidden], gate rows first
    down: torch.Tensor  # [hidden, intermediate]


class DecoderStack:
    def __init__(self, layers: list[LayerTensors], *, hidden_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, rms_norm_eps: float, attn_scale: float):
        from pagedcore import _core

        dtype = layers[0].qkv.dtype
        if dtype not in _DTYPE_CODE:
            raise TypeError(f"DecoderStack runs fp32 or bf16 weights, not {dtype}")
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        shapes = {"input_norm": (hidden_size,), "post_norm": (hidden_size,), "q_norm": (head_dim,),
                  "k_norm": (head_dim,), "qkv": (q_size + 2 * kv_size, hidden_size),
                  "qkv_bias": (q_size + 2 * kv_size,), "o_proj": (hidden_size, q_size),
                  "gate_up": (2 * intermediate_size, hidden_size), "down": (hidden_size, intermediate_size)}
        ptrs = []
        for index, layer in enumerate(layers):
            row = []
            for field, shape in shapes.items():
                t = getattr(layer, field)
                if t is None:
                    row.append(0)
                    continue
                if t.shape != shape or t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
                    raise ValueError(f"layer {index} {field}: {tuple(t.shape)} {t.dtype} on {t.device} "
                                     f"(contiguous: {t.is_contiguous()}); DecoderStack needs a contiguous "
                                     f"CPU {dtype} tensor of shape {shape}")
                row.append(t.data_ptr())
            if (row[2] == 0) != (row[3] == 0):
                raise ValueError(f"layer {index}: q_norm and k_norm come together")
            ptrs.append(row)
        self.dtype = dtype
        self.hidden_size, self.head_dim, self.num_layers = hidden_size, head_dim, len(layers)
        self.num_kv_heads = num_kv_heads
        self.max_rows = kernels_linear.max_rows(dtype)
        self._anchor = layers[0].qkv  # kept alive; its data_ptr tells whether the weights moved
        self._anchor_ptr = self._anchor.data_ptr()
        self._stack = _core.DecoderStack(ptrs, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                                         rms_norm_eps, attn_scale, _DTYPE_CODE[dtype], -1)

    def set_profiling(self, on: bool) -> None:
        """Time every op inside the stack (a benchmark aid; ~1 us a step)."""
        self._stack.profiling = on

    def profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds per op (norms, qkv, rope, cache_write, attention, o_proj, gate_up, down) since
        profiling was turned on or last reset."""
        return dict(self._stack.profile(reset))

    def matches(self, qkv_weight: torch.Tensor) -> bool:
        """Still bound to the model's weights (False after model.to() or a reload into new tensors)."""
        return qkv_weight.data_ptr() == self._anchor_ptr and qkv_weight.dtype == self.dtype

    def takes(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        return 0 < hidden.shape[0] <= self.max_rows and hidden.is_cpu and kv_cache.is_cpu

    def __call__(self, hidden: torch.Tensor, cos_sin: torch.Tensor, kv_cache: torch.Tensor,
                 attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [num_tokens, hidden_size] (the embeddings; overwritten with the last layer's
        output), cos_sin [num_tokens, head_dim], kv_cache [num_layers, 2, num_blocks, num_kv_heads,
        block_size, head_dim]. Returns (hidden, residual) as the Python layer loop would."""
        T = hidden.shape[0]
        m = attn_metadata
        kv_shape = kv_cache.shape
        num_seqs = m.seq_lens.shape[0]
        ok = (hidden.dtype is self.dtype and hidden.shape == (T, self.hidden_size) and hidden.is_contiguous()
              and cos_sin.dtype is self.dtype and cos_sin.shape == (T, self.head_dim) and cos_sin.is_contiguous()
              and len(kv_shape) == 6 and kv_shape[0] == self.num_layers and kv_shape[1] == 2
              and kv_shape[3] == self.num_kv_heads and kv_shape[5] == self.head_dim
              and kv_cache.dtype in _DTYPE_CODE and kv_cache.is_contiguous()
              and m.slot_mapping.dtype is torch.int64 and m.slot_mapping.shape == (T,)
              and m.slot_mapping.is_contiguous()
              and m.seq_lens.dtype is torch.int32 and m.seq_lens.dim() == 1 and m.seq_lens.is_contiguous()
              and m.query_start_loc.dtype is torch.int32 and m.query_start_loc.shape == (num_seqs + 1,)
              and m.query_start_loc.is_contiguous()
              and m.block_tables.dtype is torch.int32 and m.block_tables.dim() == 2
              and m.block_tables.shape[0] == num_seqs and m.block_tables.is_contiguous())
        if not ok:
            raise ValueError(
                "DecoderStack: inputs do not fit the model: hidden "
                f"{tuple(hidden.shape)} {hidden.dtype}, cos_sin {tuple(cos_sin.shape)} {cos_sin.dtype}, kv_cache "
                f"{tuple(kv_shape)} {kv_cache.dtype}, slot_mapping {tuple(m.slot_mapping.shape)} "
                f"{m.slot_mapping.dtype}, seq_lens {tuple(m.seq_lens.shape)} {m.seq_lens.dtype}, query_start_loc "
                f"{tuple(m.query_start_loc.shape)} {m.query_start_loc.dtype}, block_tables "
                f"{tuple(m.block_tables.shape)} {m.block_tables.dtype}; expected contiguous tensors, int64 slots, "
                "int32 tables and the model's dtype and sizes")
        residual = torch.empty_like(hidden)
        num_actual = m.num_actual_tokens
        self._stack.run(hidden.data_ptr(), residual.data_ptr(), T, cos_sin.data_ptr(), kv_cache.data_ptr(),
                        _DTYPE_CODE[kv_cache.dtype], kv_shape[2], kv_shape[4], m.slot_mapping.data_ptr(),
                        m.block_tables.data_ptr(), m.seq_lens.data_ptr(), m.query_start_loc.data_ptr(), num_seqs,
                        m.block_tables.shape[1], m.max_query_len, m.max_seq_len,
                        -1 if num_actual is None else num_actual)
        return hidden, residual
