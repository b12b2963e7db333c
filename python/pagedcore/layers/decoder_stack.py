"""Every decoder layer of a Llama-family model in one C++ call: the small-batch forward path.

At a few tokens per step a layer is a pass over its weights, and the ~15 torch ops per layer of
the Python forward cost as much in dispatch as they do in work (bench/bench_decode.py measures
both). cpp/kernels/decoder_stack.h runs the same ops in the same order and rounding from C++ (the
linear kernel, fused RMSNorm and RoPE, reshape_and_cache, paged_attention), one call per step.

The model builds a DecoderStack from its layers' tensors once (weights must stay put: `matches`
tells when they moved) and calls it for steps of at most `max_rows` tokens, but only where
decoder_stack_support() (layers/decoder_stack_support.py) says the stack runs everything the layers do.

Multi-LoRA (--enable-lora): each linear's adapter hook (pagedcore.lora.LoRALayerWeights) has slot
stacks the LoRAManager fills in place, so the stack binds their pointers once, like the weights;
a step with adapter rows passes the step's row groups (the hooks' shared LoRABatch) to run(), and
the C++ side adds the adapter terms after each linear with the kernel the hooks call.
"""

from __future__ import annotations

import dataclasses

import torch

from pagedcore.layers.attention import AttentionMetadata
from pagedcore.layers.linear import HELD_16BIT_METHODS, Linear, current_x16_weight
from pagedcore.layers.linear_quant import QuantLinearMethod
from pagedcore.ops import checks
from pagedcore.ops.dtypes import CPU_CACHE_DTYPE_CODES as _CACHE_DTYPE_CODE
from pagedcore.ops.dtypes import CPU_DTYPE_CODES as _DTYPE_CODE
from pagedcore.ops.dense_repack import X16_FORMATS, X16_MAX_ROWS, X16Weight
from pagedcore.ops.linear import max_rows
from pagedcore.ops.quant_linear import FORMAT_ENUMS


@dataclasses.dataclass(frozen=True)
class StackRun:
    """Rows of a linear after its first run, in another format (cpp/kernels/decoder_stack.h StackLinearRun): a
    layer of several quantized parts (a GGUF mixing block types inside one fused layer)."""

    weight: torch.Tensor  # the part's bytes, as ops/quant_linear.py's format holds them
    format: str
    scales: torch.Tensor | None  # fp32 [rows] (int8_per_channel, fp8_e4m3), else None
    rows: int


MAX_LATER_RUNS = 3  # cpp/kernels/decoder_stack.h kMaxStackLinearRuns


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
    # Per linear (LINEAR_FIELDS order): None for dense rows of the model dtype, its x16 repack
    # ("f32x16" / "bf16x16" / "f16x16", ops/dense_repack.py: the tensor is then the X16Weight's packed
    # layout), a checkpoint's 16-bit rows held as stored under fp32 activations (HELD_ROW_FORMATS), or a
    # quantized format of ops/quant_linear.py (the tensor is then that format's bytes: uint8
    # [N, row_bytes], int8 [N, K] for int8_per_channel, uint8 [N, K] for fp8_e4m3 and its x16 layout), with
    # int8_per_channel's and fp8_e4m3's fp32 per-row scales [N] (fp8 with block-wise scales: [N / 16, KB] and
    # block_k, its inputs per block; None elsewhere).
    formats: tuple[str | None, ...] = (None, None, None, None)
    scales: tuple[torch.Tensor | None, ...] = (None, None, None, None)
    block_k: tuple[int | None, ...] = (None, None, None, None)
    # Per linear: its LoRA hook (pagedcore.lora.LoRALayerWeights: the slot stacks a_t, b_t, ranks,
    # slice_starts) or None.
    lora: tuple[object | None, ...] = (None, None, None, None)
    # Per linear: an act-order GPTQ layer's input order, int64 [K] (the stack multiplies x[:, perm]), or None.
    input_perms: tuple[torch.Tensor | None, ...] = (None, None, None, None)
    # Per linear: its parts after the first where it holds several formats (the tensor, format and scales above
    # are then the first part's, over its rows only), else ().
    later_runs: tuple[tuple[StackRun, ...], ...] = ((), (), (), ())


# Model dtype -> the dense weight format the stack reads at that dtype (dense, its dtype code).
STACK_WEIGHT_FORMATS = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
# A bf16 / fp16 checkpoint tensor held as stored under fp32 activations (layers/linear.py HELD_16BIT_METHODS),
# in the checkpoint layout: its weight dtype -> the format name the stack is given (x16: X16_FORMATS).
HELD_ROW_FORMATS = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Format name -> the dtype its dense weight tensor holds (x16 repacks and held rows).
DENSE_FORMAT_DTYPES = {**{name: dtype for dtype, name in X16_FORMATS.items()},
                       **{name: dtype for dtype, name in HELD_ROW_FORMATS.items()}}
# A quantized step calls the same kernel at every row count (there is no GEMM to hand large steps
# to), so the stack takes steps of any size; the bound only keeps its activation buffers sane.
QUANT_STACK_MAX_ROWS = 1 << 16
# Every tensor of a decoder layer the stack reads: parameter name -> LayerTensors field. A layer
# parameter not named here (an o_proj bias, an adapter's matrices) is one the stack would ignore.
LAYER_PARAMS = {
    "input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_norm",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "self_attn.qkv_proj.weight": "qkv", "self_attn.qkv_proj.bias": "qkv_bias", "self_attn.o_proj.weight": "o_proj",
    "mlp.gate_up_proj.weight": "gate_up", "mlp.down_proj.weight": "down",
}
LINEAR_LEAVES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
LINEAR_FIELDS = ("qkv", "o_proj", "gate_up", "down")  # LayerTensors fields of LINEAR_LEAVES, the binding's order


def stack_weight(linear: Linear) -> torch.Tensor:
    """The tensor the stack reads as a linear's weight: its first part's where the layer holds several formats
    (its `weight` is then empty; the other parts are later runs), else the layer's weight."""
    parts = getattr(linear, "quant_parts", None)
    return parts[0].weight if isinstance(linear.method, QuantLinearMethod) and parts and len(parts) > 1 \
        else linear.weight


def _later_runs(linear: Linear) -> tuple[StackRun, ...]:
    if not isinstance(linear.method, QuantLinearMethod) or len(linear.quant_parts) < 2:
        return ()
    return tuple(StackRun(p.weight, p.format, p.scales, p.num_rows) for p in linear.quant_parts[1:])


def _linear_format(linear: Linear) -> tuple[str | None, torch.Tensor | None, int | None]:
    """(quantized format or None for dense, int8_per_channel / fp8 scales or None, fp8 block_k or None) of a
    layer the stack runs (of its first part where it holds several)."""
    if isinstance(linear.method, QuantLinearMethod):
        part = linear.quant_parts[0]
        return part.format, part.scales, part.block_k
    if current_x16_weight(linear) is not None:
        return X16_FORMATS[linear.weight.dtype], None, None
    if linear.method in HELD_16BIT_METHODS.values():
        return HELD_ROW_FORMATS[linear.weight.dtype], None, None
    return None, None, None


def lora_batch_of(layers) -> object | None:
    """The LoRABatchRef the layers' adapter hooks share (pagedcore.lora), or None without adapters."""
    for layer in layers:
        for name in LINEAR_LEAVES:
            hook = getattr(layer.get_submodule(name), "lora", None)
            if hook is not None:
                return hook.batch_ref
    return None


def layer_tensors(layer) -> LayerTensors:
    """The tensors the stack reads from one Llama-family decoder layer (None where absent)."""
    params = dict(layer.named_parameters())
    formats = [_linear_format(layer.get_submodule(name)) for name in LINEAR_LEAVES]
    for name in LINEAR_LEAVES:  # a repacked dense weight: the stack reads the x16 copy the layer's kernel reads
        linear = layer.get_submodule(name)
        packed = current_x16_weight(linear)
        if packed is not None:
            params[name + ".weight"] = packed
        elif _later_runs(linear):  # several formats: the first part's tensor, then the later runs
            params[name + ".weight"] = stack_weight(linear)
    return LayerTensors(**{field: params.get(name) for name, field in LAYER_PARAMS.items()},
                        formats=tuple(f for f, _, _ in formats), scales=tuple(sc for _, sc, _ in formats),
                        block_k=tuple(bk for _, _, bk in formats),
                        lora=tuple(getattr(layer.get_submodule(name), "lora", None) for name in LINEAR_LEAVES),
                        input_perms=tuple(getattr(layer.get_submodule(name), "input_perm", None)
                                          for name in LINEAR_LEAVES),
                        later_runs=tuple(_later_runs(layer.get_submodule(name)) for name in LINEAR_LEAVES))


def stack_shapes(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
            intermediate_size: int) -> dict[str, tuple[int, ...]]:
    """LayerTensors field -> the shape the stack reads it with."""
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    return {"input_norm": (hidden_size,), "post_norm": (hidden_size,), "q_norm": (head_dim,),
            "k_norm": (head_dim,), "qkv": (q_size + 2 * kv_size, hidden_size),
            "qkv_bias": (q_size + 2 * kv_size,), "o_proj": (hidden_size, q_size),
            "gate_up": (2 * intermediate_size, hidden_size), "down": (hidden_size, intermediate_size)}


class DecoderStack:
    def __init__(self, layers: list[LayerTensors], *, hidden_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, rms_norm_eps: float, attn_scale: float,
                 lora_batch=None):
        from pagedcore import _core
        from pagedcore.layers.decoder_stack_support import tensor_problem  # it imports this module

        dtype = layers[0].input_norm.dtype  # the activations' (quantized weights carry their own format)
        if dtype not in _DTYPE_CODE:
            raise TypeError(f"DecoderStack runs fp32 or bf16 activations, not {dtype}")
        shapes = stack_shapes(hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size)
        problem = tensor_problem(layers, shapes, dtype)
        if problem:
            raise ValueError(problem)
        # One row of pointers per layer, in stack_shapes' field order (the binding's); 0 = absent.
        ptrs = [[0 if getattr(layer, field) is None else getattr(layer, field).data_ptr() for field in shapes]
                for layer in layers]
        self.dtype = dtype
        self.hidden_size, self.head_dim, self.num_layers = hidden_size, head_dim, len(layers)
        self.num_kv_heads = num_kv_heads
        # A dense layer hands steps past max_rows to a GEMM library (other rounding): only a stack whose
        # every linear is quantized or x16-repacked (one kernel at every row count) takes every step; held
        # 16-bit rows hand theirs over past their own dtype's rows.
        fmts = {fmt for layer in layers for fmt in layer.formats}
        own_kernel_only = all(fmt is not None and fmt not in HELD_ROW_FORMATS.values() for fmt in fmts)
        row_dtypes = {dtype} | {DENSE_FORMAT_DTYPES[fmt] for fmt in fmts if fmt in HELD_ROW_FORMATS.values()}
        self.max_rows = (min(QUANT_STACK_MAX_ROWS, X16_MAX_ROWS) if own_kernel_only else
                         min(max_rows(row_dtype) for row_dtype in row_dtypes))
        self.formats = sorted({fmt or STACK_WEIGHT_FORMATS[dtype] for layer in layers for fmt in layer.formats}
                              | {run.format for layer in layers for runs in layer.later_runs for run in runs})
        # The LoRA hooks' shared step batch (LoRABatchRef), or None without hooks; their slot stacks
        # are bound below (kept alive by the hooks, filled in place by the LoRAManager).
        hooks = [hook for layer in layers for hook in layer.lora if hook is not None]
        self.lora_batch = hooks[0].batch_ref if hooks else lora_batch
        if any(hook.batch_ref is not self.lora_batch for hook in hooks):
            raise ValueError("DecoderStack: the layers' LoRA hooks do not share one step batch")
        self._lora_hooks = hooks
        lora_stacks = [[None if hook is None else [hook.a_t.data_ptr(), hook.b_t.data_ptr(), hook.ranks.data_ptr(),
                                                    hook.slice_starts.data_ptr(), hook.a_t.shape[0], hook.num_slices,
                                                    hook.max_rank]
                        for hook in layer.lora] for layer in layers]
        self._anchor = layers[0].qkv  # kept alive; its data_ptr tells whether the weights moved
        self._anchor_ptr = self._anchor.data_ptr()
        enums = {**FORMAT_ENUMS, "f32x16": _core.WeightFormat.F32X16, "bf16x16": _core.WeightFormat.BF16X16,
                 "f16x16": _core.WeightFormat.F16X16, "bfloat16": _core.WeightFormat.DENSE_BF16,
                 "float16": _core.WeightFormat.DENSE_F16}
        formats = [[None if fmt is None else enums[fmt] for fmt in layer.formats] for layer in layers]
        scales = [[0 if sc is None else sc.data_ptr() for sc in layer.scales] for layer in layers]
        self._scales = [layer.scales for layer in layers]  # kept alive with the weights
        perms = [[0 if perm is None else perm.data_ptr() for perm in layer.input_perms] for layer in layers]
        block_k = [[bk or 0 for bk in layer.block_k] for layer in layers]
        runs = [[[(run.weight.data_ptr(), enums[run.format], 0 if run.scales is None else run.scales.data_ptr(),
                   run.rows) for run in linear_runs] for linear_runs in layer.later_runs] for layer in layers]
        any_runs = any(linear_runs for layer in layers for linear_runs in layer.later_runs)
        any_blocks = any(bk for layer in block_k for bk in layer)
        any_perm = any(perm is not None for layer in layers for perm in layer.input_perms)
        self._layers = layers  # keeps alive what the stack points at (an x16 repack: the X16Weight's packed)
        self._stack = _core.DecoderStack(ptrs, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                                         rms_norm_eps, attn_scale, _DTYPE_CODE[dtype], -1,
                                         linear_formats=formats, linear_scales=scales,
                                         lora_stacks=lora_stacks if hooks else None,
                                         linear_input_perms=perms if any_perm else None,
                                         linear_block_k=block_k if any_blocks else None,
                                         linear_runs=runs if any_runs else None)

    def set_profiling(self, on: bool) -> None:
        """Time every op inside the stack (a benchmark aid; ~1 us a step)."""
        self._stack.profiling = on

    def profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds per op (norms, qkv, rope, cache_write, attention, o_proj, gate_up, down) since
        profiling was turned on or last reset."""
        return dict(self._stack.profile(reset))

    def matches(self, qkv_weight: torch.Tensor) -> bool:
        """Still bound to the model's weights (False after model.to() or a reload into new tensors): qkv_weight is
        stack_weight(the first layer's qkv_proj)."""
        # A repacked weight (X16Weight) has no [N, K] memory: its bytes are the x16 layout the stack reads.
        ptr = qkv_weight.held_data_ptr() if isinstance(qkv_weight, X16Weight) else qkv_weight.data_ptr()
        return ptr == self._anchor_ptr and qkv_weight.dtype == self._anchor.dtype

    @property
    def lora_steps(self) -> int:
        """Steps this stack ran with adapter rows (tests and benchmarks: the stack took them)."""
        return self._stack.lora_steps

    def adapter_rows_unbound(self) -> bool:
        """This step has adapter rows but the stack bound no slot stacks: only the layer loop's hooks
        know the adapters, so neither the stack nor the one-call decoder may take it."""
        return self.lora_batch is not None and self.lora_batch.batch is not None and not self._lora_hooks

    def lora_args(self) -> tuple[int, int, int, int]:
        """The step's adapter rows as the C++ calls take them: (token_indices, segment_slots,
        segment_starts pointers, num_segments) of the LoRABatch LoRAManager.prepare built (int32,
        contiguous; the C++ launcher checks every index), or zeros without adapter rows."""
        batch = None if self.lora_batch is None else self.lora_batch.batch
        if batch is None or not self._lora_hooks:
            return 0, 0, 0, 0
        return (batch.token_indices.data_ptr(), batch.segment_slots.data_ptr(), batch.segment_starts.data_ptr(),
                batch.segment_slots.numel())

    def takes(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """A CPU step of at most max_rows tokens (adapter rows or not: the stack adds their terms)."""
        if self.adapter_rows_unbound():
            return False
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
              and kv_cache.dtype in _CACHE_DTYPE_CODE and (kv_strides := checks.kv_cache_strides(kv_cache)) is not None
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
                "int32 tables, a contiguous or block-major cache (kv_cache.allocate) and the model's dtype and sizes")
        residual = torch.empty_like(hidden)
        num_actual = m.num_actual_tokens
        self._stack.run(hidden.data_ptr(), residual.data_ptr(), T, cos_sin.data_ptr(), kv_cache.data_ptr(),
                        _CACHE_DTYPE_CODE[kv_cache.dtype], kv_shape[2], kv_shape[4], m.slot_mapping.data_ptr(),
                        m.block_tables.data_ptr(), m.seq_lens.data_ptr(), m.query_start_loc.data_ptr(), num_seqs,
                        m.block_tables.shape[1], m.max_query_len, m.max_seq_len,
                        -1 if num_actual is None else num_actual, *self.lora_args(), *kv_strides)
        return hidden, residual
