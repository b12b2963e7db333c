"""A full checkpoint's tensors, as one rank's model loads them: only its stage's, cut to its slices.

    checkpoint (HF names)                       this rank gets
    model.layers.{g}.*  (g in its layer range)   model.layers.{g - first}.*   (local index)
    q_proj / k_proj / v_proj  weight, bias       rows of its query heads / KV heads     (column-parallel)
    gate_proj / up_proj       weight             rows of its intermediate range         (column-parallel)
    o_proj / down_proj        weight             columns of its heads / intermediate    (row-parallel)
    model.embed_tokens / lm_head                 rows of its vocabulary range           (vocab-parallel)
    norms, q_norm / k_norm, rope factors         whole                                  (replicated)

Cutting happens before the bytes are read where the source allows it: a tensor that offers
narrow(dim, start, length) (a safetensors slice, a GGUF tensor dequantised then cut) is asked for its
slice; a plain torch.Tensor is narrowed as a view. The model's own load_weights then checks shapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

import torch

from pagedcore.distributed.sharding import Range, ShardPlan
from pagedcore.layers.weights import CheckpointTensor

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Layer tensor (after "model.layers.N.") -> (dim cut, which ShardPlan range in rows of that dim).
LAYER_SLICES = {
    "self_attn.q_proj.weight": (0, "q_rows"), "self_attn.q_proj.bias": (0, "q_rows"),
    "self_attn.k_proj.weight": (0, "kv_rows"), "self_attn.k_proj.bias": (0, "kv_rows"),
    "self_attn.v_proj.weight": (0, "kv_rows"), "self_attn.v_proj.bias": (0, "kv_rows"),
    "self_attn.o_proj.weight": (1, "q_rows"),
    "mlp.gate_proj.weight": (0, "intermediate"), "mlp.up_proj.weight": (0, "intermediate"),
    "mlp.down_proj.weight": (1, "intermediate"),
}


def narrow_checkpoint(tensor: CheckpointTensor, dim: int, rows: Range, name: str) -> CheckpointTensor:
    """rows [start, end) of `tensor` along dim; the whole tensor when that is all of it."""
    start, end = rows
    if start == 0 and end == tensor.shape[dim]:
        return tensor
    if end > tensor.shape[dim]:
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; this rank needs rows "
                         f"[{start}, {end}) of dim {dim}: does the config match the checkpoint?")
    if isinstance(tensor, torch.Tensor):
        return tensor.narrow(dim, start, end - start)
    narrow = getattr(tensor, "narrow", None)
    if narrow is not None:
        return narrow(dim, start, end - start)
    full = torch.empty(tuple(tensor.shape), dtype=torch.float32)  # a lazy weight that cannot cut: decode all
    tensor.load_into(full)
    return full.narrow(dim, start, end - start)


def shard_checkpoint(plan: ShardPlan, weights: Iterable[tuple[str, CheckpointTensor]],
                     quantize_rows: Callable[[CheckpointTensor, str], CheckpointTensor] | None = None
                     ) -> Iterator[tuple[str, CheckpointTensor]]:
    """The (name, tensor) pairs of `weights` that this rank's model holds, renamed and cut (see top).
    quantize_rows: a dense checkpoint quantized per output row at load (--quantization int8_per_channel | fp8)
    quantizes a row-parallel tensor's whole rows before the cut (each row's scale from all its inputs, as in one
    process), so every rank holds the one-process layer's values there."""
    first, end = plan.layers
    for name, tensor in weights:
        match = _LAYER.fullmatch(name)
        if match is not None:
            index, rest = int(match.group(1)), match.group(2)
            if not first <= index < end:
                continue  # another stage's layer
            cut = LAYER_SLICES.get(rest)
            if cut is not None:
                dim, which = cut
                if dim == 1 and quantize_rows is not None:
                    tensor = quantize_rows(tensor, name)
                tensor = narrow_checkpoint(tensor, dim, getattr(plan, which), name)
            yield f"model.layers.{index - first}.{rest}", tensor
        elif name == "model.embed_tokens.weight":
            if plan.has_embedding:
                yield name, narrow_checkpoint(tensor, 0, plan.vocab, name)
        elif name == "lm_head.weight":
            if plan.is_last_stage and not plan.tie_word_embeddings:
                yield name, narrow_checkpoint(tensor, 0, plan.vocab, name)
        elif name == "model.norm.weight":
            if plan.is_last_stage:
                yield name, tensor
        else:
            yield name, tensor  # rope factors, ignored buffers; the model refuses a name it does not know
