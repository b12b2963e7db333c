"""16-bit checkpoint weights held as stored under fp32 activations: the switch, and their undoing.

On the CPU an fp32 model keeps a checkpoint's bf16 / fp16 tensors as stored (layers/linear.py
HELD_16BIT_METHODS, layers/embedding.py keep_16bit): the kernels widen each weight exactly, the same sums at
half the bytes. PAGEDCORE_HOLD_16BIT=0 widens them at load instead. A reload of other values into a held
layer widens it back (widen_held_layer); a GPU's GEMMs and lookups take one dtype, so before a model moves
there its held weights become fp32 (widen_held_weights): without this each call would widen the whole weight.
"""

from __future__ import annotations

import os

import torch
from torch import nn


def source_dtype(loaded) -> torch.dtype | None:
    """The dtype a checkpoint tensor is stored in (a tensor's, a GGUF float tensor's), or None if not known."""
    return loaded.dtype if isinstance(loaded, torch.Tensor) else getattr(loaded, "source_dtype", None)


def hold_16bit_enabled() -> bool:
    """Whether an fp32 model holds its checkpoint's bf16 / fp16 tensors as stored (the default; the same values
    and, in the x16 layouts and fp16's row layout, the same sums). PAGEDCORE_HOLD_16BIT=0 widens them to fp32 at
    load instead (for A/B measurements)."""
    env = os.environ.get("PAGEDCORE_HOLD_16BIT", "1")
    if env not in ("0", "1"):
        raise ValueError(f"PAGEDCORE_HOLD_16BIT={env!r}; set 1 (hold 16-bit checkpoint tensors as stored) or 0")
    return env == "1"


def widen_held_layer(layer) -> None:
    """A Linear holding a checkpoint's bf16 / fp16 weight under fp32 activations (HELD_16BIT_METHODS) becomes the
    plain fp32 dense layer of the same values (a reload of other values; a move to a GPU, whose GEMMs take one
    dtype). No-op for any other layer."""
    from pagedcore.layers.linear import HELD_16BIT_METHODS, LINEAR_METHODS  # (it imports this module)
    from pagedcore.ops.dense_repack import X16Weight

    if layer.method not in HELD_16BIT_METHODS.values():
        return
    weight = layer.weight
    values = weight.unpacked() if isinstance(weight, X16Weight) else weight.data  # [out, in]
    LINEAR_METHODS["float32"].take(layer, values.float().contiguous())


def widen_held_weights(model: nn.Module) -> int:
    """Every held 16-bit linear weight and token table of `model` widened to fp32 in place; returns how many.
    The decoder stack (CPU only) is decided again."""
    from pagedcore.layers.embedding import VocabEmbedding
    from pagedcore.layers.linear import HELD_16BIT_METHODS, Linear

    count = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.method in HELD_16BIT_METHODS.values():
            widen_held_layer(module)
            count += 1
        elif isinstance(module, VocabEmbedding) and module.keep_16bit and module.weight.dtype != module.dtype:
            module.widen_held_table()
            count += 1
    inner = getattr(model, "model", None)
    if count and hasattr(inner, "refresh_decoder_stack"):
        inner.refresh_decoder_stack()
    return count
