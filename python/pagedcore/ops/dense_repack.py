"""The dense x16 layouts of cpp/kernels/linear.h (kDenseF32x16, kDenseBf16x16, kDenseF16x16): a float weight
W [N, K] re-laid once at load so that one vector holds 16 output columns, as the quantized x16
formats do (docs/quant_kernels.md). The kernel (cpp/kernels/dense_x16_impl.h) then broadcasts x and
never folds an accumulator horizontally:

    f32x16   [N/16, K, 16]        packed[g, k, c]    = W[16 g + c, k]
    bf16x16  [N/16, K/2, 16, 2]   packed[g, p, c, j] = W[16 g + c, 2 p + j]
    f16x16   [N/16, K, 16]        packed[g, k, c]    = W[16 g + c, k]   (fp16: a held GPTQ / AWQ head)

The same bytes as W, lossless both ways (unpack_x16). Shapes the layout cannot hold (N not a
multiple of 16, K odd for bf16) stay in the checkpoint layout: x16_problem() says why.

X16Weight is how a layer holds W once repacked: a tensor that reads as W [N, K] to torch (shape,
dtype, every op, module.to()) while its only bytes are the x16 layout, unpacked for an op on demand.
"""

from __future__ import annotations

import copy
import os

import torch
from torch.utils._pytree import tree_map

__all__ = ["DEFAULT_ON_ISAS", "X16_FORMATS", "X16_MAX_ROWS", "X16Weight", "dense_repack_enabled",
           "pack_x16", "packed_shape", "unpack_x16", "x16_problem"]

X16_COLS = 16
# Weight dtype -> the x16 format name (the WeightFormat names F32X16, BF16X16, F16X16 of the binding).
X16_FORMATS = {torch.float32: "f32x16", torch.bfloat16: "bf16x16", torch.float16: "f16x16"}


# Rows up to which a repacked layer (and a decoder stack of repacked layers) calls the x16 kernel:
# every step (it matched or beat oneDNN at 256-512 rows, docs/performance.md "Dense x16 layouts");
# the bound only keeps activation buffers sane, as the quantized stack's.
X16_MAX_ROWS = 1 << 16
# The GEMM_PLANS rows (ops/linear_dispatch.py gemm_isa) where repacking is on by default: measured
# there. AVX2 / AVX-512 without BF16 run the kernel too but were not measured; on AMX CPUs oneDNN
# uses the tiles, which this kernel does not.
DEFAULT_ON_ISAS = frozenset({"avx512_bf16"})


def dense_repack_enabled(dtype: torch.dtype) -> bool:
    """Whether dense layers of `dtype` repack at load: PAGEDCORE_DENSE_REPACK=1 turns it on, 0 off;
    unset, on where the CPU's GEMM_PLANS row is in DEFAULT_ON_ISAS."""
    env = os.environ.get("PAGEDCORE_DENSE_REPACK")
    if env not in (None, "0", "1"):
        raise ValueError(f"PAGEDCORE_DENSE_REPACK={env!r}; set 1 (repack dense weights at load) or 0 (keep them)")
    if dtype not in X16_FORMATS:
        return False
    if env is not None:
        return env == "1"
    from pagedcore.ops.linear_dispatch import gemm_isa
    return gemm_isa() in DEFAULT_ON_ISAS


def x16_problem(weight: torch.Tensor, silu_mul: bool = False) -> str:
    """"" if `weight` [N, K] (gate/up halves when silu_mul) can be repacked, else why not."""
    if weight.dtype not in X16_FORMATS:
        return f"dtype {weight.dtype} has no x16 layout"
    if weight.dim() != 2:
        return f"weight has shape {tuple(weight.shape)}, not [N, K]"
    N, K = weight.shape
    cols = N // 2 if silu_mul else N
    if N % X16_COLS or cols % X16_COLS or (silu_mul and N % 2):
        return f"N = {N}{' (gate/up halves)' if silu_mul else ''} is not a multiple of 16"
    if weight.dtype is torch.bfloat16 and K % 2:
        return f"K = {K} is odd (bf16x16 holds pairs along K)"
    return ""


def packed_shape(N: int, K: int, dtype: torch.dtype) -> tuple[int, ...]:
    if dtype is torch.bfloat16:
        return (N // X16_COLS, K // 2, X16_COLS, 2)
    return (N // X16_COLS, K, X16_COLS)


def pack_x16(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> a new contiguous tensor in the x16 layout of its dtype (see the top of this file)."""
    problem = x16_problem(weight)
    if problem:
        raise ValueError(f"cannot repack this weight into an x16 layout: {problem}; keep the checkpoint layout")
    N, K = weight.shape
    if weight.dtype is torch.bfloat16:
        return weight.reshape(N // X16_COLS, X16_COLS, K // 2, 2).permute(0, 2, 1, 3).contiguous()
    return weight.reshape(N // X16_COLS, X16_COLS, K).transpose(1, 2).contiguous()


def unpack_x16(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_x16: a new contiguous [N, K] in the checkpoint layout."""
    if packed.dtype is torch.bfloat16 and packed.dim() == 4:
        G, P = packed.shape[0], packed.shape[1]
        return packed.permute(0, 2, 1, 3).reshape(G * X16_COLS, 2 * P)
    if packed.dtype in (torch.float32, torch.float16) and packed.dim() == 3:
        G, K = packed.shape[0], packed.shape[1]
        return packed.transpose(1, 2).reshape(G * X16_COLS, K)
    raise ValueError(f"not an x16 layout: shape {tuple(packed.shape)}, dtype {packed.dtype}")


class X16Weight(torch.Tensor):
    """W [N, K] whose bytes are only its x16 layout (`packed`, pack_x16's tensor): the one copy of a
    repacked dense weight. To torch it is W: shape, dtype, device, nbytes are W's, and any op
    (F.linear, .t(), .clone(), torch.equal, .to("cuda")) runs on W unpacked for that op, a temporary
    (slow, off the hot path: the layer's kernels and the decoder stack read `packed` itself).

    Writes keep it honest: an in-place op on it (copy_, add_, ...) rewrites `packed`; assigning
    .data = t makes it an alias of t (`packed` None, `plain` t; the layer then swaps in a plain
    parameter). data_ptr() raises while packed, as no [N, K] memory exists to point at. Not kept:
    a write through a view (w[0] = ..., w.narrow(...).copy_()) lands in a temporary; write the
    whole tensor instead."""

    packed: torch.Tensor | None  # the x16 layout of W: f32 / fp16 [N/16, K, 16], bf16 [N/16, K/2, 16, 2]
    plain: torch.Tensor | None  # after .data = t: t (any layout), packed then None

    @staticmethod
    def __new__(cls, packed: torch.Tensor, shape: tuple[int, int]):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=packed.dtype, device=packed.device,
                                                   requires_grad=False)

    def __init__(self, packed: torch.Tensor, shape: tuple[int, int]):
        self.packed, self.plain = packed, None

    @classmethod
    def of(cls, weight: torch.Tensor) -> X16Weight:
        """W [N, K] repacked (x16_problem(weight) must be "")."""
        return cls(pack_x16(weight), tuple(weight.shape))

    def unpacked(self) -> torch.Tensor:
        """W [N, K] as a plain tensor: a new one in the checkpoint layout (or the aliased `plain`)."""
        return self.plain if self.packed is None else unpack_x16(self.packed)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default) and args[0].packed is not None:
            return X16Weight(args[0].packed, tuple(args[0].shape))  # .data, detach(), nn.Parameter(): same bytes
        values = {}  # id(X16Weight) -> W's values for this op (one unpack per argument)

        def unwrap(t):
            if not isinstance(t, X16Weight):
                return t
            if id(t) not in values:
                values[id(t)] = t.unpacked()
            return values[id(t)]

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if func._schema.is_mutable:  # the written arguments: their new values go back into them
            for index, schema_arg in enumerate(func._schema.arguments):
                arg = args[index] if index < len(args) else kwargs.get(schema_arg.name)
                alias = schema_arg.alias_info
                if not (isinstance(arg, X16Weight) and alias is not None and alias.is_write):
                    continue
                written = values[id(arg)]
                if arg.packed is not None:
                    arg.packed.copy_(pack_x16(written))
                out = tree_map(lambda t: arg if t is written else t, out)  # an op returning self returns the weight
        return out

    @property
    def data(self) -> torch.Tensor:
        return self.detach()

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        torch._C.TensorBase.data.__set__(self, new)  # shape, strides, dtype, device become new's
        if isinstance(new, X16Weight):
            self.packed, self.plain = new.packed, new.plain
        else:
            self.packed, self.plain = None, new

    def held_data_ptr(self) -> int:
        """Where the bytes are: `packed` (or the aliased plain tensor): for "has W moved?" checks."""
        return (self.plain if self.packed is None else self.packed).data_ptr()

    def data_ptr(self) -> int:
        if self.packed is None:
            return self.plain.data_ptr()
        raise RuntimeError("this weight is held only in its x16 layout (X16Weight): it has no [N, K] memory to "
                           "point at; pass .packed to code that reads the x16 layout, or .unpacked() for W")

    def __repr__(self) -> str:
        held = "aliasing a plain tensor" if self.packed is None else f"held as x16 {tuple(self.packed.shape)}"
        return f"X16Weight({tuple(self.shape)}, {self.dtype}, {held})"

    def __deepcopy__(self, memo) -> torch.Tensor:
        if self.packed is None:
            return copy.deepcopy(self.plain, memo)
        result = X16Weight(self.packed.clone(), tuple(self.shape))
        if getattr(self, "_is_param", False):  # an nn.Parameter: stays one
            result._is_param = True
        memo[id(self)] = result
        return result

    def __reduce_ex__(self, protocol):
        if self.packed is None:
            return self.plain.__reduce_ex__(protocol)
        return _rebuild_x16_weight, (self.packed, tuple(self.shape), getattr(self, "_is_param", False))


def _rebuild_x16_weight(packed: torch.Tensor, shape: tuple[int, int], is_param: bool) -> X16Weight:
    weight = X16Weight(packed, shape)
    if is_param:
        weight._is_param = True
    return weight
