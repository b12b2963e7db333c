"""16-bit checkpoint weights held as stored under fp32 activations, and their undoing for a GPU.

On the CPU an fp32 model keeps a checkpoint's bf16 / fp16 tensors as stored (layers/linear.py
HELD_16BIT_METHODS, layers/embedding.py keep_16bit): the kernels widen each weight exactly. A GPU's GEMMs and
lookups take one dtype, so before a model moves there its held weights become fp32 (the same values): without
this each call would widen the whole weight again.
"""

from __future__ import annotations

from torch import nn


def widen_held_weights(model: nn.Module) -> int:
    """Every held 16-bit linear weight and token table of `model` widened to fp32 in place; returns how many.
    The decoder stack (CPU only) is decided again."""
    from pagedcore.layers.embedding import VocabEmbedding
    from pagedcore.layers.linear import HELD_16BIT_METHODS, Linear, widen_held_layer

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
