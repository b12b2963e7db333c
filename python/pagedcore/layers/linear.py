"""Linear layers whose weights always come from a checkpoint, and fused ones that stack several.

Parameters are allocated with torch.empty: a random init of weights that are overwritten at once
would cost a second pass over ~0.5 GB (the default model in fp32) for nothing.

Calls with few rows (decode) run pagedcore's own kernel (pagedcore.ops.linear), which streams
the weights at the memory bandwidth where torch's GEMV reaches a third of it; larger calls run a
library GEMM. Where the line is and which library come from a table measured per ISA
(ops/linear_dispatch.py): on AVX512-BF16/AMX CPUs oneDNN with the weight prepacked at load
(ops/onednn_linear.py); on AVX2 torch's GEMM, with bf16 weights widened to fp32 for the call,
as torch's bf16 GEMM is 5x slower than MKL's fp32 one there (linear_ops.torch_linear).

How a layer stores its weight and multiplies by it is a weight format's business: a LinearMethod
(one per format, chosen by name at load: LINEAR_METHODS) creates the layer's tensors, fills them
from the checkpoint and computes y. The layers only hold the tensors and forward to their method,
so the model code builds the same layers whatever the format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.layers.activation import silu_mul
from pagedcore.layers.held_weights import hold_16bit_enabled, source_dtype, widen_held_layer
from pagedcore.layers.linear_bindings import KernelBinding, LibraryBinding
from pagedcore.layers.weights import CheckpointTensor, copy_weight
from pagedcore.ops import dense_repack
from pagedcore.ops import linear as linear_ops
from pagedcore.ops.dense_repack import X16Weight


class LinearMethod:
    """One weight format of linear layers: what tensors a layer holds, how checkpoint tensors fill
    them, and how y is computed. Methods keep no state (the tensors live on the layer, so
    module.to() and named_parameters() see them): one instance serves every layer of its format."""

    format: str  # the name LINEAR_METHODS knows it by

    def create_weights(self, layer: Linear, bias: bool) -> None:
        """Registers the layer's tensors (for layer.in_features -> layer.out_features), uninitialised."""
        raise NotImplementedError

    def load(self, layer: Linear, param_name: str, loaded: CheckpointTensor, name: str,
             rows: tuple[int, int] | None) -> None:
        """Fills the layer's `param_name` ("weight", "bias", or a format's own names) from one
        checkpoint tensor; rows (first output row, number of rows): one shard of a MergedLinear."""
        raise NotImplementedError

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> y [..., out] (layer.out_dtype, or x's dtype when that is None)."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: Linear) -> None:
        """Called once every checkpoint tensor of the model is loaded (vLLM's name): a format that
        re-lays its weights out for the kernels does it here, once. Nothing by default."""

    def for_lm_head(self) -> LinearMethod:
        """The method of an untied LM head in a model whose other linears use this one: itself, except where a
        quantization scheme leaves the head dense (vLLM's online fp8)."""
        return self

    def apply_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of a gate/up layer (gate rows first): [num_tokens, in] -> [num_tokens, out // 2]."""
        raise NotImplementedError

    def kernel_for(self, layer: Linear, x_dtype: torch.dtype):
        """(the C++ kernel binding that computes the whole layer for x of x_dtype: a LinearKernel or
        QuantLinearKernel with a .handle, the most rows it takes in one call), or None where no single
        binding does (a library GEMM, parts in several formats): models/greedy_decode.py runs the LM
        head through it."""
        return None


class DenseLinearMethod(LinearMethod):
    """W stored as used: [out, in] in one float dtype. Few rows run the kernel (KernelBinding),
    more rows the library GEMM the CPU's plan names (LibraryBinding; see the top of this file).

    Where dense_repack.dense_repack_enabled() (AVX512-BF16 CPUs by default; PAGEDCORE_DENSE_REPACK),
    process_weights_after_loading repacks W into its x16 layout and every row count runs the
    outer-product kernel on it (no library GEMM, no oneDNN copy). The repack is W's only copy:
    layer.weight becomes an X16Weight (ops/dense_repack.py), which reads as W [out, in] to torch
    (unpacked per op: a GPU move, a reader of layer.weight) while holding only the x16 bytes, so the
    layer keeps 1x the weight bytes, as without the repack (the checkpoint-layout copy is freed). A
    reload of W first turns it back into a plain parameter (load), and processing repacks it again."""

    def __init__(self, format: str, dtype: torch.dtype, x_dtypes: tuple[torch.dtype, ...] | None = None):
        self.format = format
        self.dtype = dtype
        self.x_dtypes = x_dtypes or (dtype,)  # the activation dtypes its kernel bindings take

    def create_weights(self, layer: Linear, bias: bool) -> None:
        layer.weight = nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=self.dtype),
                                    requires_grad=False)  # [out, in]; an X16Weight once repacked
        layer.bias = (nn.Parameter(torch.empty(layer.out_features, dtype=self.dtype), requires_grad=False)
                      if bias else None)  # [out]
        layer._rows_loaded = set()  # (first row, rows) of the weight filled so far: prepack when complete
        layer._source_dtypes = set()  # the checkpoint dtypes of the weight's tensors (None: not known)
        layer._library = LibraryBinding(layer.weight)
        self._bind(layer, x16=False)

    def load(self, layer: Linear, param_name: str, loaded: CheckpointTensor, name: str,
             rows: tuple[int, int] | None) -> None:
        if param_name not in ("weight", "bias"):
            raise ValueError(f"checkpoint tensor {name!r}: a {self.format} linear layer holds weight and bias, "
                             f"not {param_name!r}; is the checkpoint quantised in a format pagedcore lacks?")
        if param_name == "weight" and isinstance(layer.weight, X16Weight):
            restore_checkpoint_layout(layer)  # a reload after processing: rows are written in the checkpoint layout
        if param_name == "weight" and self in HELD_16BIT_METHODS.values() and source_dtype(loaded) is not self.dtype:
            widen_held_layer(layer)  # a held 16-bit layer receiving other values: fp32 again, losslessly
            layer.method.load(layer, param_name, loaded, name, rows)
            return
        param = layer.weight if param_name == "weight" else layer.bias
        if param is None:
            raise ValueError(f"the checkpoint has {name!r} but this layer was built without a bias; "
                             "check attention_bias in the config")
        target = param.data if rows is None else param.data.narrow(0, rows[0], rows[1])  # rows: contiguous
        copy_weight(target, loaded, name)
        if param_name == "weight":
            layer._source_dtypes.add(source_dtype(loaded))
            # Prepack once the whole weight is in (a reload of any part packs it again).
            layer._rows_loaded.add(rows or (0, layer.out_features))
            layer._library.packed = None
            if sum(n for _, n in layer._rows_loaded) >= layer.out_features:
                layer._library.prepack(layer.weight, layer.bias)

    def process_weights_after_loading(self, layer: Linear) -> None:
        """An fp32 layer whose checkpoint weight tensors were all bf16 or all fp16 is held in that dtype
        (layers/held_weights.py; a bias stays fp32, as loaded: the kernels add it in fp32 as for an fp32 layer). Then repacks W into its x16 layout where that is on and the shape allows
        (dense_repack); the checkpoint-layout tensor is dropped (freed unless something else holds it)."""
        held = HELD_16BIT_METHODS.get(next(iter(layer._source_dtypes))) if len(layer._source_dtypes) == 1 else None
        if (self.dtype is torch.float32 and self.x_dtypes == (torch.float32,) and held is not None
                and layer.weight.is_cpu and not isinstance(layer.weight, X16Weight) and hold_16bit_enabled()):
            held.take(layer, layer.weight.data.to(held.dtype))  # exact
            held.process_weights_after_loading(layer)
            return
        weight = layer.weight
        if isinstance(weight, X16Weight) or not (dense_repack.dense_repack_enabled(self.dtype) and weight.is_cpu):
            return
        gate_up = isinstance(layer, MergedLinear) and len(layer.shard_rows) == 2
        if dense_repack.x16_problem(weight) or (gate_up and dense_repack.x16_problem(weight, silu_mul=True)):
            return  # the checkpoint layout, as before
        layer.weight = nn.Parameter(X16Weight.of(weight.data), requires_grad=False)
        layer._library.packed = None  # every row count runs the x16 kernel: no oneDNN copy
        self._bind(layer, x16=True)

    def take(self, layer: Linear, weight: torch.Tensor) -> None:
        """`layer` becomes this method's, holding `weight` [out, in] of self.dtype (held_weights.py); its bias, if
        any, stays as it is (fp32 under a held 16-bit weight)."""
        layer.method = self
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer._library = LibraryBinding(layer.weight)
        self._bind(layer, x16=False)

    @staticmethod
    def _bind(layer: Linear, x16: bool) -> None:
        """Kernel bindings for W as held: its x16 repack (x16) or the checkpoint layout."""
        layer._kernel = KernelBinding(layer.weight, out_dtype=layer.out_dtype, x16=x16)
        # Bound lazily by the kernel at first use; only gate/up layers ever call it.
        layer._silu_mul_kernel = KernelBinding(layer.weight, silu_mul=True, x16=x16)

    def _held(self, layer: Linear) -> torch.Tensor | None:
        """The x16 layout the kernels read, or None for the checkpoint layout (rebinding if W was
        replaced since: .data = t, module.to() to another device or dtype)."""
        weight = layer.weight
        packed = weight.packed if type(weight) is X16Weight else None
        if packed is None and type(weight) is X16Weight:  # aliases a plain tensor now: hold that
            layer.weight = nn.Parameter(weight.plain, requires_grad=False)
        if layer._kernel.x16 != (packed is not None):
            self._bind(layer, x16=packed is not None)
        return packed

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        packed = self._held(layer)
        kernel = layer._kernel
        if kernel.takes(x):
            weight = layer.weight if packed is None else packed
            return kernel(x, weight, layer.bias)  # [num_rows, in] -> [num_rows, out]
        if packed is None:
            y = layer._library(x, layer.weight, layer.bias)  # [..., in] -> [..., out]
        else:  # not a 2-D CPU x of 1..X16_MAX_ROWS rows: W unpacked for this call (never seen in serving)
            y = linear_ops.torch_linear(x, dense_repack.unpack_x16(packed), layer.bias)
        return y if layer.out_dtype is None else y.to(layer.out_dtype)

    def kernel_for(self, layer: Linear, x_dtype: torch.dtype):
        """(the kernel that runs this layer for x of x_dtype, the most rows it takes), or None where the
        layer's calls go elsewhere (not on the CPU, an adapter hook)."""
        packed = self._held(layer)
        if layer.lora is not None or not layer.weight.is_cpu or x_dtype not in self.x_dtypes:
            return None
        binding = layer._kernel
        kernel = binding.bound(layer.weight if packed is None else packed, layer.bias, x_dtype)
        return kernel, binding.max_rows

    def apply_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        packed = self._held(layer)
        # Few rows: one kernel call, SwiGLU in its epilogue (no [num_tokens, out] intermediate).
        kernel = layer._silu_mul_kernel
        if kernel.takes(x):
            return kernel(x, layer.weight if packed is None else packed, layer.bias)
        if packed is None:
            gate_up = layer._library(x, layer.weight, layer.bias)  # [num_tokens, out]
        else:  # as in apply: W unpacked for this call
            gate_up = linear_ops.torch_linear(x, dense_repack.unpack_x16(packed), layer.bias)
        half = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :half]).mul_(gate_up[..., half:])


def current_x16_weight(layer: Linear) -> torch.Tensor | None:
    """The x16 layout a repacked dense layer holds W in (X16Weight.packed: what its kernels and the
    decoder stack read), or None: not repacked, or W replaced since (.data = t, a move to another
    device or dtype), in which case the layer runs the checkpoint layout."""
    weight = getattr(layer, "weight", None)
    return weight.packed if type(weight) is X16Weight else None


def restore_checkpoint_layout(layer: Linear) -> None:
    """Puts a repacked layer's W back in the checkpoint layout, a plain [out, in] parameter (for a
    reload that writes rows of it), and frees the x16 copy; the library GEMM prepacks at its first
    call. No-op for a layer that is not repacked."""
    weight = layer.weight
    if type(weight) is not X16Weight:
        return
    layer.weight = nn.Parameter(weight.unpacked().contiguous(), requires_grad=False)  # [out, in]
    DenseLinearMethod._bind(layer, x16=False)


# Weight format name -> its method. The loader picks the name (loader/model_loader.py); the model
# passes the method to every Linear it builds. A quantised format adds its class and one entry.
LINEAR_METHODS: dict[str, LinearMethod] = {
    "float32": DenseLinearMethod("float32", torch.float32),
    "bfloat16": DenseLinearMethod("bfloat16", torch.bfloat16),
}
# bf16 / fp16 weights under fp32 activations, held as stored (layers/held_weights.py); the kernels widen the
# weights (exact: the sums of an fp32 copy), torch's path widens them per call.
BF16_WEIGHTS_FP32_ACTIVATIONS = DenseLinearMethod("bfloat16", torch.bfloat16, x_dtypes=(torch.bfloat16, torch.float32))
FP16_WEIGHTS_FP32_ACTIVATIONS = DenseLinearMethod("float16", torch.float16, x_dtypes=(torch.float32,))
# Checkpoint dtype -> the method that holds such a layer as stored under fp32 activations.
HELD_16BIT_METHODS: dict[torch.dtype, DenseLinearMethod] = {
    torch.bfloat16: BF16_WEIGHTS_FP32_ACTIVATIONS, torch.float16: FP16_WEIGHTS_FP32_ACTIVATIONS}
# Named so asking for one says "planned", not "unknown". The quantized formats ("gguf": GGUF blocks
# kept per layer, "int8_per_channel") are registered at the bottom of this file (linear_quant.py).
PLANNED_FORMATS: tuple[str, ...] = ()


def linear_method(weight_format: str) -> LinearMethod:
    """The method of a weight format name; raises with the known names otherwise."""
    method = LINEAR_METHODS.get(weight_format)
    if method is None:
        planned = " (planned, not implemented yet)" if weight_format in PLANNED_FORMATS else ""
        raise ValueError(f"weight format {weight_format!r}{planned} has no linear method; pagedcore runs "
                         f"{sorted(LINEAR_METHODS)}")
    return method


class Linear(nn.Module):
    """y = x @ W.T (+ b), for inference only; `method` (the weight format) holds W's layout and
    the arithmetic, the layer the tensors."""

    def __init__(self, in_features: int, out_features: int, bias: bool, method: LinearMethod,
                 out_dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.out_dtype = out_dtype  # None: x's dtype. The LM head asks for fp32 logits straight from the kernel
        self.method = method
        method.create_weights(self, bias)
        # The LoRA hook: pagedcore.lora sets a module that adds this step's adapter terms to y
        # (lora(x, y) -> y); None without adapters. Format-agnostic: it sees only x and y.
        self.lora: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.method.apply(self, x)  # [..., in] -> [..., out]
        return y if self.lora is None else self.lora(x, y)

    def load_weight(self, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        """Fills one of this layer's tensors from the checkpoint tensor `name`."""
        self.method.load(self, param_name, loaded, name, None)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, "
                f"format={self.method.format}")


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim, so one GEMM does them all.

    The q/k/v projections become one `qkv_proj`, gate and up one `gate_up_proj`: one pass over the
    activations instead of three (two), and bigger GEMMs. Checkpoints keep them apart, so each
    part ("shard") is copied into its rows at load time:

        weight rows  [0, size_0)  [size_0, size_0 + size_1)  ...
        shard         shard_ids[0]  shard_ids[1]            ...
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool, method: LinearMethod):
        super().__init__(in_features, sum(shard_sizes.values()), bias, method)
        self.shard_rows: dict[str, tuple[int, int]] = {}  # shard id -> (first row, number of rows)
        start = 0
        for shard_id, size in shard_sizes.items():
            self.shard_rows[shard_id] = (start, size)
            start += size

    def forward_silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for a gate/up projection (two shards of equal size, gate first):
        [num_tokens, in] -> [num_tokens, out // 2]; the method may fuse the SwiGLU into its GEMM."""
        if self.lora is not None and self.lora.active:  # adapter terms go in before the SwiGLU
            # The kernel's SwiGLU epilogue on its own: the C++ decoder stack's LoRA steps round the same.
            return silu_mul(self.forward(x))  # via [num_tokens, out]
        return self.method.apply_silu_mul(self, x)

    def load_shard(self, shard_id: str, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        """Fills one shard's rows (weight [rows, in], bias [rows]) from one checkpoint tensor."""
        self.method.load(self, param_name, loaded, name, self.shard_rows[shard_id])


class RowParallelLinear(Linear):
    """A linear whose input features are split over the tensor-parallel ranks (o_proj, down_proj):
    each rank holds W's columns of its slice, computes the partial product x_r @ W_r.T, and one
    all_reduce sums the partials, so every rank leaves with the full y. No bias: each rank would add
    it (the Llama family has none there). Column-parallel layers need no class: a MergedLinear built
    with this rank's sizes, filled with its rows (distributed/shard_weights.py).

    Partials of a bf16 model are kept and summed in fp32 and rounded to bf16 once, after the sum, as
    one process's GEMM rounds its fp32 accumulator once; summing bf16 partials would round twice."""

    def __init__(self, in_features: int, out_features: int, method: LinearMethod, comm):
        dtype = getattr(method, "dtype", torch.float32)
        super().__init__(in_features, out_features, bias=False, method=method,
                         out_dtype=torch.float32 if dtype is not torch.float32 else None)
        self.comm = comm  # distributed.communicator.Communicator of this stage's tensor-parallel group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)  # [..., out], this rank's partial sum (a new contiguous tensor; fp32)
        self.comm.all_reduce(y)
        return y if y.dtype is x.dtype else y.to(x.dtype)


from pagedcore.layers.linear_quant import QUANT_LINEAR_METHODS  # noqa: E402 (it subclasses LinearMethod above)

LINEAR_METHODS.update(QUANT_LINEAR_METHODS)
