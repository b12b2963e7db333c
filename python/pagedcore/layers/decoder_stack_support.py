"""Whether the C++ decoder stack (layers/decoder_stack.py) runs a model's layers exactly as their
Python forward does: the stack reads raw weight pointers, so a feature added to the Python layers
(an adapter, a weight format, a bias, a module) that it does not know would otherwise be skipped
without a word. decoder_stack_support() names the first such thing; the model then runs the layer loop.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from pagedcore.layers.attention import Attention
from pagedcore.layers.decoder_stack import (DENSE_FORMAT_DTYPES, HELD_ROW_FORMATS, LAYER_PARAMS, LINEAR_FIELDS,
                                            MAX_LATER_RUNS,
                                            LINEAR_LEAVES, STACK_WEIGHT_FORMATS, LayerTensors, layer_tensors,
                                            stack_shapes)
from pagedcore.layers.layernorm import RMSNorm
from pagedcore.layers.linear import HELD_16BIT_METHODS, Linear, MergedLinear, RowParallelLinear
from pagedcore.layers.linear_quant import QuantLinearMethod
from pagedcore.ops.dense_repack import X16_FORMATS, packed_shape
from pagedcore.ops.quant_linear import INT8_FORMATS, QUANT_FORMATS, SCALED_FORMATS, row_bytes

# What cpp/kernels/decoder_stack.h runs; decoder_stack_support() holds a model to it.
# Rope scaling of any kind is in: the stack reads the cos/sin rows the Python RotaryEmbedding made.
STACK_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
# Quantized linear layers (layers/linear_quant.py) of one format over all their rows run in the
# stack too, by the same kernels: ops/quant_linear.py's formats (fp8 e4m3 rows with their scales included).
STACK_QUANT_FORMATS = frozenset(QUANT_FORMATS)
# The dense x16 repacks likewise run their own kernel at every row count in the layers (X16_MAX_ROWS).
_X16_NAMES = frozenset(X16_FORMATS.values())
_NORM_LEAVES = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")
# Why a tensor-parallel shard runs the layer loop: the stack runs every layer in one call, but each
# layer's o_proj and down_proj outputs must be summed over the ranks before the next op.
TENSOR_PARALLEL_REASON = "tensor parallel: the all-reduce sits between layers"


@dataclasses.dataclass(frozen=True)
class StackSupport:
    """Whether the stack runs a model's layers; reason says why not ("" when it does)."""

    supported: bool
    reason: str = ""


def decoder_stack_support(config, layers) -> StackSupport:
    """Can DecoderStack run these layers (the Llama family's decoder layers, `config` a ModelConfig)
    exactly as their Python forward does? Rules, in order:
      switch      PAGEDCORE_DECODER_STACK is not "0"
      parallel    no tensor-parallel layer (RowParallelLinear: an all-reduce inside the layer)
      model       an architecture in STACK_ARCHITECTURES; fp32 or bf16; one layer per config layer
      modules     each layer's leaf modules are exactly the known ones, of exactly their classes
                  (RMSNorm, Linear, MergedLinear, Attention, and a linear's LoRA hook, whose slot
                  stacks the stack binds and runs), q_norm and k_norm both or neither: a wrapper or
                  new module is something the stack would skip
      tensors     the layer's parameters are those in LAYER_PARAMS (bias on qkv only), no buffers
      formats     every Linear has the dense method of the model dtype (or, under fp32, a checkpoint's
                  bf16 / fp16 tensor held as stored), or is quantized in one format over all its rows
                  (QuantLinearMethod with one part), and the layer dtype out
      constants   norms use config.rms_norm_eps; attention scale and head counts as layer 0's
      placement   every tensor a contiguous CPU tensor of the model dtype and the expected shape
    """
    if os.environ.get("PAGEDCORE_DECODER_STACK", "1") == "0":
        return StackSupport(False, "turned off by PAGEDCORE_DECODER_STACK=0")
    if any(isinstance(module, RowParallelLinear) for layer in layers for module in layer.modules()):
        return StackSupport(False, TENSOR_PARALLEL_REASON)
    if config.architecture not in STACK_ARCHITECTURES:
        return StackSupport(False, f"architecture {config.architecture} is not one the stack runs "
                                   f"({sorted(STACK_ARCHITECTURES)})")
    dtype = config.torch_dtype
    if dtype not in STACK_WEIGHT_FORMATS:
        return StackSupport(False, f"dtype {dtype}; the stack runs {sorted(STACK_WEIGHT_FORMATS.values())}")
    if len(layers) != config.num_layers or not layers:
        return StackSupport(False, f"{len(layers)} layers for a config of {config.num_layers}")
    from pagedcore.lora.layer_weights import LoRALayerWeights

    leaf_class = {**dict.fromkeys(_NORM_LEAVES, RMSNorm), "self_attn.attn": Attention,
                  # An adapter hook (--enable-lora): the stack adds its terms after the linear.
                  **{f"{name}.lora": LoRALayerWeights for name in LINEAR_LEAVES},
                  "self_attn.qkv_proj": MergedLinear, "self_attn.o_proj": Linear,
                  "mlp.gate_up_proj": MergedLinear, "mlp.down_proj": Linear}
    scale = layers[0].self_attn.attn.scale
    tensors = []
    for index, layer in enumerate(layers):
        where = f"layer {index}"
        # Leaf modules, and the linears even with an adapter hook (their one child) attached.
        leaves = {name: module for name, module in layer.named_modules()
                  if not any(module.children()) or name in LINEAR_LEAVES}
        for name, module in leaves.items():
            if type(module) is not leaf_class.get(name):
                return StackSupport(False, f"{where} has {name} ({type(module).__name__}), which the stack "
                                           "does not run")
        if ("self_attn.q_norm" in leaves) != ("self_attn.k_norm" in leaves):
            return StackSupport(False, f"{where} has only one of q_norm and k_norm")
        extra = [name for name, _ in layer.named_parameters() if name not in LAYER_PARAMS]
        extra += [name for name, _ in layer.named_buffers() if ".lora." not in name]  # the adapter stacks
        if extra:
            return StackSupport(False, f"{where} has {extra}, which the stack does not read (its tensors: "
                                       "the norms, qkv weight and bias, o_proj, gate_up and down weights)")
        for name in LINEAR_LEAVES:
            linear = leaves.get(name)
            if linear is None:
                return StackSupport(False, f"{where} lacks {name}")
            problem = _linear_format_problem(linear, dtype)
            if problem:
                return StackSupport(False, f"{where} {name} {problem}")
        norm_eps = {leaves[name].eps for name in _NORM_LEAVES if name in leaves}
        if norm_eps != {config.rms_norm_eps}:
            return StackSupport(False, f"{where} has RMSNorm eps {sorted(norm_eps)}, not the config's "
                                       f"{config.rms_norm_eps}")
        attn = leaves["self_attn.attn"]
        if (attn.scale, attn.num_heads, attn.num_kv_heads, attn.head_dim) != (
                scale, config.num_heads, config.num_kv_heads, config.head_dim):
            return StackSupport(False, f"{where} attention differs from the stack's one shape and scale")
        tensors.append(layer_tensors(layer))
    problem = tensor_problem(tensors, stack_shapes(config.hidden_size, config.num_heads, config.num_kv_heads,
                                               config.head_dim, config.intermediate_size), dtype)
    return StackSupport(False, problem) if problem else StackSupport(True)


def _linear_format_problem(linear: Linear, dtype: torch.dtype) -> str:
    """Why the stack cannot run this linear layer as the Python layer does ("" if it can)."""
    if linear.out_dtype is not None:
        return f"returns {linear.out_dtype}, not the layer dtype"
    if isinstance(linear.method, QuantLinearMethod):
        parts = linear.quant_parts
        if sum(p.num_rows for p in parts) != linear.out_features:
            return f"has {sum(p.num_rows for p in parts)} of its {linear.out_features} rows loaded"
        # Several parts (a file mixing block types inside one fused layer: a small model's Q4_K_M holds q / k in
        # Q5_0 and v in Q8_0) run as the first part and later runs of other formats, one kernel call each.
        if len(parts) > 1 + MAX_LATER_RUNS or (len(parts) > 1 and any(p.block_k is not None for p in parts)):
            return (f"has {len(parts)} weight parts ({[p.format for p in parts]}); the stack runs at most "
                    f"{1 + MAX_LATER_RUNS}, none with fp8 block scales")
        for fmt in (p.format for p in parts):
            if fmt not in STACK_QUANT_FORMATS:
                # A float part beside quantized parts runs torch's F.linear in the layer (other rounding than the
                # stack's dense kernel); a whole float layer became dense at load.
                return (f"has a {fmt!r} part (a float tensor in a quantized file); the stack runs "
                        f"{sorted(STACK_QUANT_FORMATS)}")
        return ""
    if dtype is torch.float32 and linear.method in HELD_16BIT_METHODS.values():
        return ""  # a checkpoint's bf16 / fp16 tensor held as stored: the kernels widen it under fp32 x
    if linear.method.format != STACK_WEIGHT_FORMATS[dtype]:
        return (f"has weight format {linear.method.format!r}; the stack reads {STACK_WEIGHT_FORMATS[dtype]!r} or "
                f"{sorted(STACK_QUANT_FORMATS)}")
    return ""


def _stored_shape(field: str, shape: tuple[int, ...], dtype: torch.dtype, layer: LayerTensors
                  ) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype a field's tensor is stored with: a quantized linear weight [N, K] is N
    rows of its format's bytes."""
    if field in LINEAR_FIELDS:
        fmt = layer.formats[LINEAR_FIELDS.index(field)]
        if fmt is not None:
            n, k = shape
            n -= sum(run.rows for run in layer.later_runs[LINEAR_FIELDS.index(field)])  # the first run's rows
            if fmt in _X16_NAMES:
                weight_dtype = DENSE_FORMAT_DTYPES[fmt]  # (the model's, or a held 16-bit tensor's)
                return packed_shape(n, k, weight_dtype), weight_dtype
            if fmt in HELD_ROW_FORMATS.values():
                return shape, DENSE_FORMAT_DTYPES[fmt]
            return ((n, k), torch.int8) if fmt in INT8_FORMATS else ((n, row_bytes(fmt, k)), torch.uint8)
    return shape, dtype


def tensor_problem(layers: list[LayerTensors], shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> str:
    """Why the stack cannot read these tensors ("" if it can)."""
    for index, layer in enumerate(layers):
        for field, logical_shape in shapes.items():
            t = getattr(layer, field)
            if t is None:
                continue
            try:
                shape, want = _stored_shape(field, logical_shape, dtype, layer)
            except ValueError as e:  # K not a multiple of the format's block
                return f"layer {index} {field}: {e}"
            if t.shape != shape or t.dtype != want or not t.is_contiguous() or t.device.type != "cpu":
                return (f"layer {index} {field}: {tuple(t.shape)} {t.dtype} on {t.device} (contiguous: "
                        f"{t.is_contiguous()}); DecoderStack needs a contiguous CPU {want} tensor of shape {shape}")
        for runs, field in zip(layer.later_runs, LINEAR_FIELDS):
            problem = _runs_problem(runs, field, shapes[field], dtype, layer)
            if problem:
                return f"layer {index} {field}: {problem}"
        for fmt, scales, block_k, field in zip(layer.formats, layer.scales, layer.block_k, LINEAR_FIELDS):
            rows, cols = shapes[field][:2]
            rows -= sum(run.rows for run in layer.later_runs[LINEAR_FIELDS.index(field)])  # the first run's
            want = (rows,) if block_k is None else (rows // 16, -(-cols // block_k))  # (block-wise: per 16 rows)
            if block_k is not None and fmt != "fp8_e4m3x16":
                return f"layer {index} {field}: block-wise scales go with fp8_e4m3x16 weights, not {fmt}"
            if (fmt in SCALED_FORMATS) != (scales is not None) or (scales is not None and (
                    scales.dtype != torch.float32 or scales.shape != want or not scales.is_contiguous())):
                return (f"layer {index} {field}: {fmt or 'a dense weight'} "
                        + (f"needs contiguous fp32 scales of shape {want}" if fmt in SCALED_FORMATS else
                           "takes no scales (int8_per_channel and fp8_e4m3 do)"))
        for perm, field in zip(layer.input_perms, LINEAR_FIELDS):
            cols = shapes[field][1]
            if perm is not None and (perm.dtype != torch.int64 or tuple(perm.shape) != (cols,)
                                     or not perm.is_contiguous() or perm.device.type != "cpu"
                                     or not torch.equal(perm.sort().values, torch.arange(cols))):
                return f"layer {index} {field}: an input order must be a contiguous CPU int64 permutation of {cols}"
        if (layer.q_norm is None) != (layer.k_norm is None):
            return f"layer {index}: q_norm and k_norm come together"
        for hook, field in zip(layer.lora, LINEAR_FIELDS):
            problem = _lora_problem(hook, *shapes[field])
            if problem:
                return f"layer {index} {field} LoRA stacks: {problem}"
    return ""


def _runs_problem(runs, field: str, shape: tuple[int, ...], dtype: torch.dtype, layer: LayerTensors) -> str:
    """Why the stack cannot read a linear's later weight runs ("" if it can, or there are none)."""
    if not runs:
        return ""
    rows, cols = shape
    if len(runs) > MAX_LATER_RUNS or sum(run.rows for run in runs) >= rows:
        return f"{len(runs)} later weight runs of {sum(run.rows for run in runs)} rows in a linear of {rows}"
    for run in runs:
        if run.format not in STACK_QUANT_FORMATS:
            return f"a later weight run in {run.format!r}; the stack runs {sorted(STACK_QUANT_FORMATS)} there"
        want = ((run.rows, row_bytes(run.format, cols)), torch.int8 if run.format in INT8_FORMATS else torch.uint8)
        t = run.weight
        if tuple(t.shape) != want[0] or t.dtype != want[1] or not t.is_contiguous() or t.device.type != "cpu":
            return f"a later weight run is {tuple(t.shape)} {t.dtype}; the stack reads contiguous CPU {want}"
        sc = run.scales
        if (run.format in SCALED_FORMATS) != (sc is not None) or (sc is not None and (
                sc.dtype != torch.float32 or tuple(sc.shape) != (run.rows,) or not sc.is_contiguous())):
            return f"a later {run.format} run's scales must be contiguous fp32 [{run.rows}] (and only where scaled)"
    return ""


def _lora_problem(hook, out_features: int, in_features: int) -> str:
    """Why the stack cannot read a linear's LoRA slot stacks ("" if it can, or there is no hook)."""
    if hook is None:
        return ""
    a_t, b_t, ranks, starts = hook.a_t, hook.b_t, hook.ranks, hook.slice_starts
    num_slots, sr = a_t.shape[0], hook.num_slices * hook.max_rank
    want = {"a_t": (a_t, torch.float32, (num_slots, in_features, sr)),
            "b_t": (b_t, torch.float32, (num_slots, sr, out_features)),
            "ranks": (ranks, torch.int32, (num_slots, hook.num_slices)),
            "slice_starts": (starts, torch.int32, (hook.num_slices + 1,))}
    for name, (t, dtype, shape) in want.items():
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.device.type != "cpu":
            return (f"{name} is {tuple(t.shape)} {t.dtype} on {t.device}; the stack reads a contiguous CPU "
                    f"{dtype} tensor of shape {shape}")
    return ""
